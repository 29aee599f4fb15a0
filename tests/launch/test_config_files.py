"""What `--config` accepts: a YAML file (or, for pretrain, a preset name), refused in one line naming --config
when it is missing, a directory, a pipe, a device or far too big; and corpus's two vocab choices."""

from __future__ import annotations

import argparse
import os
import re
import threading
from dataclasses import dataclass
from pathlib import Path

import pytest

from launch import cli, config
from launch.config_flags import add_config_flags, config_from_args
from launch.errors import CliError
from repo_paths import REPO


@dataclass
class Small:
    name: str = "x"
    count: int = 1


def _config_of(source, preset=False):
    parser = argparse.ArgumentParser()
    add_config_flags(parser, Small)
    return config_from_args(parser.parse_args(["--config", str(source)]), Small, preset=preset)


def _in_a_thread(call, seconds=20):
    """call()'s result or exception, failing (not hanging) where it waits longer than `seconds`."""
    box = {}

    def run():
        try:
            box["value"] = call()
        except BaseException as err:  # noqa: BLE001 - handed to the test
            box["error"] = err

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    thread.join(seconds)
    assert not thread.is_alive(), f"still waiting after {seconds} s"
    if "error" in box:
        raise box["error"]
    return box["value"]


@pytest.mark.parametrize("preset", [False, True])
def test_a_pipe_is_read_and_a_named_pipe_nobody_writes_to_is_refused_not_waited_on(tmp_path, preset):
    # `--config <(...)` and `--config /dev/stdin` are pipes, and were read (where a preset may be named, the name
    # must end in .yaml: the same pipe as a named one); a named pipe without a writer hung.
    read_end, write_end = os.pipe()
    os.write(write_end, b"name: piped\n")
    os.close(write_end)
    piped = tmp_path / "piped.yaml"
    piped.symlink_to(f"/proc/self/fd/{read_end}")
    try:
        assert _in_a_thread(lambda: _config_of(piped if preset else f"/dev/fd/{read_end}", preset)) == Small(name="piped")
    finally:
        os.close(read_end)
    fifo = tmp_path / "c.yaml"
    os.mkfifo(fifo)
    with pytest.raises(CliError, match=rf"^--config {re.escape(str(fifo))} is a pipe that nobody wrote to; pass a "
                                       r"YAML file of Small fields"):
        _in_a_thread(lambda: _config_of(fifo, preset))


def test_a_device_for_config_is_refused():
    with pytest.raises(CliError, match=r"^--config /dev/zero is a device, not a file; pass a YAML file"):
        _config_of("/dev/zero")  # read whole, it never ended


def test_a_config_far_too_big_is_refused_unread(tmp_path):
    big = tmp_path / "big.yaml"
    big.write_text("#" * config.MAX_CONFIG_BYTES + "\n")  # a valid YAML (a comment), one byte over
    with pytest.raises(CliError, match=rf"^--config {re.escape(str(big))} is {config.MAX_CONFIG_BYTES + 1:,} bytes; "
                                       r"a config file is a few KB \(at most 1,048,576 bytes\); pass a YAML file"):
        _config_of(big)
    big.write_text("#" * (config.MAX_CONFIG_BYTES - 1) + "\n")  # at the limit: read
    assert _config_of(big) == Small()


@pytest.mark.skipif(not Path("/proc/self/status").is_file(), reason="needs Linux's /proc")
def test_at_most_the_limit_is_read_where_the_size_is_not_told(monkeypatch):
    monkeypatch.setattr(config, "MAX_CONFIG_BYTES", 10)  # /proc/self/status: size 0 to stat, over 10 bytes to read
    with pytest.raises(CliError, match=r"^--config /proc/self/status is over 10 bytes; a config file is a few KB"):
        _config_of("/proc/self/status")


@pytest.mark.parametrize("name, preset, message", [
    ("missing.yaml", False, "--config {path} does not exist; pass a YAML file of Small fields"),
    ("missing", False, "--config {path} does not exist; pass a YAML file of Small fields"),
    ("missing.yaml", True, "--config {path} does not exist; pass a YAML file of Small fields or a preset name (tiny, "),
    ("missing", True, "--config {path} is neither a preset nor a file; pass a YAML file of Small fields or a preset "
                      "name (tiny, demo, "),
    ("folder", False, "--config {path} is a directory, not a file; pass a YAML file of Small fields"),
    ("folder", True, "--config {path} is not a preset, and it is a directory, not a file; pass a YAML file of Small "
                     "fields or a preset name (tiny, "),
    ("file.cfg", True, "--config {path} is not a preset, and a config file's name ends in .yaml or .yml: rename it"),
])
def test_a_config_that_is_no_file_names_the_flag_and_what_to_pass(tmp_path, name, preset, message):
    (tmp_path / "folder").mkdir()
    (tmp_path / "file.cfg").write_text("count: 2\n")
    path = tmp_path / name
    with pytest.raises(CliError) as err:
        _config_of(path, preset)
    assert str(err.value).startswith(message.format(path=path)), str(err.value)
    assert "Errno" not in str(err.value)


