"""`bertpipe finetune` end to end (in-process CLI) on every task family, with a tiny real-vocab checkpoint.

The tiny model is random, so these check plumbing and every output file's format, not accuracy
(test_sst2_minilm.py checks accuracy with real pretrained weights).
"""

from __future__ import annotations

import csv
import json
import shutil
from pathlib import Path

import pytest
import torch

from launch import cli

from repo_paths import DATA, FIXTURES as _FIXTURES, GLUE
FIXTURES = _FIXTURES / "downstream"
QUICK = ["--max-train-samples", "48", "--max-eval-samples", "48", "--epochs", "1", "--batch-size", "16",
         "--max-seq-len", "64", "--lr", "1e-3", "--no-progress"]


def finetune(task: str, data_dir: Path, ckpt: Path, out: Path, *extra: str) -> dict:
    argv = ["finetune", "--task", task, "--data-dir", str(data_dir), "--checkpoint", str(ckpt), "--out", str(out), *QUICK, *extra]
    assert cli.main(argv) == 0
    return json.loads((out / "metrics.json").read_text())


def test_sst2_outputs_and_saved_model_round_trip(tiny_checkpoint, tmp_path, capsys):
    out = tmp_path / "sst2"
    m = finetune("sst2", GLUE, tiny_checkpoint, out)
    assert m["task"] == "sst2" and m["metric"] == "accuracy" and m["score"] == m["accuracy"]
    assert {"f1", "matthews_correlation", "eval_examples", "train_seconds"} <= set(m)
    assert m["eval_examples"] == 48 and m["train_examples"] == 48
    printed = capsys.readouterr().out
    assert "sst2: accuracy =" in printed and "true \\ predicted" in printed
    rows = (out / "predictions" / "dev.tsv").read_text().splitlines()
    assert rows[0] == "guid\tprediction\tlabel" and len(rows) == 49
    assert (out / "confusion_matrix.png").stat().st_size > 1000
    assert (out / "config.yaml").is_file()
    # The saved HF model reloads and reproduces the written dev predictions.
    from launch.finetune.checkpoint import load_tokenizer, open_checkpoint
    from launch.finetune.encoding import collate, text_features
    from launch.finetune.glue import GLUE_TASKS, read_split
    from model.heads import BertForSequenceClassification
    from model.hf import load_pretrained

    config = json.loads((out / "model" / "config.json").read_text())
    assert config["id2label"] == {"0": "0", "1": "1"} and config["finetuning_task"] == "sst2"
    model, report = load_pretrained(BertForSequenceClassification, out / "model", num_labels=2)
    assert not report.missing_keys
    model.eval()
    dev = {ex.guid: ex for ex in read_split(GLUE_TASKS["sst2"], GLUE, "dev")}
    written = [r.split("\t") for r in rows[1:9]]
    tok = load_tokenizer(open_checkpoint(out / "model"))
    feats = text_features([dev[g] for g, _, _ in written], tok, max_seq_len=64, label_ids={"0": 0, "1": 1})
    batch = collate(feats)
    with torch.no_grad():
        logits = model(batch["input_ids"], batch["token_type_ids"], batch["attention_mask"])
    assert [str(int(i)) for i in logits.argmax(-1)] == [p for _, p, _ in written]


def test_mnli_matched_mismatched_and_glue_submission(tiny_checkpoint, tmp_path):
    out = tmp_path / "mnli"
    m = finetune("mnli", FIXTURES, tiny_checkpoint, out)
    assert {"accuracy", "mismatched_accuracy"} <= set(m) and m["eval_examples"] == 4
    sub = (out / "submission" / "MNLI-mm.tsv").read_text().splitlines()
    assert sub[0] == "index\tprediction" and len(sub) == 4
    assert all(line.split("\t")[1] in ("contradiction", "entailment", "neutral") for line in sub[1:])
    assert (out / "submission" / "MNLI-m.tsv").is_file()
    ax = (out / "submission" / "AX.tsv").read_text().splitlines()  # the server scores it with MNLI's model
    assert ax[0] == "index\tprediction" and [line.split("\t")[0] for line in ax[1:]] == ["0", "1", "2"]


