"""One override syntax for every command: `--config FILE.yaml` plus `--KEY VALUE` generated from the
config dataclass, defaults shown in --help from the dataclass, old forms accepted with a warning."""

from __future__ import annotations

import argparse
import logging
from dataclasses import dataclass, field
from typing import Literal, Optional

import pytest

from launch import cli
from launch.config_flags import add_config_flags, config_from_args, field_docs, given_flags
from launch.errors import CliError


@dataclass
class Inner:
    """rate: how fast
      it goes (two lines).
    mode: a or b.
    """

    rate: float = 0.5
    mode: Literal["a", "b"] = "a"
    extra: dict = field(default_factory=dict)


@dataclass
class Outer:
    name: str = "x"  # the name
    count: Optional[int] = None  # how many; null = all
    fast: bool = False  # go fast
    items: list = field(default_factory=list)
    files: list[str] = field(default_factory=list)
    inner: Inner = field(default_factory=Inner)


def _parse(argv, **kwargs):
    parser = argparse.ArgumentParser()
    add_config_flags(parser, Outer, **kwargs)
    return parser, parser.parse_args(argv)


def test_a_list_of_text_takes_file_names_as_they_are():
    # Read as YAML, `*.txt` was an alias, `#` began a comment and `a: b` made a mapping.
    names = ["*.txt", "notes #1.txt", "Ali: Fear.txt", "yes", "[ab]*.txt", "0123"]
    assert config_from_args(_parse(["--files", *names])[1], Outer).files == names


def test_a_list_flag_given_twice_adds_up():
    # `--input wiki --input books` read only the books: the second list replaced the first.
    cfg = config_from_args(_parse(["--files", "a", "b", "--files", "c", "--inner.extra", "x=1", "--inner.extra", "y=2"])[1],
                           Outer)
    assert cfg.files == ["a", "b", "c"] and cfg.inner.extra == {"x": 1, "y": 2}
    assert config_from_args(_parse([])[1], Outer).files == []


def test_an_optional_switch_takes_null_as_its_help_says():
    # `--model.compile null` ("true, false, null = auto") was refused: "expected true or false, got 'null'"
    @dataclass
    class Switches:
        auto: Optional[bool] = True  # true, false, null = auto
        plain: bool = False

    def parse(argv):
        parser = argparse.ArgumentParser()
        add_config_flags(parser, Switches)
        return config_from_args(parser.parse_args(argv), Switches)

    assert parse(["--auto", "null"]).auto is None and parse(["--auto", "false"]).auto is False
    with pytest.raises(SystemExit):
        parse(["--plain", "null"])


def test_field_docs_from_comments_and_docstring():
    assert field_docs(Outer)["count"] == "how many; null = all"
    assert field_docs(Inner)["rate"] == "how fast it goes (two lines)."


def test_flags_cover_every_field_with_types_and_defaults():
    parser, args = _parse(["--name", "yes", "--count", "3", "--fast", "--items", "1", "two",
                           "--inner.rate", "1e-4", "--inner.mode", "b", "--inner.extra", "k=0", "j=x"])
    cfg = config_from_args(args, Outer)
    # Text stays text ("yes" is not YAML's true); numbers typed strictly; 1e-4 without a dot is a float.
    assert cfg == Outer(name="yes", count=3, fast=True, items=[1, "two"],
                        inner=Inner(rate=1e-4, mode="b", extra={"k": 0, "j": "x"}))
    text = parser.format_help()
    assert "--inner.rate X" in text and "how fast it goes (two lines). (default: 0.5)" in text
    assert "--fast [true|false]" in text and "go fast (default: false; --no-fast = false)" in text
    for argv, value in ((["--fast"], True), (["--fast", "false"], False), (["--no-fast"], False)):
        assert config_from_args(_parse(argv)[1], Outer).fast is value
    assert "--count N" in text and "(default: null)" in text


