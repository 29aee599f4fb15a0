"""Feature-based fine-tuning (the paper's Table 7): the head keeps padding out, the activation cache is
used (a second run never loads the encoder) and verified (a damaged layer is computed again), and a
BiLSTM on frozen MiniLM activations beats a linear head on the bundled CoNLL-2003 data.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from launch import cli
from launch.finetune.feature_extraction import parse_layers
from model.heads import FrozenFeatureHead, ScalarMix

from repo_paths import DATA, GLUE

CONLL = DATA / "conll2003"
SMALL = ["--max-train-samples", "24", "--max-eval-samples", "12", "--epochs", "1", "--batch-size", "8",
         "--lstm-hidden", "8", "--no-progress", "--no-save-model"]


def run(ckpt: Path, out: Path, cache: Path, *extra: str, task: str = "conll2003", data: Path = CONLL) -> dict:
    argv = ["finetune", "--task", task, "--data-dir", str(data), "--checkpoint", str(ckpt), "--out", str(out),
            "--feature-based", "--feature-cache", str(cache), *SMALL, *extra]
    assert cli.main(argv) == 0
    return json.loads((out / "metrics.json").read_text())


def test_weighted_rows_of_table7_are_named_layer_choices():
    assert (parse_layers("last4-weighted", 6).indices, parse_layers("last4-weighted", 6).combine) == ([3, 4, 5, 6], "weighted")
    assert (parse_layers("all-weighted", 12).indices, parse_layers("all-weighted", 12).combine) == (list(range(1, 13)), "weighted")
    assert parse_layers("last4-sum", 6).combine == "sum"  # the plain sum stays available


def test_a_layers_choice_is_checked_with_the_settings_before_any_data_is_read():
    # It was read only after the whole dataset was tokenised (and in a sweep, after Ray started); without
    # --feature-based it was ignored without a word.
    from launch.finetune.finetune_config import FinetuneConfig

    base = dict(task="conll2003", data_dir="d", checkpoint="c", out="o")
    FinetuneConfig(**base, feature_based=True, layers="-2,-1").validate()
    with pytest.raises(ValueError, match="'al' is not one of embeddings"):
        FinetuneConfig(**base, feature_based=True, layers="al").validate()
    with pytest.raises(ValueError, match="add --feature-based, or drop --layers"):
        FinetuneConfig(**base, layers="all-weighted").validate()


def test_scalar_mix_starts_as_the_mean_and_the_head_ignores_padding():
    torch.manual_seed(0)
    x = torch.randn(2, 7, 3, 8)
    assert torch.allclose(ScalarMix(3)(x), x.mean(2), atol=1e-6)
    mask = torch.tensor([[1] * 7, [1] * 4 + [0] * 3])
    for per_token in (True, False):
        head = FrozenFeatureHead(3, 8, 5, combine="weighted", per_token=per_token, lstm_hidden=6).eval()
        batched, alone = head(x, mask), head(x[1:2, :4], mask[1:2, :4])
        # The short sequence gets the same logits padded in a batch as alone: padding never enters the BiLSTM.
        assert torch.allclose(batched[1, :4] if per_token else batched[1], alone[0], atol=1e-5)


def test_cache_is_used_by_the_next_run_and_verified(tiny_checkpoint, tmp_path, capsys):
    cache = tmp_path / "cache"
    first = run(tiny_checkpoint, tmp_path / "a", cache, "--layers", "all-weighted", "--seed", "3")
    assert first["encoder_loaded"] == 1 and first["encoder_batches"] > 0
    assert (first["feature_cache_misses"], first["feature_cache_hits"]) == (4, 0)  # layers 1, 2 of train and dev

    again = run(tiny_checkpoint, tmp_path / "b", cache, "--layers", "all-weighted", "--seed", "3")
    assert (again["encoder_loaded"], again["encoder_batches"], again["feature_cache_misses"]) == (0, 0, 0)
    assert again["feature_cache_hits"] == 4
    # What was cached is what the first run trained on: the same run gives the same numbers.
    assert (again["train_loss"], again["f1"], again["accuracy"]) == (first["train_loss"], first["f1"], first["accuracy"])

    records = {json.loads(p.read_text())["split"]: p for p in cache.glob("*/layer-2.json")}
    damaged = records["train"].with_suffix(".safetensors")
    data = bytearray(damaged.read_bytes())
    data[-1] ^= 0xFF
    damaged.write_bytes(bytes(data))
    capsys.readouterr()
    third = run(tiny_checkpoint, tmp_path / "c", cache, "--layers", "last", "--seed", "3")
    log = capsys.readouterr().err  # the CLI logs to stderr
    assert log.count(f"{damaged} its sha256 does not match its record; computing it again") == 1  # once, not per look
    assert (third["feature_cache_misses"], third["feature_cache_hits"], third["encoder_loaded"]) == (1, 1, 1)
    record = json.loads(records["train"].read_text())
    from pipeline.manifest import sha256_file

    assert record["sha256"] == sha256_file(damaged) and record["shape"][1] == 32  # rewritten, hidden size 32
    assert record["compute"] == "cpu-fp32"  # where and how the encoder ran is part of the key
    assert not list(cache.glob("*/.*.tmp"))  # nothing half-written left behind

    # A record that parses but is not one (JSON null): recomputed, not a crash; a killed writer's temp file is swept.
    records["dev"].write_text("null\n")
    killed = records["dev"].parent / ".layer-2.safetensors.999999.tmp"
    killed.write_bytes(b"half")
    fourth = run(tiny_checkpoint, tmp_path / "d", cache, "--layers", "last", "--seed", "3")
    assert "layer-2.json is not a record; computing it again" in capsys.readouterr().err
    assert (fourth["feature_cache_misses"], fourth["f1"]) == (1, third["f1"]) and not killed.exists()


def test_cached_activations_do_not_depend_on_the_eval_batch_size(tiny_checkpoint, tmp_path):
    # The encoder ran at --eval-batch-size, which is not in the cache's key: the same entry held other bytes
    # (padding to another batch's length moves the last bits), whichever run filled it first.
    records = {}
    for size in ("5", "64"):
        cache = tmp_path / f"cache{size}"
        run(tiny_checkpoint, tmp_path / f"out{size}", cache, "--layers", "all-weighted", "--eval-batch-size", size,
            "--max-train-samples", "64", "--max-eval-samples", "64")
        records[size] = {p.relative_to(cache): json.loads(p.read_text())["sha256"] for p in cache.glob("*/layer-*.json")}
    assert records["5"] and records["5"] == records["64"]


def test_sentence_tasks_train_a_pooled_head_and_span_tasks_are_refused(tiny_checkpoint, tmp_path, capsys):
    m = run(tiny_checkpoint, tmp_path / "sst2", tmp_path / "cache", "--layers", "last", task="sst2", data=GLUE)
    assert m["metric"] == "accuracy" and m["eval_examples"] == 12 and m["encoder_loaded"] == 1
    with pytest.raises(SystemExit) as exc:
        run(tiny_checkpoint, tmp_path / "squad", tmp_path / "cache", task="squad", data=DATA / "squad")
    assert exc.value.code == 2 and "squad needs fine-tuning" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        run(tiny_checkpoint, tmp_path / "both", tmp_path / "cache", "--freeze")
    assert "--freeze and --feature-based" in capsys.readouterr().err
    # A --feature-cache that cannot be a folder: it was blamed on --out ("cannot create --out"), or a traceback
    (tmp_path / "afile").write_text("mine")
    with pytest.raises(SystemExit):
        run(tiny_checkpoint, tmp_path / "c", tmp_path / "afile", "--layers", "last", task="sst2", data=GLUE)
    err = capsys.readouterr().err
    assert f"--feature-cache {tmp_path / 'afile'} cannot be a folder" in err and "--out" not in err


@pytest.mark.slow
def test_bilstm_beats_a_linear_head_on_frozen_minilm_features(minilm_dir, tmp_path):
    """200 training sentences of the bundled CoNLL-2003, 100 dev, MiniLM's last layer (cached once,
    shared by all four runs). The linear head gets the best of three learning rates, the BiLSTM one.
    Measured: linear 0.53-0.57 entity F1, BiLSTM (128 units) 0.69."""
    common = ["--layers", "last", "--max-train-samples", "200", "--max-eval-samples", "100", "--epochs", "10",
              "--batch-size", "16", "--threads", "1"]
    cache = tmp_path / "cache"
    linear = [run(minilm_dir, tmp_path / f"linear-{lr}", cache, *common, "--feature-head", "linear", "--feature-lr", lr)
              for lr in ("1e-2", "3e-2", "1e-1")]
    bilstm = run(minilm_dir, tmp_path / "bilstm", cache, *common, "--lstm-hidden", "128", "--feature-lr", "1e-2")
    best_linear = max(m["f1"] for m in linear)
    assert sum(m["encoder_loaded"] for m in linear + [bilstm]) == 1
    assert bilstm["f1"] > best_linear + 0.05, (bilstm["f1"], [m["f1"] for m in linear])


def test_frozen_encoder_gives_the_full_forward_hidden_states(tiny_checkpoint, tokenizer):
    """Only the layers up to the deepest one asked for are run; what they give is the full pass's."""
    from launch.finetune.conll import LABELS
    from launch.finetune.encoding import collate, tag_features
    from launch.finetune.examples import TaggedExample
    from launch.finetune.feature_based import FrozenEncoder
    from launch.finetune.feature_cache import CacheStats
    from model import BertModel, load_pretrained

    examples = [TaggedExample("a", ("EU", "rejects", "German", "call"), ("B-ORG", "O", "B-MISC", "O"), "d"),
                TaggedExample("b", ("Peter", "Blackburn"), ("B-PER", "I-PER"), "d")]
    feats = tag_features(examples, tokenizer, max_seq_len=32, label_ids={n: i for i, n in enumerate(LABELS)})
    tokens = sum(len(f.input_ids) for f in feats)
    encoder = FrozenEncoder(tiny_checkpoint, torch.device("cpu"), 1, False, CacheStats())
    model, _ = load_pretrained(BertModel, tiny_checkpoint)
    batch = collate(feats)
    with torch.no_grad():
        full = model.eval()(batch["input_ids"], batch["token_type_ids"], batch["attention_mask"],
                            output_hidden_states=True).hidden_states
    for layers in ([0], [1, 2]):
        got = encoder.hidden_states(feats, layers, tokens)
        for k in layers:
            expected = torch.cat([full[k][r, : len(f.input_ids)] for r, f in enumerate(feats)])
            torch.testing.assert_close(got[k].float(), expected, atol=2e-3, rtol=2e-3)  # stored as fp16
    assert encoder.stats.encoder_batches == 4 and len(encoder.model.encoder.layers) == 2  # restored


