"""The optimisation recipe (lr schedule, weight-decay groups), eval mode, seeded determinism, and SQuAD
answer choice across windows / under max_answer_length."""

from __future__ import annotations

import json
import re
import shutil
from pathlib import Path

import numpy as np
import pytest
import torch

from launch.finetune import squad
from launch.finetune.finetune_config import FinetuneConfig
from launch.finetune.examples import QAExample
from launch.finetune.runner import Finetuner, _param_groups, lr_factor

from repo_paths import DATA, GLUE


def test_lr_schedule_linear_warmup_then_linear_decay():
    warmup, steps = 10, 100
    f = [lr_factor(s, warmup, steps) for s in range(steps + 1)]
    assert f[0] == pytest.approx(0.1) and f[9] == pytest.approx(1.0)  # warm-up reaches the peak
    assert f[10] == pytest.approx(1.0) and f[55] == pytest.approx(0.5) and f[100] == 0.0
    assert all(a <= b for a, b in zip(f[:10], f[1:10])) and all(a >= b for a, b in zip(f[10:], f[11:]))
    assert lr_factor(0, 0, 50) == pytest.approx(1.0)  # no warm-up: start at the peak


def test_decay_over_the_whole_run_is_google_research_berts_schedule(tiny_checkpoint, tmp_path):
    # run_classifier.py: polynomial_decay over all steps under the warm-up, 0.9 x peak when a 10% warm-up ends.
    assert lr_factor(10, 10, 100, "run") == pytest.approx(0.9) and lr_factor(10, 10, 100) == 1.0
    from launch import cli

    lrs = {}
    for decay_over in ("after_warmup", "run"):  # 2 epochs of 2 steps, 1 of warm-up
        out = tmp_path / decay_over
        assert cli.main(["finetune", "--task", "sst2", "--data-dir", str(GLUE), "--checkpoint", str(tiny_checkpoint),
                         "--out", str(out), "--max-train-samples", "16", "--max-eval-samples", "8", "--batch-size", "8",
                         "--epochs", "2", "--warmup", "0.25", "--lr", "1e-3", "--max-seq-len", "32", "--no-progress",
                         "--no-save-model", "--no-tensorboard", "--decay-over", decay_over]) == 0
        lrs[decay_over] = json.loads((out / "log_history.json").read_text())[0]["lr"]  # after 2 of 4 steps
    assert lrs == pytest.approx({"after_warmup": 1e-3 * 2 / 3, "run": 1e-3 * 0.5})


def test_no_weight_decay_on_bias_and_layernorm():
    from model.config import BertConfig
    from model.heads import BertForSequenceClassification

    model = BertForSequenceClassification(BertConfig(vocab_size=64, hidden_size=16, num_hidden_layers=1,
                                                     num_attention_heads=2, intermediate_size=32), num_labels=3)
    decay, no_decay = _param_groups(model, 0.01)
    assert decay["weight_decay"] == 0.01 and no_decay["weight_decay"] == 0.0
    names = {id(p): n for n, p in model.named_parameters()}
    decayed = [names[id(p)] for p in decay["params"]]
    spared = [names[id(p)] for p in no_decay["params"]]
    assert len(decayed) + len(spared) == len(names)  # every parameter in exactly one group
    assert not [n for n in decayed if n.endswith("bias") or "layernorm" in n.lower().replace("_", "")]
    assert all(n.endswith("bias") or "norm" in n.lower() for n in spared)
    assert any("norm" in n.lower() and n.endswith("weight") for n in spared)
    assert any(n.endswith("classifier.weight") for n in decayed)


def test_a_feature_based_heads_scalar_mix_and_lstm_biases_do_not_decay():
    # They decayed: the layer weights and the mix's scale pulled toward zero, the LSTM's biases too
    from model.heads import FrozenFeatureHead

    head = FrozenFeatureHead(4, 8, 5, combine="weighted", per_token=True, lstm_hidden=6)
    decay, no_decay = _param_groups(head, 0.01)
    names = {id(p): n for n, p in head.named_parameters()}
    spared = sorted(names[id(p)] for p in no_decay["params"])
    assert {"mix.weights", "mix.gamma", "lstm.bias_ih_l0", "lstm.bias_hh_l0_reverse"} <= set(spared), spared
    assert all("weight_ih" in names[id(p)] or "weight_hh" in names[id(p)] or names[id(p)].endswith("classifier.weight")
               for p in decay["params"]), [names[id(p)] for p in decay["params"]]