def test_layering_file_then_old_forms_then_flags(tmp_path):
    path = tmp_path / "c.yaml"
    path.write_text("name: from-file\ncount: 1\ninner: {rate: 2.0}\n")
    _, args = _parse(["--config", str(path), "--count", "null"])
    cfg = config_from_args(args, Outer, legacy=["inner.rate=3.0", "name=legacy"])
    assert (cfg.name, cfg.count, cfg.inner.rate) == ("legacy", None, 3.0)
    _, args = _parse(["--config", str(path), "--name", "flag"])
    assert config_from_args(args, Outer, legacy=["name=legacy"]).name == "flag"
    assert given_flags(args) == {"name": "flag"}  # only what was typed


def test_wrong_type_and_unknown_key_name_the_flag(tmp_path):
    _, args = _parse(["--count", "many"])
    with pytest.raises(CliError, match=r"--count: expected an integer, got 'many'"):
        config_from_args(args, Outer)
    _, args = _parse([])
    with pytest.raises(CliError, match=r"unknown config key\(s\) inner.speed; valid keys here: inner.rate, inner.mode"):
        config_from_args(args, Outer, legacy=["inner.speed=1"])
    parser, _ = _parse([])
    with pytest.raises(SystemExit):
        parser.parse_args(["--inner.mode", "c"])  # choices come from the Literal


# Every command that has a config tree, and one field of each with its dataclass default.
COMMANDS_WITH_CONFIG = {
    "corpus": ("--seq-len N", "(default: 128)"),
    "pretrain": ("--optim.lr X", "(default: 0.001)"),
    "finetune": ("--lr X", "(default: 2e-05)"),
    "sweep": ("--warmup X", "(default: 0.1)"),
    "features": ("--layers VALUE", "(default: last)"),
}


def _help_text(parser: argparse.ArgumentParser) -> str:
    """A parser's help and that of its sub-commands (`download wikipedia|books`)."""
    subs = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]
    return parser.format_help() + "".join(p.format_help() for a in subs for p in a.choices.values())


@pytest.mark.parametrize("command", sorted(cli.COMMANDS))
def test_help_shows_one_syntax_and_defaults(command):
    text = _help_text(cli.build_parser(command))
    assert "--set" not in text and "KEY=VALUE ..." not in text.split("options:")[0].replace("[--KEY VALUE ...]", "")
    if command in COMMANDS_WITH_CONFIG:
        flag, default = COMMANDS_WITH_CONFIG[command]
        assert flag in text and default in text and "--config FILE.yaml" in text
    else:
        assert "default" in text  # plain flags state their defaults in their help
    if command == "sweep":  # `--lr X ... (default: 2e-05)` alone read as every trial's, where the grids set it
        assert " ".join(text.split()).count("the paper and quick grids set it per trial; this default holds where") == 3
    # a required setting says so, not "(default: '')" or "(default: [])" as --out, --task and --input did
    assert "(default: '')" not in text and "(default: [])" not in text


def test_old_override_forms_still_work_with_a_warning(caplog):
    from launch.cli.finetune import config_from_args as finetune_config
    from launch.pretrain.worker import add_arguments, load_run_config

    parser = argparse.ArgumentParser()
    add_arguments(parser)
    args = parser.parse_args(["--config", "tiny", "--data", "c", "--out", "r", "optim.lr=0.5", "--max-steps", "7"])
    with caplog.at_level(logging.WARNING):
        cfg = load_run_config(args)
    assert cfg.optim.lr == 0.5 and cfg.schedule.total_steps == 7
    assert "deprecated; write --optim.lr 0.5" in caplog.text

    # The advice is these overrides as this command's flags: it named --optim.lr and --seq-len to every
    # command, and `finetune` has neither.
    parser = cli.build_parser("finetune")
    base = ["--task", "sst2", "--data-dir", "d", "--checkpoint", "c", "--out", "o"]
    caplog.clear()
    with caplog.at_level(logging.WARNING):
        cfg = finetune_config(parser.parse_args(base + ["--set", "warmup=0.06", "--set", "max_grad_norm=2", "--lr", "1e-4",
                                                        "--no-group-by-length"]))
    assert (cfg.warmup, cfg.lr, cfg.group_by_length) == (0.06, 1e-4, False)
    advice = caplog.text.split("deprecated; write ")[1].split("\n")[0]
    assert advice == "--warmup 0.06 --max-grad-norm 2"
    assert finetune_config(parser.parse_args(base + advice.split() + ["--lr", "1e-4", "--no-group-by-length"])) == cfg