@pytest.mark.parametrize("task, submission, keys", [("qnli", "QNLI.tsv", {"accuracy"}), ("qqp", "QQP.tsv", {"f1", "accuracy"})])
def test_qnli_qqp_fixtures(tiny_checkpoint, tmp_path, task, submission, keys):
    m = finetune(task, FIXTURES, tiny_checkpoint, tmp_path / task, "--no-save-model")
    assert keys <= set(m)
    lines = (tmp_path / task / "submission" / submission).read_text().splitlines()
    assert lines[0] == "index\tprediction" and len(lines) > 1
    assert not (tmp_path / task / "model").exists()


def test_stsb_regression(tiny_checkpoint, tmp_path):
    m = finetune("stsb", GLUE, tiny_checkpoint, tmp_path / "stsb", "--no-save-model")
    assert m["metric"] == "spearmanr" and {"pearson", "spearmanr", "mse"} <= set(m)
    preds = (tmp_path / "stsb" / "predictions" / "dev.tsv").read_text().splitlines()[1:]
    float(preds[0].split("\t")[1])


def test_classify_multiclass_csv_from_real_cola_sources(tiny_checkpoint, tmp_path):
    rows = [line.rstrip("\n").split("\t") for line in open(GLUE / "CoLA" / "train.tsv", encoding="utf-8")]
    data = tmp_path / "data"
    data.mkdir()
    by_source = {src: [r for r in rows if r[0] == src] for src in ("ks08", "l-93", "r-67")}
    for name, lo, hi in (("train", 0, 40), ("dev", 40, 56), ("test", 56, 60)):
        with open(data / f"{name}.csv", "w", newline="") as f:
            w = csv.writer(f)
            w.writerow(["sentence", "source"] if name != "test" else ["sentence"])
            w.writerows(([r[3], r[0]] if name != "test" else [r[3]]) for v in by_source.values() for r in v[lo:hi])
    out = tmp_path / "out"
    m = finetune("classify", data, tiny_checkpoint, out, "--text-column", "sentence", "--label-column", "source")
    assert {"accuracy", "macro_f1", "micro_f1"} <= set(m) and "f1" not in m
    table = (out / "confusion_matrix.txt").read_text().splitlines()
    assert table[1].split() == ["|", "ks08", "l-93", "r-67"] and len(table) == 6
    assert sum(int(v) for line in table[3:] for v in line.split("|")[1].split()) == 48
    assert len((out / "predictions" / "test.tsv").read_text().splitlines()) == 13
    assert json.loads((out / "model" / "config.json").read_text())["id2label"]["2"] == "r-67"


def test_conll2003_with_document_context(tiny_checkpoint, tmp_path):
    out = tmp_path / "ner"
    m = finetune("conll2003", DATA / "conll2003", tiny_checkpoint, out, "--doc-context", "--no-save-model")
    assert m["metric"] == "f1" and {"precision", "recall", "accuracy"} <= set(m)
    pred = (out / "predictions" / "dev.txt").read_text().split("\n\n")
    words = [line.split() for line in pred[0].splitlines()]
    assert all(len(w) == 3 for w in words)  # word gold predicted, CoNLL evaluation layout
    assert (out / "dev_entity_report.txt").is_file()


def test_tag_jsonl(tiny_checkpoint, tmp_path):
    data = tmp_path / "data"
    data.mkdir()
    rows = [{"tokens": ["Ada", "Lovelace", "wrote", "notes"], "tags": ["B-PER", "I-PER", "O", "O"]},
            {"tokens": ["Paris", "is", "big"], "tags": ["B-LOC", "O", "O"]}] * 8
    for name in ("train", "dev"):
        (data / f"{name}.jsonl").write_text("\n".join(json.dumps(r) for r in rows) + "\n")
    m = finetune("tag", data, tiny_checkpoint, tmp_path / "out", "--text-column", "tokens", "--label-column", "tags",
                 "--no-save-model")
    assert "f1" in m and m["eval_examples"] == 16