def _cfg(ckpt: Path, out: Path, seed: int) -> FinetuneConfig:
    return FinetuneConfig(task="sst2", data_dir=str(GLUE), checkpoint=str(ckpt), out=str(out), seed=seed,
                          max_train_samples=32, max_eval_samples=32, epochs=1, batch_size=8, max_seq_len=32,
                          lr=1e-3, save_model=False, progress=False)


def test_evaluation_runs_in_eval_mode_without_dropout(tiny_checkpoint, tmp_path):
    ft = Finetuner(_cfg(tiny_checkpoint, tmp_path / "o", 1))
    ft.prepare()
    feats = ft.eval_feats[0]
    ft.model.train()  # as left by training: predict must switch dropout off itself
    first = np.stack(ft.predict(feats))
    ft.model.train()
    second = np.stack(ft.predict(feats))
    assert not ft.model.training
    np.testing.assert_array_equal(first, second)


def test_same_seed_same_run_other_seed_other_run(tiny_checkpoint, tmp_path):
    def run(seed: int, name: str):
        m = Finetuner(_cfg(tiny_checkpoint, tmp_path / name, seed)).run()
        preds = (tmp_path / name / "predictions" / "dev.tsv").read_text()
        return m, preds

    a, pa = run(3, "a")
    b, pb = run(3, "b")
    c, _ = run(4, "c")
    assert a["train_loss"] == b["train_loss"] and a["accuracy"] == b["accuracy"] and pa == pb
    assert c["train_loss"] != a["train_loss"]
    assert json.loads((tmp_path / "a" / "metrics.json").read_text())["train_loss"] == a["train_loss"]


def test_max_train_samples_takes_the_same_examples_for_every_seed(tiny_checkpoint, tmp_path):
    # A seed sweep on a --max-train-samples subset compares seeds on one data set, not on a different draw each.
    from dataclasses import replace

    trains = []
    for seed in (1, 2):
        ft = Finetuner(replace(_cfg(tiny_checkpoint, tmp_path / f"s{seed}", seed), max_train_samples=16))
        ft.prepare()
        trains.append(ft.data.train)
    assert len(trains[0]) == 16 and trains[0] == trains[1]


def test_init_random_keeps_architecture_and_vocab_but_not_the_weights(tiny_checkpoint, tmp_path):
    from dataclasses import replace

    from model.hf import load_pretrained
    from model.bert import BertForPreTraining

    pretrained, _ = load_pretrained(BertForPreTraining, tiny_checkpoint)
    word = pretrained.bert.embeddings.word.weight

    def model(init: str, seed: int):
        ft = Finetuner(replace(_cfg(tiny_checkpoint, tmp_path / f"{init}{seed}", seed), init=init))
        ft.prepare()
        return ft.model

    loaded, fresh, again, other = model("checkpoint", 1), model("random", 1), model("random", 1), model("random", 2)
    assert torch.equal(loaded.bert.embeddings.word.weight, word)
    assert fresh.bert.embeddings.word.weight.shape == word.shape and len(fresh.state_dict()) == len(loaded.state_dict())
    for name, tensor in fresh.state_dict().items():
        if name.startswith("bert.") and name.endswith("weight") and tensor.dim() == 2:  # every encoder matrix
            assert not torch.equal(tensor, loaded.state_dict()[name]), name  # redrawn, reproducibly per seed
            assert torch.equal(tensor, again.state_dict()[name]) and not torch.equal(tensor, other.state_dict()[name]), name
    # The head is the checkpoint run's own draw for that seed: the two runs differ in the encoder alone.
    assert torch.equal(fresh.classifier.weight, loaded.classifier.weight)
    assert not torch.equal(fresh.classifier.weight, other.classifier.weight)
    with pytest.raises(ValueError, match="--init random with --freeze"):
        replace(_cfg(tiny_checkpoint, tmp_path / "x", 1), init="random", freeze=True).validate()