def test_cache_folder_depends_on_what_the_activations_depend_on():
    from dataclasses import fields, replace

    from launch.finetune.feature_cache import SplitKey

    key = SplitKey("ckpt", "data", "conll2003", "dev", 128, "cpu-fp32")
    # bf16 activations (autocast on CUDA) must not be handed to a later fp32 run, nor CUDA's fp32 ones (other
    # last bits) to a CPU run, nor any other change
    other = {"checkpoint": "ckpt2", "data": "data2", "task": "tag", "split": "train", "max_seq_len": 64,
             "compute": "cuda-fp32"}
    assert {f.name for f in fields(SplitKey)} == set(other)
    assert len({key.digest} | {replace(key, **{k: v}).digest for k, v in other.items()}) == 1 + len(other)


def test_data_digest_sees_the_segment_ids():
    # The encoder reads token_type_ids too: a pair split at another [SEP] gives other activations.
    from types import SimpleNamespace as F

    from launch.finetune.feature_cache import data_digest

    ids = [2, 5, 6, 3, 7, 3]
    a = data_digest([F(input_ids=ids, token_type_ids=[0, 0, 0, 0, 1, 1])])
    assert a == data_digest([F(input_ids=ids, token_type_ids=[0, 0, 0, 0, 1, 1])])
    assert a != data_digest([F(input_ids=ids, token_type_ids=[0, 0, 0, 1, 1, 1])])


