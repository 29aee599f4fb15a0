"""Bad pre-training settings are refused by `bertpipe pretrain` in one line naming the flag or file,
before any process starts: values out of range, YAML that does not parse, `model.fields` of the
wrong type. Nothing here needs a corpus: the refusals come first."""

from __future__ import annotations

import argparse

import pytest

from launch import cli
from launch.config import load_config
from launch.config_flags import _leaves, _without_none
from launch.pretrain.pretrain_config import _RANGES, PretrainConfig, validate


def _refused(tmp_path, capsys, *extra: str, config: str = "tiny") -> str:
    """`bertpipe pretrain --config CONFIG ... EXTRA`: exits 2 with one line, starts nothing; returns it."""
    out = tmp_path / "run"
    argv = ["pretrain", "--config", config, "--data", str(tmp_path / "no-corpus"), "--out", str(out),
            "--nproc", "1", *extra]
    with pytest.raises(SystemExit) as exit_info:
        cli.main(argv)
    assert exit_info.value.code == 2
    err = capsys.readouterr().err
    assert "Traceback" not in err and not out.exists()
    lines = [line for line in err.splitlines() if "bertpipe pretrain: error:" in line]
    assert len(lines) == 1, err
    return lines[0]


@pytest.mark.parametrize("flag, value, message", [
    ("--log.log-every", "0", "--log.log-every must be at least 1, got 0"),  # ZeroDivisionError after step 1
    ("--checkpoint.save-every", "-1", "--checkpoint.save-every must be 0 (only at the end) or more, got -1"),
    ("--save-every", "-1", "--checkpoint.save-every must be 0"),
    ("--data.prefetch", "-3", "--data.prefetch must be 0 (no prefetch) or more, got -3"),
    ("--optim.lr", "nan", "--optim.lr must be a finite number > 0, got nan"),
    ("--optim.lr", "0", "--optim.lr must be a finite number > 0, got 0.0"),
    ("--optim.beta2", "1", "--optim.beta2 must be in [0, 1), got 1.0"),
    ("--schedule.min-lr-ratio", "2", "--schedule.min-lr-ratio must be in [0, 1], got 2.0"),
    ("--schedule.power", "-1", "--schedule.power must be a finite number > 0, got -1.0"),
    ("--schedule.warmup-steps", "-5", "--schedule.warmup-steps must be null (use warmup_ratio) or 0 or more"),
    ("--log.eval-samples", "0", "--log.eval-samples must be at least 1, got 0"),
    ("--log.peak-tflops", "-1", "--log.peak-tflops must be null or a finite number > 0, got -1.0"),
    ("--log.max-nonfinite-steps", "0", "--log.max-nonfinite-steps must be at least 1, got 0"),
    ("--precision.loss-scale-window", "0", "--precision.loss-scale-window must be at least 1, got 0"),
    ("--zero.reduce-bucket-size", "0", "--zero.reduce-bucket-size must be at least 1, got 0"),
    # each a traceback before: IndexError in the first step, ZeroDivisionError, torch's init, torch.compile
    ("--model.fields", "type_vocab_size=1", "type_vocab_size=1: pre-training's sentence pairs need segment ids 0 and 1"),
    ("--model.fields", "num_attention_heads=0", "model.fields: num_attention_heads must be at least 1, got 0"),
    ("--model.fields", "initializer_range=-1", "initializer_range 0 or more, got 1e-12 and -1.0"),
    ("--model.compile-mode", "bogus", "--model.compile-mode must be null or a torch.compile mode: default, "),
])
def test_out_of_range_values_name_the_flag(tmp_path, capsys, flag, value, message):
    assert message in _refused(tmp_path, capsys, flag, value)


def test_every_numeric_field_has_a_range():
    numeric = {".".join(path) for path, _, annotation, _ in _leaves(PretrainConfig)
               if _without_none(annotation) in (int, float)}
    assert numeric - {"zero.stage"} == set(_RANGES) - {"model.compile_mode"}  # zero.stage has its own check (0, 1, 2 or 3)
    for preset in ("tiny", "demo", "demo-seq64", "bert-base", "bert-large-phase1", "bert-large-phase2"):
        validate(load_config(PretrainConfig, preset), world_size=1, device_type="cuda")  # the ranges hold