def _one_example(tokenizer, n_words: int = 60):
    words = [f"w{i}" for i in range(n_words)]
    context = " ".join(words)
    ex = QAExample("q", "which word", context, ({"text": "w0", "answer_start": 0},))
    feats, _ = squad.build_features([ex], tokenizer, max_seq_len=40, doc_stride=16, max_query_length=8, training=False)
    return ex, feats


def test_squad_best_span_across_windows_and_max_answer_length(tokenizer):
    ex, feats = _one_example(tokenizer)
    assert len(feats) >= 2

    def logits(spans):
        """spans: (feature index, start pos, end pos, score) peaks; everything else 0."""
        s = [np.zeros(len(f.input_ids)) for f in feats]
        e = [np.zeros(len(f.input_ids)) for f in feats]
        for fi, sp, ep, score in spans:
            s[fi][sp] = e[fi][ep] = score
        return s, e

    def owned(fi):  # context positions whose max-context window is fi
        return [p for p, (o, m) in enumerate(zip(feats[fi].offsets, feats[fi].max_context)) if o is not None and m]

    p0, p1 = owned(0)[1], owned(1)[1]
    text = lambda fi, sp, ep: ex.context[feats[fi].offsets[sp][0]: feats[fi].offsets[ep][1]]  # noqa: E731
    # the higher-scoring span wins, whichever window it is in
    best, _ = squad.postprocess([ex], feats, *logits([(0, p0, p0 + 1, 5.0), (1, p1, p1 + 1, 8.0)]), n_best=5)
    assert best["q"] == text(1, p1, p1 + 1)
    best, _ = squad.postprocess([ex], feats, *logits([(0, p0, p0 + 1, 9.0), (1, p1, p1 + 1, 8.0)]), n_best=5)
    assert best["q"] == text(0, p0, p0 + 1)
    # a start in a window that is not its max-context window is not used from that window
    not_owned = [p for p, (o, m) in enumerate(zip(feats[0].offsets, feats[0].max_context)) if o is not None and not m]
    assert not_owned
    q = not_owned[0]
    _, nbest = squad.postprocess([ex], feats, *logits([(0, q, q, 50.0)]), n_best=20)
    assert all(entry["start_logit"] < 50.0 for entry in nbest["q"])
    # a span longer than max_answer_length is never chosen, even with the highest logits
    best, nbest = squad.postprocess([ex], feats, *logits([(0, p0, p0 + 5, 20.0)]), n_best=20, max_answer_length=3)
    assert best["q"] != text(0, p0, p0 + 5)
    assert all(len(tokenizer.encode(e["text"], add_special_tokens=False).ids) <= 3 for e in nbest["q"])
    best, _ = squad.postprocess([ex], feats, *logits([(0, p0, p0 + 5, 20.0)]), n_best=20, max_answer_length=6)
    assert best["q"] == text(0, p0, p0 + 5)


def test_task_heads_start_as_transformers_draws_them():
    """The cause of bertpipe's lower NER F1 against transformers (issue 16): task heads drawn from the
    encoder's truncated normal (cut at 2 std) instead of transformers' plain normal(0, 0.02)."""
    from model.config import BertConfig
    from model.heads import (BertForMultipleChoice, BertForQuestionAnswering, BertForSequenceClassification,
                             BertForTokenClassification)

    cfg = BertConfig(vocab_size=64, hidden_size=768, num_hidden_layers=1, num_attention_heads=12, intermediate_size=32)
    torch.manual_seed(0)
    heads = [BertForTokenClassification(cfg, 9).classifier, BertForSequenceClassification(cfg, 3).classifier,
             BertForQuestionAnswering(cfg).qa_outputs, BertForMultipleChoice(cfg).classifier]
    weights = torch.cat([h.weight.flatten() for h in heads])  # 11,520 draws
    assert abs(weights.std().item() / 0.02 - 1) < 0.03  # plain normal; the truncated one has std 0.0176
    assert (weights.abs() > 2 * 0.02).float().mean().item() > 0.03  # its tails (4.6%); truncation has none
    assert all(torch.equal(h.bias, torch.zeros_like(h.bias)) for h in heads)