def test_checkpoint_digest_sees_weights_rewritten_in_place_in_the_same_process(tmp_path):
    # The digest is memoised per process: keyed by path alone, a sweep worker that saw the old weights
    # would read their cached activations for the new ones.
    import os

    from launch.finetune.feature_cache import checkpoint_digest

    (tmp_path / "config.json").write_text("{}")
    weights = tmp_path / "model.safetensors"
    weights.write_bytes(b"one")
    first = checkpoint_digest(tmp_path)
    weights.write_bytes(b"two!")
    os.utime(weights, ns=(0, weights.stat().st_mtime_ns + 10**9))
    assert checkpoint_digest(tmp_path) != first


def test_a_regression_head_on_frozen_features_trains_on_the_float_scores(tiny_checkpoint, tmp_path):
    # The feature-based batches were collated as class ids: 3.8 became 3, and the head learnt floor(score)
    from launch.finetune.feature_based import FeatureBased
    from launch.finetune.finetune_config import FinetuneConfig
    from launch.finetune.runner import Finetuner

    data = tmp_path / "data"
    data.mkdir()
    (data / "train.tsv").write_text("text\tscore\na fine film\t3.8\na dull one\t1.2\n")
    (data / "dev.tsv").write_text("text\tscore\nfine\t2.5\ndull\t0.5\n")
    cfg = FinetuneConfig(task="regress", data_dir=str(data), checkpoint=str(tiny_checkpoint), out=str(tmp_path / "out"),
                         label_column="score", feature_based=True, layers="last", feature_cache=str(tmp_path / "cache"))
    runner = type("FeatureBasedFinetuner", (FeatureBased, Finetuner), {})(cfg)
    runner.prepare()
    labels = runner.train_feats.batch([0, 1])["labels"]
    assert labels.dtype.is_floating_point and sorted(labels.tolist()) == pytest.approx([1.2, 3.8])