def test_squad(tiny_checkpoint, tmp_path):
    data = tmp_path / "squad"
    data.mkdir()
    shutil.copy(DATA / "squad" / "dev-v1.1-subset.json", data / "train-v1.1.json")
    shutil.copy(DATA / "squad" / "dev-v1.1-subset.json", data / "dev-v1.1.json")
    out = tmp_path / "out"
    m = finetune("squad", data, tiny_checkpoint, out, "--max-seq-len", "128", "--doc-stride", "64", "--no-save-model")
    assert m["metric"] == "f1" and {"exact_match", "f1"} <= set(m) and m["eval_examples"] == 48
    best = json.loads((out / "predictions" / "predictions.json").read_text())
    nbest = json.loads((out / "predictions" / "nbest_predictions.json").read_text())
    assert len(best) == 48 and set(best) == set(nbest)
    assert all(abs(sum(e["probability"] for e in v) - 1) < 1e-6 for v in nbest.values())


def _squad_dir(tmp_path, edit_train) -> Path:
    data = tmp_path / "squad"
    data.mkdir()
    doc = json.loads((DATA / "squad" / "dev-v1.1-subset.json").read_text(encoding="utf-8"))
    doc["data"] = [{**doc["data"][0], "paragraphs": doc["data"][0]["paragraphs"][:2]}]
    (data / "dev-v1.1.json").write_text(json.dumps(doc))
    for paragraph in doc["data"][0]["paragraphs"]:
        for qa in paragraph["qas"]:
            edit_train(qa)
    (data / "train-v1.1.json").write_text(json.dumps(doc))
    return data


def test_squad_where_no_answer_is_at_its_offset_stops_instead_of_training_nothing(tiny_checkpoint, tmp_path, capsys):
    def byte_offsets(qa):  # what offsets counted in UTF-8 bytes, or from 1, look like: the text is elsewhere
        qa["answers"] = [{**a, "answer_start": a["answer_start"] + 1} for a in qa["answers"]]

    data = _squad_dir(tmp_path, byte_offsets)
    with pytest.raises(SystemExit) as exc:  # it trained 0 steps and exited 0
        finetune("squad", data, tiny_checkpoint, tmp_path / "out", "--max-seq-len", "64", "--no-save-model")
    err = capsys.readouterr().err
    assert exc.value.code == 2 and "squad: none of the " in err and " training examples in " in err
    assert "not at its answer_start (a character offset into the context), e.g. 56ddde6b9a695914005b9628, " in err


def test_squad_counts_as_trained_only_the_questions_it_could_use(tiny_checkpoint, tmp_path, capsys):
    # metrics.json said train_examples 5 where 4 of the 5 were skipped (answer not at its offset) and 1 trained.
    moved = []

    def some_off(qa):
        if len(moved) < 4:
            moved.append(qa["id"])
            qa["answers"] = [{**a, "answer_start": a["answer_start"] + 3} for a in qa["answers"]]

    data = _squad_dir(tmp_path, some_off)
    total = sum(len(p["qas"]) for p in json.loads((data / "train-v1.1.json").read_text())["data"][0]["paragraphs"])
    m = finetune("squad", data, tiny_checkpoint, tmp_path / "out", "--max-seq-len", "64", "--no-save-model")
    assert m["train_examples"] == total - 4 and m["train_examples_unused"] == 4, (m, total)
    assert f"squad: {total - 4} train examples (" in capsys.readouterr().err


def test_squad_question_ids_are_unique(tiny_checkpoint, tmp_path, capsys):
    def same_id(qa):
        qa["id"] = "one-id-for-all"

    data = _squad_dir(tmp_path, same_id)
    with pytest.raises(SystemExit):  # dev predictions are keyed by id: one question's answer was scored twice
        finetune("squad", data, tiny_checkpoint, tmp_path / "out", "--max-seq-len", "64", "--no-save-model")
    assert "question id 'one-id-for-all' is used more than once" in capsys.readouterr().err


def test_swag(tiny_checkpoint, tmp_path):
    out = tmp_path / "swag"
    m = finetune("swag", FIXTURES / "SWAG", tiny_checkpoint, out, "--no-save-model")
    assert m["metric"] == "accuracy" and m["eval_examples"] == 3
    assert len((out / "predictions" / "test.tsv").read_text().splitlines()) == 4