@pytest.mark.parametrize("task,data_dir", [("conll2003", "data"), ("sst2", "data/glue")])
def test_unpad_runs_the_same_model_on_fewer_tokens(tiny_checkpoint, tmp_path, task, data_dir):
    """`unpad` (the default) skips padding inside the encoder: the task model's outputs are those of
    the padded run, for token tasks (per-position logits) and pooled ones ([CLS] gathered back)."""
    from repo_paths import REPO

    outputs = {}
    for unpad in (True, False):
        cfg = _cfg(tiny_checkpoint, tmp_path / str(unpad), 0)
        cfg.task, cfg.data_dir, cfg.unpad, cfg.eval_batch_size = task, str(REPO / data_dir), unpad, 16
        ft = Finetuner(cfg)
        ft.prepare()
        assert ft.model.bert.config.unpad is unpad
        lengths = {len(f.input_ids) for f in ft.eval_feats[0]}
        assert len(lengths) > 1  # the batches pad, so the two layouts differ
        # token tasks: the real positions (padding predicts from zeros with unpad, unused either way)
        outputs[unpad] = [row[: len(f.input_ids)] if task == "conll2003" else row
                          for f, row in zip(ft.eval_feats[0], ft.predict(ft.eval_feats[0]))]
    for a, b in zip(outputs[True], outputs[False]):
        np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("task", ["squad", "conll2003", "sst2"])
def test_unpad_trains_on_the_same_loss(tiny_checkpoint, tmp_path, task):
    """The training loss and its gradients are the padded layout's under `unpad` too: SQuAD's softmax
    over positions used to count padding, whose logits the two layouts compute differently."""
    import shutil

    from repo_paths import REPO

    data = {"squad": tmp_path / "squad", "conll2003": REPO / "data" / "conll2003", "sst2": GLUE}[task]
    if task == "squad":
        data.mkdir()
        for name in ("train-v1.1.json", "dev-v1.1.json"):
            shutil.copy(REPO / "data" / "squad" / "dev-v1.1-subset.json", data / name)
    results = []
    for unpad in (True, False):
        cfg = _cfg(tiny_checkpoint, tmp_path / str(unpad), 0)
        cfg.task, cfg.data_dir, cfg.unpad, cfg.max_seq_len = task, str(data), unpad, 128
        ft = Finetuner(cfg)
        ft.prepare()
        ft.model.eval()  # no dropout: the two layouts draw their masks over different shapes
        batch = ft.task.collate(sorted(ft.train_feats, key=lambda f: len(f.input_ids))[::4][:8])
        assert len(set(batch["attention_mask"].sum(1).tolist())) > 1  # the batch pads
        loss = ft.batch_loss(batch)
        loss.backward()
        results.append((loss.item(), torch.cat([p.grad.flatten() for p in ft.model.parameters() if p.grad is not None])))
    (loss_u, grad_u), (loss_p, grad_p) = results
    assert loss_u == pytest.approx(loss_p, rel=1e-5)
    torch.testing.assert_close(grad_u, grad_p, rtol=1e-4, atol=1e-6)


@pytest.mark.parametrize("task,data_dir,feature_based", [("sst2", "data/glue", False), ("conll2003", "data", False),
                                                        ("conll2003", "data", True)])
def test_micro_batches_accumulate_the_whole_batch_gradient(tiny_checkpoint, tmp_path, task, data_dir, feature_based):
    """--micro-batch-size runs a batch in slices and gets its gradient and loss: slices weigh by
    their share of the loss terms (labelled tokens for NER, where slices hold unequal counts)."""
    from repo_paths import REPO

    from launch.finetune.runner import finetuner_for

    results = {}
    for micro in (None, 3):
        cfg = _cfg(tiny_checkpoint, tmp_path / str(micro), 0)
        cfg.task, cfg.data_dir, cfg.micro_batch_size = task, str(REPO / data_dir), micro
        cfg.feature_based, cfg.lstm_hidden, cfg.feature_cache = feature_based, 8, str(tmp_path / "cache")
        ft = finetuner_for(cfg)
        ft.prepare()
        ft.model.eval()  # no dropout: the slices would draw other masks
        batch = next(iter(ft.train_batches(torch.Generator().manual_seed(0))))
        assert len(batch["input_ids"]) == 8
        value = ft._backward(batch, 0, 0)
        results[micro] = (value, torch.cat([p.grad.flatten() for p in ft.model.parameters() if p.grad is not None]))
    if task == "conll2003":
        terms = (batch["labels"] != -100).sum(1)
        assert len({int(terms[i : i + 3].sum()) for i in (0, 3, 6)}) > 1  # the slices hold unequal token counts
    assert results[3][0] == pytest.approx(results[None][0], rel=1e-5)
    torch.testing.assert_close(results[3][1], results[None][1], rtol=1e-4, atol=1e-7)


