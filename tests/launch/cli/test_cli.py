"""The `bertpipe` entry point: every registered command exists and documents its flags."""

from __future__ import annotations

import subprocess
import sys

import pytest

from launch import cli


def test_top_level_help_lists_every_command(capsys):
    assert cli.main(["--help"]) == 0
    out = capsys.readouterr().out
    for name in cli.COMMANDS:
        assert name in out


def test_no_command_prints_the_commands_and_fails(capsys):
    # A script that lost its argument must not pass as a run that did its work.
    assert cli.main([]) == 2
    out = capsys.readouterr().out
    assert all(name in out for name in cli.COMMANDS)


def test_unknown_command_is_a_clear_error(capsys):
    assert cli.main(["pretrian"]) == 2
    assert "unknown command 'pretrian'" in capsys.readouterr().err


@pytest.mark.parametrize("command", sorted(cli.COMMANDS))
def test_each_command_has_help(command):
    parser = cli.build_parser(command)
    text = parser.format_help()
    assert text.startswith(f"usage: bertpipe {command}")


def test_console_script_runs():
    result = subprocess.run([sys.executable, "-m", "launch.cli", "--help"], capture_output=True, text=True)
    assert result.returncode == 0 and "corpus" in result.stdout


def test_pretrain_takes_the_local_rank_the_deepspeed_launcher_appends():
    # `deepspeed --no_python bertpipe pretrain ...` appends --local_rank=N; the CLI refused it as unrecognised
    parser = cli.build_parser("pretrain")
    for flag in ("--local_rank=3", "--local-rank=3"):
        args = parser.parse_args(["--config", "tiny", "--data", "CORPUS", "--out", "RUN", flag])
        assert args.local_rank == 3
    assert "local_rank" not in parser.format_help()


def test_sweep_offers_no_finetune_flag_it_would_ignore():
    # --save-model/--progress were listed (save-model "default: true") but every trial ran without them
    parser = cli.build_parser("sweep")
    flags = {s for a in parser._actions for s in a.option_strings}
    assert "--save-models" in flags and not flags & {"--save-model", "--no-save-model", "--progress", "--no-progress"}