def test_freeze_trains_only_the_head(tiny_checkpoint, tmp_path):
    finetune("sst2", GLUE, tiny_checkpoint, tmp_path / "frozen", "--freeze")
    from model.hf import read_hf_state

    before, _ = read_hf_state(tiny_checkpoint)
    after, _ = read_hf_state(tmp_path / "frozen" / "model")
    encoder = sorted(k for k in after if k.startswith("bert."))
    assert encoder and set(encoder) <= set(before)  # every tensor of the encoder (embeddings and pooler too)
    assert [k for k in encoder if not torch.equal(before[k], after[k])] == []
    # The head did train: its bias starts at zero (model/heads.py) and moved.
    assert after["classifier.bias"].abs().max() > 0


# ---- bad input: exit code 2 and a message that says what to change, before any training -----------------


def _error(argv: list[str], capsys) -> str:
    with pytest.raises(SystemExit) as exc:
        cli.main(argv)
    assert exc.value.code == 2
    return capsys.readouterr().err


@pytest.mark.parametrize("flags, said", [
    (["--text-column", "review"], "--text-column applies to classify, regress and tag only"),
    (["--doc-stride", "64"], "--doc-stride applies to squad only"),
    (["--lstm-hidden", "64"], "--lstm-hidden applies to --feature-based only"),
    (["--feature-lr", "1e-4"], "--feature-lr applies to --feature-based only"),
    (["--layers", "last"], "--layers applies to --feature-based only"),  # its default: refused only when changed
    (["--set", "n_best=5"], "--n-best applies to squad only"),  # --set got past the check, and did nothing
])
def test_a_flag_this_run_does_not_read_is_refused_not_ignored(tmp_path, capsys, flags, said):
    # Each ran to the end without a word, as if the flag had been used (--doc-context and --layers said so).
    err = _error(["finetune", "--task", "sst2", "--data-dir", str(GLUE), "--checkpoint", str(tmp_path), "--out",
                  str(tmp_path / "o"), *flags], capsys)
    assert said in err and "this run (sst2, fine-tuning) does not read it: drop it" in err
    assert not (tmp_path / "o").exists()


def test_a_setting_in_the_config_file_this_run_does_not_read_is_named_in_a_warning(tmp_path, capsys):
    # A --config file may be shared by runs of several tasks: said, not refused (it was ignored without a word).
    config = tmp_path / "shared.yaml"
    config.write_text("text_column: review\ndoc_stride: 64\nlr: 1.0e-4\n")
    err = _error(["finetune", "--task", "sst2", "--data-dir", str(GLUE), "--checkpoint", str(tmp_path), "--out",
                  str(tmp_path / "o"), "--config", str(config)], capsys)
    for key, who in (("text_column", "classify, regress and tag"), ("doc_stride", "squad")):
        assert f"--config {config}: {key} applies to {who} only; this run (sst2, fine-tuning) does not read it" in err
    assert "holds no BERT" in err.strip().splitlines()[-1]  # the run went on to its next check
    # A run's own saved config.yaml holds every key, at its default where not set: nothing to say there.
    from launch.config import save_config
    from launch.finetune.finetune_config import FinetuneConfig

    save_config(FinetuneConfig(task="sst2", data_dir=str(GLUE), checkpoint=str(tmp_path), out=str(tmp_path / "o")),
                config)
    err = _error(["finetune", "--config", str(config)], capsys)
    assert "does not read it" not in err and "holds no BERT" in err.strip().splitlines()[-1], err


def test_refuses_a_directory_without_bert(tmp_path, capsys):
    (tmp_path / "notes.txt").write_text("hello")
    err = _error(["finetune", "--task", "sst2", "--data-dir", str(GLUE), "--checkpoint", str(tmp_path), "--out",
                  str(tmp_path / "o")], capsys)
    assert "holds no BERT" in err and "Traceback" not in err
    assert not (tmp_path / "o").exists()  # refused before anything is written: no folder, no config.yaml