def test_reading_cached_layers_holds_one_beside_the_result(tmp_path, monkeypatch):
    """Each cached layer is copied into the [T, K, H] result as it is read: the 13 layers of an
    all-weighted row were all held at once, then stacked (twice the memory of the result)."""
    import weakref

    from launch.finetune.feature_cache import FeatureCache, SplitKey

    key = SplitKey("ckpt", "data", "conll2003", "train", 32, "cpu-fp32")
    layers = {k: torch.randn(50, 8) for k in range(5)}
    cache = FeatureCache(tmp_path)
    first = cache.layers(key, [4, 0, 2, 0], 50, 8, lambda missing: {k: layers[k] for k in missing})
    expected = torch.stack([layers[k].half() for k in (4, 0, 2, 0)], dim=1)
    assert torch.equal(first, expected) and cache.stats.misses == 3

    alive, most = set(), [0]
    real_read = FeatureCache._read

    def counted_read(self, *args, **kwargs):
        tensor = real_read(self, *args, **kwargs)
        if tensor is not None:
            alive.add(id(tensor))
            most[0] = max(most[0], len(alive))
            weakref.finalize(tensor, alive.discard, id(tensor))
        return tensor

    monkeypatch.setattr(FeatureCache, "_read", counted_read)
    again = FeatureCache(tmp_path)
    second = again.layers(key, [4, 0, 2, 0], 50, 8, lambda missing: pytest.fail(f"encoder run for {missing}"))
    assert torch.equal(second, expected) and again.stats.hits == 3
    assert most[0] == 1


def test_a_text_head_reads_the_bilstms_last_layer_at_each_ends_real_token():
    # The text's vector is the top BiLSTM layer's forward state after its last real token and its backward
    # state after the first (the [CLS] end): not the first layer's, and not a state that has seen padding.
    torch.manual_seed(0)
    x, mask = torch.randn(2, 6, 2, 8), torch.tensor([[1] * 6, [1] * 3 + [0] * 3])
    head = FrozenFeatureHead(2, 8, 3, combine="concat", per_token=False, lstm_hidden=5, lstm_layers=2).eval()
    out, _ = head.lstm(x.flatten(2))  # [B, L, 2D]; each row alone, so padding is what we choose to read
    out_short, _ = head.lstm(x[1:, :3].flatten(2))
    states = torch.stack([torch.cat([out[0, -1, :5], out[0, 0, 5:]]),
                          torch.cat([out_short[0, -1, :5], out_short[0, 0, 5:]])])
    assert torch.allclose(head(x, mask), head.classifier(states), atol=1e-5)


def test_a_text_head_without_a_bilstm_reads_the_cls_position_only():
    torch.manual_seed(0)
    x, mask = torch.randn(2, 5, 3, 4), torch.ones(2, 5, dtype=torch.long)
    head = FrozenFeatureHead(3, 4, 2, combine="sum", per_token=False, lstm_hidden=0).eval()
    changed = x.clone()
    changed[:, 1:] = torch.randn(2, 4, 3, 4)  # every token after [CLS]
    assert torch.allclose(head(x, mask), head(changed, mask)) and torch.allclose(head(x, mask), head.classifier(x[:, 0].sum(1)))
    with pytest.raises(ValueError, match="combine must be concat, sum or weighted, got 'mean'"):
        FrozenFeatureHead(3, 4, 2, combine="mean", per_token=False)