def test_a_diverged_run_stops_naming_the_step_and_what_to_change(tiny_checkpoint, tmp_path):
    # A ValueError, which the CLI prints in one line and a sweep records as a failed trial.
    cfg = _cfg(tiny_checkpoint, tmp_path / "o", 0)
    cfg.lr, cfg.warmup = 1e30, 0.0
    with pytest.raises(ValueError, match=r"the loss became (nan|inf) at epoch 1, step [2-4]: training diverged; lower"):
        Finetuner(cfg).run()


def test_micro_batch_size_below_one_is_refused():
    with pytest.raises(ValueError, match="--micro-batch-size must be >= 1"):
        FinetuneConfig(task="sst2", data_dir="d", checkpoint="c", out="o", micro_batch_size=0).validate()


def _sst2_copy(tmp_path: Path, dev_rows: int, test_lines: list[str] | None = None) -> Path:
    src = (GLUE / "SST-2" / "train.tsv").read_text(encoding="utf-8").splitlines(True)
    d = tmp_path / "SST-2"
    d.mkdir(parents=True)
    (d / "train.tsv").write_text("".join(src[:41]), encoding="utf-8")
    (d / "dev.tsv").write_text("".join(src[:1] + src[41 : 41 + dev_rows]), encoding="utf-8")
    if test_lines is not None:
        (d / "test.tsv").write_text("index\tsentence\n" + "".join(f"{line}\n" for line in test_lines), encoding="utf-8")
    return tmp_path


def test_empty_dev_split_is_refused_before_training(tiny_checkpoint, tmp_path):
    from dataclasses import replace

    from launch.finetune.examples import DataError

    cfg = replace(_cfg(tiny_checkpoint, tmp_path / "o", 1), data_dir=str(_sst2_copy(tmp_path, 0)))
    with pytest.raises(DataError, match=r"sst2: the dev split in .* holds no examples"):
        Finetuner(cfg).prepare()


def test_regression_scores_that_do_not_vary_are_refused_after_subsetting(tiny_checkpoint, tmp_path):
    # One score throughout: nothing to learn in train; in dev every run's Pearson and Spearman read 0.0.
    # Checked after --max-*-samples took its subset, so a one-example STS-B dev is caught too.
    from dataclasses import replace

    from launch.finetune.examples import DataError

    user = tmp_path / "user"
    user.mkdir()
    (user / "train.tsv").write_text("text\tscore\nfine\t1.5\ngood\t3\n")
    (user / "dev.tsv").write_text("text\tscore\nok\t2\nmeh\t2.0\n")
    cfg = replace(_cfg(tiny_checkpoint, tmp_path / "o", 1), task="regress", data_dir=str(user), label_column="score",
                  max_train_samples=None, max_eval_samples=None)
    with pytest.raises(DataError, match=r"regress: all 2 example\(s\) of the dev split in .*user score 2; "
                                        r"regression needs scores that vary: fix the data"):
        Finetuner(cfg).prepare()
    (user / "train.tsv").write_text("text\tscore\nfine\t1.5\n")
    with pytest.raises(DataError, match=r"all 1 example\(s\) of the training split .* score 1.5"):
        Finetuner(cfg).prepare()
    cfg = replace(_cfg(tiny_checkpoint, tmp_path / "o2", 1), task="stsb", max_eval_samples=1)
    with pytest.raises(DataError, match=r"stsb: all 1 example\(s\) of the dev split in .* \(the 1 "
                                        r"--max-eval-samples kept\) score .*: raise --max-eval-samples"):
        Finetuner(cfg).prepare()
    Finetuner(replace(cfg, max_eval_samples=8)).prepare()