def test_refuses_a_vocab_that_does_not_match(tiny_checkpoint, tmp_path, capsys):
    other = tmp_path / "vocab.txt"
    other.write_text("[PAD]\n[UNK]\n[CLS]\n[SEP]\nhello\n")
    err = _error(["finetune", "--task", "sst2", "--data-dir", str(GLUE), "--checkpoint", str(tiny_checkpoint),
                  "--vocab", str(other), "--out", str(tmp_path / "o")], capsys)
    assert "is not the vocabulary of checkpoint" in err
    err = _error(["finetune", "--task", "sst2", "--data-dir", str(GLUE), "--checkpoint", str(tiny_checkpoint),
                  "--vocab", str(tmp_path), "--out", str(tmp_path / "o")], capsys)
    assert f"--vocab {tmp_path} is a directory, not a vocab.txt" in err  # it said "does not exist"
    bigger = tmp_path / "ckpt"
    shutil.copytree(tiny_checkpoint, bigger)
    with open(bigger / "vocab.txt", "a") as f:
        f.write("extra1\nextra2\n")
    err = _error(["finetune", "--task", "sst2", "--data-dir", str(GLUE), "--checkpoint", str(bigger),
                  "--out", str(tmp_path / "o2")], capsys)
    assert "has 30524 tokens but" in err and "has 30522 embedding rows: the vocabulary does not belong to this model" in err


def test_bad_data_and_settings_are_cli_errors(tiny_checkpoint, tmp_path, capsys):
    base = ["--checkpoint", str(tiny_checkpoint), "--out", str(tmp_path / "o")]
    err = _error(["finetune", "--task", "rte", "--data-dir", str(FIXTURES / "broken" / "rte_unknown_label"), *base], capsys)
    assert "RTE/train.tsv:3: unknown label 'maybe'" in err
    err = _error(["finetune", "--task", "sst2", "--data-dir", str(FIXTURES / "broken" / "sst2_malformed"), *base], capsys)
    assert "train.tsv:4" in err and "--skip-malformed" in err
    err = _error(["finetune", "--task", "nope", "--data-dir", str(GLUE), *base], capsys)
    assert "unknown task 'nope'" in err
    err = _error(["finetune", "--task", "sst2", "--data-dir", str(GLUE), "--lr", "-1", *base], capsys)
    assert "--lr must be positive" in err
    # A traceback from torch (--threads -1), silently trained (--weight-decay -1), silently ignored (--doc-context)
    for flag, value, message in [("--threads", "-1", "--threads must be >= 1"),
                                 ("--weight-decay", "-1", "--weight-decay must be 0 or more, got -1"),
                                 ("--doc-context", "true", "--doc-context fills NER windows from the documents of "
                                                           "CoNLL-2003 files (-DOCSTART- lines); sst2 has none")]:
        assert message in _error(["finetune", "--task", "sst2", "--data-dir", str(GLUE), flag, value, *base], capsys)
    err = _error(["finetune", "--task", "sst2", "--data-dir", str(GLUE), "--set", "warmpu=0.1", *base], capsys)
    assert "unknown config key(s) warmpu" in err
    # Divergence: one line (it was a FloatingPointError traceback), epochs counted from 1 as the logs do.
    err = _error(["finetune", "--task", "stsb", "--data-dir", str(GLUE), "--lr", "1e30", "--max-grad-norm", "0",
                  "--warmup", "0", "--max-train-samples", "64", "--max-eval-samples", "8", "--batch-size", "8",
                  "--no-progress", *base], capsys)
    assert "at epoch 1, step" in err and "training diverged; lower the learning rate" in err
    only_o = tmp_path / "only_o"
    only_o.mkdir()
    for split in ("train", "dev"):
        (only_o / f"{split}.jsonl").write_text(json.dumps({"text": ["a", "b"], "label": ["O", "O"]}) + "\n")
    err = _error(["finetune", "--task", "tag", "--data-dir", str(only_o), *base], capsys)
    assert "every tag is 'O'; tagging needs at least one entity tag" in err and "checkpoint" not in err