@pytest.mark.parametrize("command, form, flags", [
    ("corpus", "input_format=text", ["--format", "text"]),  # the flag a command renamed (FLAG_NAMES)
    ("pretrain", "model.fields.hidden_dropout_prob=0.1", ["--model.fields", "hidden_dropout_prob=0.1"]),  # a mapping's item
    ("pretrain", "model.fields={unpad: true}", ["--model.fields", "unpad=true"]),
    ("pretrain", "optim.lr=0.5", ["--optim.lr", "0.5"]),
])
def test_the_deprecation_advice_is_a_flag_the_command_has(command, form, flags):
    from launch.config_flags import as_flag
    from launch.cli.corpus import FLAG_NAMES
    from launch.pretrain.pretrain_config import PretrainConfig
    from pipeline.corpus_job import CorpusConfig

    from launch.config_flags import config_from_args

    cls, names = (CorpusConfig, FLAG_NAMES) if command == "corpus" else (PretrainConfig, None)
    assert as_flag(form, cls, names) == " ".join(flags)
    # ... and that flag sets what the old form set
    parser = cli.build_parser(command)
    base = ["--input", "x", "--out", "o"] if command == "corpus" else ["--config", "tiny", "--data", "c", "--out", "r"]
    legacy = "action" if command == "corpus" else "overrides"
    old, new = parser.parse_args(base + [form]), parser.parse_args(base + flags)
    preset = command == "pretrain"
    assert (config_from_args(old, cls, legacy=getattr(old, legacy), preset=preset)
            == config_from_args(new, cls, legacy=getattr(new, legacy), preset=preset)
            != config_from_args(parser.parse_args(base), cls, preset=preset))
    assert as_flag("no_such_key=1", cls, names) is None


def test_pretrain_new_syntax_matches_old(tmp_path):
    from launch.pretrain.worker import add_arguments, load_run_config

    parser = argparse.ArgumentParser()
    add_arguments(parser)
    new = load_run_config(parser.parse_args(["--config", "tiny", "--data", "c", "--out", "r", "--zero.stage", "2",
                                             "--data.micro-batch-size", "4", "--model.fields", "unpad=true"]))
    old = load_run_config(parser.parse_args(["--config", "tiny", "--data", "c", "--out", "r", "zero.stage=2",
                                             "data.micro_batch_size=4", "model.fields={unpad: true}"]))
    assert new == old and new.zero.stage == 2 and new.model.fields["unpad"] is True


def test_two_spellings_of_one_field_must_agree(capsys):
    """`--max-steps 2 --schedule.total-steps 40` ran 40 steps: the last spelling won without a word."""
    parser, args = _parse(["--inner.rate", "2", "--speed", "2"], aliases={"inner.rate": ["--speed"]})
    assert given_flags(args) == {"inner": {"rate": 2}}
    with pytest.raises(SystemExit):
        _parse(["--speed", "2", "--inner.rate", "40"], aliases={"inner.rate": ["--speed"]})
    assert "--speed 2 and --inner.rate 40 set the same field; give one of them" in capsys.readouterr().err
    _, args = _parse(["--inner.rate", "2", "--inner.rate", "3"], aliases={"inner.rate": ["--speed"]})
    assert given_flags(args) == {"inner": {"rate": 3}}  # one spelling repeated: the last wins, as argparse does


def test_a_sweep_s_out_is_described_as_the_sweep_s_not_one_run_s():
    """`bertpipe sweep --help` described --out with fine-tuning's files (metrics.json, the model), which a
    sweep writes only per trial."""
    from launch.cli import build_parser

    def out_help(command):
        return next(a.help for a in build_parser(command)._actions if "--out" in a.option_strings)

    assert "results.json" in out_help("sweep") and "trials/<trial>/" in out_help("sweep")
    assert "metrics.json" in out_help("finetune") and "results.json" not in out_help("finetune")