def test_a_rerun_into_the_same_out_replaces_the_earlier_runs_files(tiny_checkpoint, tmp_path):
    # Left there, the earlier run's model/, confusion matrix and TensorBoard events sat beside the new run's
    # (the CLI printed the old confusion matrix as this run's), and its metrics.json outlived an interrupt.
    from dataclasses import replace

    from launch.finetune.examples import DataError

    out = tmp_path / "o"
    Finetuner(replace(_cfg(tiny_checkpoint, out, 1), save_model=True, tensorboard=True)).run()
    assert (out / "model").is_dir() and (out / "confusion_matrix.txt").is_file()
    events = sorted((out / "tensorboard").rglob("events.*"))
    (out / "notes.txt").write_text("mine")  # not a name finetune writes: kept
    with pytest.raises(DataError, match=r"--checkpoint .* is the earlier run's .*model, which this run replaces"):
        Finetuner(replace(_cfg(out / "model", out, 2), save_model=False)).run()
    assert (out / "model").is_dir()  # refused before anything was removed
    Finetuner(replace(_cfg(tiny_checkpoint, out, 2), task="conll2003", data_dir=str(DATA / "conll2003"),
                      tensorboard=True)).run()
    assert not (out / "model").exists() and not (out / "confusion_matrix.txt").exists()
    assert (out / "dev_entity_report.txt").is_file() and (out / "notes.txt").read_text() == "mine"
    assert not set(events) & set((out / "tensorboard").rglob("events.*"))  # one run's curves, not two overlaid


def test_a_rerun_keeps_the_users_files_inside_the_output_folders_and_clears_a_run_cut_short(
        tiny_checkpoint, tmp_path, monkeypatch, caplog):
    # A rerun removed model/, predictions/ and tensorboard/ whole, with notes the user had put in them.
    from dataclasses import replace

    out = tmp_path / "o"
    cfg = replace(_cfg(tiny_checkpoint, out, 1), save_model=True, tensorboard=True)
    Finetuner(cfg).run()
    mine = {out / "model" / "notes.txt": "mine", out / "predictions" / "mine.tsv": "x\n",
            out / "tensorboard" / "my" / "run.txt": "m"}
    for path, text in mine.items():
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    first_events = set((out / "tensorboard").rglob("events.*"))
    with caplog.at_level("WARNING"):
        Finetuner(cfg).run()
    assert all(path.read_text() == text for path, text in mine.items())
    assert "also holds 3 file(s) bertpipe did not write, left as they are" in caplog.text
    assert not first_events & set((out / "tensorboard").rglob("events.*"))
    assert (out / "model" / "model.safetensors").is_file() and (out / "metrics.json").is_file()

    # A rerun cut short (here after its model): it never said what it wrote, so the next run clears all but
    # what it had kept, and the unfinished run leaves no metrics.json behind.
    monkeypatch.setattr(Finetuner, "save", lambda self: (_ for _ in ()).throw(KeyboardInterrupt))
    with pytest.raises(KeyboardInterrupt):
        Finetuner(cfg).run()
    assert not (out / "metrics.json").exists()
    partial = set((out / "tensorboard").rglob("events.*"))
    monkeypatch.undo()
    Finetuner(cfg).run()
    assert not partial & set((out / "tensorboard").rglob("events.*"))
    assert all(path.read_text() == text for path, text in mine.items())