def test_out_never_writes_over_what_bertpipe_did_not_write(tiny_checkpoint, tmp_path, capsys):
    """A folder holding the user's own metrics.json (a name a run writes) is refused as it is; an earlier
    run's output (its marker, or the record of what it wrote) is rewritten."""
    mine = tmp_path / "results"
    mine.mkdir()
    (mine / "metrics.json").write_text('{"my": "numbers"}')
    err = _error(["finetune", "--task", "sst2", "--data-dir", str(GLUE), "--checkpoint", str(tiny_checkpoint),
                  "--out", str(mine), *QUICK], capsys)
    assert "holds metrics.json, which `bertpipe finetune` did not write" in err
    assert [p.name for p in mine.iterdir()] == ["metrics.json"] and (mine / "metrics.json").read_text() == '{"my": "numbers"}'
    (mine / "metrics.json").unlink()
    (mine / "dev_entity_report.txt").write_text("my report")  # NER's per-split report: refused too
    err = _error(["finetune", "--task", "sst2", "--data-dir", str(GLUE), "--checkpoint", str(tiny_checkpoint),
                  "--out", str(mine), *QUICK], capsys)
    assert "holds dev_entity_report.txt, which `bertpipe finetune` did not write" in err

    out = tmp_path / "sst2"
    finetune("sst2", GLUE, tiny_checkpoint, out)
    finetune("sst2", GLUE, tiny_checkpoint, out)  # its own output: rewritten
    (out / ".bertpipe-finetune").unlink()  # the record of what it wrote still proves it
    finetune("sst2", GLUE, tiny_checkpoint, out)

    # The user's own config, kept in the folder it names as --out, proves nothing: it used to count as an
    # earlier run's, and the run then deleted the user's files under predictions/ and model/.
    own = tmp_path / "own"
    (own / "predictions").mkdir(parents=True)
    (own / "model").mkdir()
    (own / "predictions" / "mine.tsv").write_text("my predictions")
    (own / "model" / "README.md").write_text("my model card")
    (own / "config.yaml").write_text(f"task: sst2\ndata_dir: {GLUE}\ncheckpoint: {tiny_checkpoint}\nout: {own}\n")
    err = _error(["finetune", "--config", str(own / "config.yaml"), *QUICK], capsys)
    assert "holds config.yaml, model, predictions, which `bertpipe finetune` did not write" in err
    assert (own / "predictions" / "mine.tsv").read_text() == "my predictions"
    assert (own / "model" / "README.md").read_text() == "my model card"


def test_a_fine_tuned_head_keeps_the_meaning_of_its_labels(tiny_checkpoint, tmp_path, capsys):
    """An RTE model fine-tuned on SST-2 started from the RTE head; a checkpoint naming the same labels in
    another order (transformers' MNLI) kept rows that meant other classes."""
    from safetensors.torch import load_file

    from launch.finetune.finetune_config import FinetuneConfig
    from launch.finetune.runner import Finetuner

    rte = tmp_path / "rte"
    finetune("rte", GLUE, tiny_checkpoint, rte)
    tensors = load_file(rte / "model" / "model.safetensors")
    saved, saved_bias = tensors["classifier.weight"], tensors["classifier.bias"]
    biases = {}

    def head(task: str, ckpt: Path) -> torch.Tensor:
        cfg = FinetuneConfig(task=task, data_dir=str(GLUE), checkpoint=str(ckpt), out=str(tmp_path / f"o-{ckpt.name}"),
                             max_train_samples=8, max_eval_samples=8, progress=False, tensorboard=False)
        run = Finetuner(cfg)
        run.prepare()
        biases[ckpt.name] = run.model.classifier.bias.detach()
        return run.model.classifier.weight.detach()

    assert torch.equal(head("rte", rte / "model"), saved)  # its own labels: kept as trained
    capsys.readouterr()
    fresh = head("sst2", rte / "model")  # logged through the handler the CLI run above installed
    message = "trained for labels ['entailment', 'not_entailment'], not ['0', '1']: it starts from a fresh draw"
    assert message in capsys.readouterr().err
    assert not torch.equal(fresh, saved)
    swapped = Path(shutil.copytree(rte / "model", tmp_path / "swapped"))
    config = json.loads((swapped / "config.json").read_text())
    config["id2label"] = {"0": "not_entailment", "1": "entailment"}
    (swapped / "config.json").write_text(json.dumps(config))
    assert torch.equal(head("rte", swapped), saved.flip(0))  # rows follow the names
    # The bias is part of each row: left in place, the swapped head favours the class the other one did.
    assert not torch.equal(saved_bias, saved_bias.flip(0)) and torch.equal(biases["swapped"], saved_bias.flip(0))