def test_eval_samples_below_the_world_size_is_refused():
    cfg = load_config(PretrainConfig, "tiny", ["log.eval_samples=1"])
    with pytest.raises(ValueError, match=r"--log.eval-samples \(1\) must be at least the data-parallel size \(2\)"):
        validate(cfg, world_size=2, device_type="cpu")


@pytest.mark.parametrize("extra, message", [
    (["--optim.lr", "[1"], "argument --optim.lr: '[1' is not a YAML value: expected ',' or ']'"),
    (["--model.fields", "unpad={"], "argument --model.fields: '{' is not a YAML value"),
    (["optim.lr=[1"], "override 'optim.lr=[1': '[1' is not a YAML value: expected ',' or ']'"),
])
def test_yaml_errors_in_flags_and_overrides_name_them(tmp_path, capsys, extra, message):
    assert message in _refused(tmp_path, capsys, *extra)


def test_yaml_error_in_config_file_names_the_file_and_line(tmp_path, capsys):
    bad = tmp_path / "bad.yaml"
    bad.write_text("optim:\n  lr: 1e-3\n  beta1: [0.9\nzero: {stage: 1}\n")
    assert f"config file {bad} is not valid YAML: line 4, column 5: expected ',' or ']', but got ':' " \
           f"(while parsing a flow sequence started at line 3)" in _refused(tmp_path, capsys, config=str(bad))
    with pytest.raises(ValueError, match="not valid YAML: line 4"):
        load_config(PretrainConfig, bad)


@pytest.mark.parametrize("item, message", [
    ("unpad=flase", "model.fields.unpad: expected true or false, got 'flase'"),  # was truthy: unpad on
    ("hidden_size=64.5", "model.fields.hidden_size: expected an integer, got 64.5"),
    ("attention_impl=flash", "model.fields.attention_impl: 'flash' is not one of 'eager', 'sdpa'"),
    ("hidden_sise=64", "model.fields.hidden_sise: not a BertConfig field; valid fields: hidden_size,"),
    ("vocab_size=100", "model.fields.vocab_size: set model.vocab_size (--model.vocab-size) instead"),
    ("hidden_dropout_prob=1.5", "model.fields: hidden_dropout_prob must be in [0, 1), got 1.5"),
])
def test_model_fields_are_typed_as_bert_config(tmp_path, capsys, item, message):
    assert message in _refused(tmp_path, capsys, "--model.fields", item)


def test_model_fields_from_yaml_are_coerced(tmp_path):
    from launch.pretrain.worker import add_arguments, load_run_config
    from model import BertConfig

    path = tmp_path / "c.yaml"
    # YAML 1.1 reads `1e-5` (no dot) as text, and a quoted "0" is text too: both are numbers here.
    path.write_text('model:\n  preset: tiny\n  fields: {hidden_dropout_prob: "0", layer_norm_eps: 1e-5, unpad: true}\n')
    parser = argparse.ArgumentParser()
    add_arguments(parser)
    cfg = load_run_config(parser.parse_args(["--config", str(path), "--data", "c", "--out", "r"]))
    validate(cfg, world_size=1, device_type="cpu")
    assert cfg.model.fields == {"hidden_dropout_prob": 0.0, "layer_norm_eps": 1e-5, "unpad": True}
    assert isinstance(cfg.model.fields["hidden_dropout_prob"], float)
    bert = BertConfig.preset(cfg.model.preset, vocab_size=100, **cfg.model.fields)  # what the trainer does
    assert bert.hidden_dropout_prob == 0.0 and bert.unpad is True


def test_every_preset_is_named_where_presets_are_listed():
    # The list was written out in five places; a new preset (demo-seq64) must reach every one.
    from launch.config import PRESET_DIR, preset_names
    from repo_paths import REPO

    names = preset_names()
    assert sorted(names) == sorted(p.stem for p in PRESET_DIR.glob("*.yaml")) and names[0] == "tiny"
    listed = ", ".join(names)
    for doc in ("README.md", "launch/cli/pretrain.py", "launch/pretrain/pretrain_config.py"):
        assert listed in " ".join((REPO / doc).read_text(encoding="utf-8").split()), doc