def test_a_users_file_where_the_rerun_writes_is_refused_not_written_over(tiny_checkpoint, tmp_path):
    # Added after a run that wrote no model and had no test file, kept "as they are" by the rerun's warning,
    # then written over by the rerun's model and test predictions.
    from dataclasses import replace

    from launch.finetune.examples import DataError
    from launch.finetune.out_files import files_under
    from launch.finetune.runner import OUT_FILES

    out, data = tmp_path / "o", _sst2_copy(tmp_path / "d", 10)
    cfg = replace(_cfg(tiny_checkpoint, out, 1), data_dir=str(data), save_model=False)
    Finetuner(cfg).run()
    (out / "model").mkdir()
    (out / "model" / "config.json").write_text("mine\n")
    (out / "predictions" / "SST-2.tsv").write_text("mine\n")
    (out / "predictions" / "test.tsv").write_text("mine\n")
    (data / "SST-2" / "test.tsv").write_text("index\tsentence\n0\ta film .\n", encoding="utf-8")
    with pytest.raises(DataError, match=re.escape(f"--out {out} holds model/config.json, predictions/test.tsv, which "
                                                  "bertpipe did not write (or which changed since it did), where this "
                                                  "run writes its own: move it out of --out")):
        Finetuner(replace(cfg, save_model=True)).run()
    assert (out / "metrics.json").is_file()  # refused before anything was deleted
    for rel in ("model/config.json", "predictions/SST-2.tsv", "predictions/test.tsv"):
        assert (out / rel).read_text() == "mine\n"
        (out / rel).unlink()
    # What a run writes is within what it says it may write (the list a refusal is checked against).
    run = Finetuner(replace(cfg, save_model=True, tensorboard=True))
    run.run()
    written = {rel for rel in files_under(out, OUT_FILES) if not rel.startswith("tensorboard/")}
    assert written <= run._may_write() and {"model/model.safetensors", "submission/SST-2.tsv"} <= written
    ner = Finetuner(replace(cfg, task="conll2003", data_dir=str(DATA / "conll2003"), out=str(tmp_path / "ner")))
    ner.run()
    written = {rel for rel in files_under(tmp_path / "ner", OUT_FILES) if not rel.startswith("tensorboard/")}
    assert written <= ner._may_write() and "predictions/dev.txt" in written
    # A file of the finished run's, edited since (the user's notes in its predictions): no longer its to replace.
    (tmp_path / "ner" / "predictions" / "dev.txt").write_text("my corrections\n")
    with pytest.raises(DataError, match=r"holds predictions/dev.txt, which bertpipe did not write \(or which changed"):
        ner.run()
    assert (tmp_path / "ner" / "predictions" / "dev.txt").read_text() == "my corrections\n"

    # A link where the run writes into a folder (OUT/model -> the user's own model folder): it was kept "as it
    # is", and the run then wrote its model through it, over the user's config.json and vocab.txt.
    theirs = tmp_path / "their_model"
    theirs.mkdir()
    (theirs / "config.json").write_text("mine\n")
    for name in ("model", "tensorboard"):
        shutil.rmtree(out / name, ignore_errors=True)
        (out / name).symlink_to(theirs)
        with pytest.raises(DataError, match=rf"holds {name}, which bertpipe did not write"):
            Finetuner(replace(cfg, save_model=True, tensorboard=True)).run()
        assert sorted(p.name for p in theirs.iterdir()) == ["config.json"] and (out / name).is_symlink()
        (out / name).unlink()


def test_test_file_is_predicted_whole_and_a_malformed_test_line_refused(tiny_checkpoint, tmp_path):
    from dataclasses import replace

    from launch.finetune.examples import DataError

    lines = [f"{i}\ta film numbered {i} ." for i in range(50)]
    cfg = replace(_cfg(tiny_checkpoint, tmp_path / "o", 1), data_dir=str(_sst2_copy(tmp_path / "ok", 10, lines)),
                  max_eval_samples=4)
    Finetuner(cfg).run()
    submission = (tmp_path / "o" / "submission" / "SST-2.tsv").read_text().splitlines()
    assert len(submission) == 51  # --max-eval-samples cut the dev split, never the test file
    assert json.loads((tmp_path / "o" / "metrics.json").read_text())["eval_examples"] == 4
    lines[7] = "7"
    cfg = replace(cfg, data_dir=str(_sst2_copy(tmp_path / "bad", 10, lines)), skip_malformed=True,
                  out=str(tmp_path / "o2"))
    with pytest.raises(DataError, match=r"test.tsv: 1 malformed line\(s\), e.g. test.tsv:9 .*every test line"):
        Finetuner(cfg).prepare()