def test_a_preset_and_a_yaml_file_still_resolve(tmp_path):
    from launch.pretrain.pretrain_config import PretrainConfig

    parser = argparse.ArgumentParser()
    add_config_flags(parser, PretrainConfig)
    assert config_from_args(parser.parse_args(["--config", "tiny"]), PretrainConfig, preset=True).model.preset == "tiny"
    path = tmp_path / "c.yaml"
    path.write_text("seed: 7\n")
    assert config_from_args(parser.parse_args(["--config", str(path)]), PretrainConfig, preset=True).seed == 7
    assert config.load_config(PretrainConfig, path).seed == 7


# Every command with --config, and what else it needs to get as far as reading it.
COMMANDS = {
    "corpus": ["--input", "x", "--out", "o"],
    "pretrain": ["--data", "d", "--out", "o"],
    "finetune": ["--task", "sst2", "--data-dir", "d", "--checkpoint", "c", "--out", "o"],
    "sweep": ["--tasks", "sst2", "--data-dir", "d", "--checkpoint", "c", "--out", "o"],
    "features": ["--checkpoint", "c", "--input", "x", "--out", "o"],
}


@pytest.mark.parametrize("command", sorted(COMMANDS))
def test_every_command_names_config_when_it_is_missing(tmp_path, monkeypatch, capsys, command):
    monkeypatch.chdir(tmp_path)
    with pytest.raises(SystemExit) as stop:
        cli.main([command, "--config", "nonexist.yaml", *COMMANDS[command]])
    err = capsys.readouterr().err.strip().splitlines()
    assert stop.value.code == 2 and len(err) == 1, err
    assert err[0].startswith(f"bertpipe {command}: error: --config nonexist.yaml does not exist; pass a YAML file of ")
    assert ("or a preset name (tiny" in err[0]) == (command == "pretrain")


VOCAB = str(REPO / "data" / "vocab" / "bert-base-uncased-vocab.txt")


@pytest.mark.parametrize("choice", [["--vocab", VOCAB, "--train-vocab-size", "100"],
                                    ["--train-vocab-size", "100", "--vocab", VOCAB],
                                    ["--vocab", VOCAB, "train_vocab_size=100"]])  # the deprecated form too
def test_corpus_refuses_both_vocab_choices_on_the_command_line(tmp_path, monkeypatch, capsys, choice):
    import pipeline.corpus_job

    built = []
    monkeypatch.setattr(pipeline.corpus_job, "run", lambda cfg, beam_args: built.append(cfg))  # no Beam job
    book = tmp_path / "book.txt"
    book.write_text("Hello there. This is a book.\n")
    with pytest.raises(SystemExit) as stop:  # --train-vocab-size was dropped without a word, the vocab used
        cli.main(["corpus", "--input", str(book), *choice, "--out", str(tmp_path / "o")])
    assert not built
    err = capsys.readouterr().err.strip().splitlines()
    assert stop.value.code == 2 and err == [
        f"bertpipe corpus: error: --vocab {VOCAB} and --train-vocab-size 100 are both given; give one: --vocab for a "
        "BERT vocab.txt, --train-vocab-size to train one on the input"]


@pytest.mark.parametrize("in_file, flags, vocab, size", [
    ("train_vocab_size: 100\n", ["--vocab", VOCAB], VOCAB, None),  # a flag replaces the file's other choice
    (f"vocab: {VOCAB}\n", ["--train-vocab-size", "200"], None, 200),
    (f"vocab: {VOCAB}\n", ["train_vocab_size=200"], None, 200),
    ("train_vocab_size: 100\n", ["--vocab", "null"], None, 100),  # null is no choice
    (f"vocab: {VOCAB}\n", ["--vocab", VOCAB, "--train-vocab-size", "null"], VOCAB, None),
])
def test_corpus_vocab_flag_overrides_the_config_file_s_choice(tmp_path, in_file, flags, vocab, size):
    from launch.cli import corpus

    path = tmp_path / "c.yaml"
    path.write_text(in_file)
    args = cli.build_parser("corpus").parse_args(["--config", str(path), "--input", "x", "--out", "o", *flags])
    cfg = corpus._config_of(args)
    assert (cfg.vocab, cfg.train_vocab_size) == (vocab, size)
