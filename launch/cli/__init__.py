"""`bertpipe`: one console script, one subcommand per stage.

Each subcommand lives in its own module under `launch/cli/` exposing
`add_arguments(parser)` and `run(args) -> int`. Modules are imported only when their
subcommand is used, so `bertpipe corpus` does not pay for importing torch or ray.
"""

from __future__ import annotations

import argparse
import errno
import importlib
import os
import signal
import sys
import threading
import time
from typing import Sequence

from launch.errors import CliError, Terminated, disk_full_message, how_stopped, set_stopped_line
from launch.log import setup_logging

# name -> (module, one-line help). Order is the order of the pipeline.
COMMANDS: dict[str, tuple[str, str]] = {
    "download": ("launch.cli.download", "fetch Wikipedia dumps and public-domain books"),
    "corpus": ("launch.cli.corpus", "build a sharded, masked, NSP-paired Arrow corpus (Apache Beam)"),
    "pretrain": ("launch.cli.pretrain", "pre-train BERT with DeepSpeed ZeRO over a corpus"),
    "export": ("launch.cli.export", "write a run's checkpoint as a Hugging Face model directory"),
    "features": ("launch.cli.features", "extract contextual features (the paper's feature-based approach)"),
    "finetune": ("launch.cli.finetune", "fine-tune a checkpoint on GLUE, SQuAD, NER, SWAG or your own data"),
    "sweep": ("launch.cli.sweep", "run a Ray Tune sweep of fine-tuning jobs over a grid"),
    "demo": ("launch.cli.demo", "run the whole pipeline on the bundled real data, on CPU"),
}


def build_parser(command: str) -> argparse.ArgumentParser:
    """The argparse parser of one subcommand (also used by tests that check k8s manifests' commands)."""
    module_name, help_text = COMMANDS[command]
    module = importlib.import_module(module_name)
    parser = argparse.ArgumentParser(
        prog=f"bertpipe {command}",
        # Commands with a config tree have dozens of flags; their docstring shows the usage instead.
        usage=getattr(module, "USAGE", None),
        description=(module.__doc__ or help_text).strip(),
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    module.add_arguments(parser)
    return parser


def _top_level_help() -> str:
    width = max(len(name) for name in COMMANDS)
    lines = ["usage: bertpipe <command> [options]   (bertpipe <command> --help for each)", "", "commands:"]
    lines += [f"  {name:<{width}}  {help_text}" for name, (_, help_text) in COMMANDS.items()]
    return "\n".join(lines)


# After a Ctrl-C, how long the interpreter's shutdown (joining library threads, atexit handlers) may take.
EXIT_GRACE_S = 20


def _end_within(seconds: float, command: str, code: int) -> None:
    """Make sure the process ends soon after an interrupt.

    After the interrupted message, shutdown still joins every non-daemon thread and runs atexit
    handlers; a library thread blocked on a service that the interrupt already stopped would hold
    the exit forever. A sweep's driver, its local Ray already stopped, once hung there in CI (about
    1 run in 20; the cause was not identified). A daemon timer ends the process with `code` if
    shutdown is still running after `seconds`, and says what it was waiting for."""
    def end() -> None:
        time.sleep(seconds)
        waiting = sorted(t.name for t in threading.enumerate()
                         if not t.daemon and t is not threading.main_thread())
        print(f"bertpipe {command}: still exiting after {seconds:.0f} s (waiting on threads: "
              f"{', '.join(waiting) or 'none; atexit handlers'}); ended the process", file=sys.stderr, flush=True)
        sys.stdout.flush()  # os._exit skips the interpreter's own flush
        os._exit(code)

    threading.Thread(target=end, name="bertpipe-exit-timer", daemon=True).start()


def _on_out(err: BaseException, out: object, codes: tuple[int, ...], beside: bool = True) -> bool:
    """Whether `err` is an OSError of one of `codes` on a path in --out or on a folder above it, or (`beside`)
    beside it (an output renamed into place when whole is locked by a `.OUT.bertpipe.lock` beside
    it: `pipeline.output_lock.lock_beside`)."""
    if not (out and isinstance(err, OSError) and err.errno in codes and err.filename):
        return False
    target, path = os.path.abspath(str(out)), os.path.abspath(str(err.filename))
    inside = path == target or path.startswith(os.path.join(target, "")) or target.startswith(os.path.join(path, ""))
    return inside or beside and os.path.dirname(target) == os.path.dirname(path)


def _unwritable_out(err: BaseException, out: object) -> str | None:
    """"Read-only file system: PATH" (or permission denied) when `err` is that, on --out (`_on_out`)."""
    if not _on_out(err, out, (errno.EACCES, errno.EPERM, errno.EROFS)):
        return None
    return f"{err.strerror}: {err.filename}"


def _stop_on_sigterm(children: bool = False) -> None:
    """SIGTERM stops a command as Ctrl-C does: its cleanup runs, one line says how to go on, exit 143.
    Without a handler it died at once, silently, mid-write; and as a container's PID 1 (the corpus and
    download Jobs run `bertpipe` without an init) the kernel ignored it until the grace period's SIGKILL.
    `children`: the SIGTERM is passed on first to the Beam worker processes this one started
    (`launch.stop_children`), each time one comes. Commands that act on SIGTERM themselves (pretrain's checkpoint, the sweep's Ray
    driver) set their own handler over this one while they run."""
    if threading.current_thread() is threading.main_thread() and signal.getsignal(signal.SIGTERM) is signal.SIG_DFL:
        from launch.stop_children import stop_children  # imported now, not inside the handler

        def stop(_signum: int, _frame: object) -> None:
            if children:
                stop_children()
            raise Terminated
        signal.signal(signal.SIGTERM, stop)


def _local_rank_after_command(argv: list[str]) -> list[str]:
    """`deepspeed --no_python bertpipe pretrain ...` starts `bertpipe --local_rank=N pretrain ...`: the launcher
    puts its flag straight after the program, where the command's name belongs. It is moved after the name, for
    the command's parser (which takes it and ignores it: LOCAL_RANK in the environment is what is used)."""
    first = argv[0] if argv else ""
    if first.startswith(("--local_rank=", "--local-rank=")):
        lead = 1
    elif first in ("--local_rank", "--local-rank"):
        lead = 2
    else:
        return argv
    return [*argv[lead:lead + 1], *argv[:lead], *argv[lead + 1:]]


def main(argv: Sequence[str] | None = None) -> int:
    """Run one subcommand. `argv` None: this is the process's entry point (the console script,
    `python -m launch.cli`), which may bound its own exit after Ctrl-C; tests pass `argv`."""
    entry_point = argv is None
    argv = _local_rank_after_command(list(sys.argv[1:] if argv is None else argv))
    if not argv or argv[0] in ("-h", "--help"):
        print(_top_level_help())
        return 0 if argv else 2
    command, rest = argv[0], argv[1:]
    if command not in COMMANDS:
        print(f"bertpipe: error: unknown command {command!r}\n\n{_top_level_help()}", file=sys.stderr)
        return 2
    # Before the parser is built: building it imports the command's config (and, for corpus, Beam).
    setup_logging()
    if entry_point:
        from launch.stop_children import SIGTERM_REACHES_CHILDREN

        _stop_on_sigterm(children=command in SIGTERM_REACHES_CHILDREN)
    try:
        parser = build_parser(command)
        args = parser.parse_args(rest)
        module = importlib.import_module(COMMANDS[command][0])
    except KeyboardInterrupt as err:  # during the imports, before anything was written
        code, how = how_stopped(err)
        print(f"bertpipe {command}: {how} before it started", file=sys.stderr, flush=True)
        if entry_point:
            _end_within(EXIT_GRACE_S, command, code)
        return code
    hint = getattr(module, "ON_INTERRUPT", "run the same command again to start over")
    if entry_point:
        set_stopped_line(f"bertpipe {command}: {{how}}; {hint}")
    try:
        return int(module.run(args) or 0)
    except CliError as err:
        parser.exit(2, f"bertpipe {command}: error: {err}\n")
    except Exception as err:  # noqa: BLE001 - only a full disk is turned into a message; the rest re-raises
        out = getattr(args, "out", None) or vars(args).get("cfg:out")
        message = disk_full_message(err, out)
        if message is None and out and (isinstance(err, (FileExistsError, NotADirectoryError)) or _on_out(
                err, out, (errno.ENAMETOOLONG, errno.ENOENT), beside=False)):
            # e.g. a parent of --out is a file, its name is too long, or it is under /proc: mkdir fails there
            parser.exit(2, f"bertpipe {command}: error: cannot create --out {out}: {err.strerror}: "
                           f"{err.filename}; choose another --out\n")
        unwritable = _unwritable_out(err, out)
        if message is None and unwritable:
            parser.exit(2, f"bertpipe {command}: error: cannot write --out {out}: {unwritable}; choose another "
                           "--out or make it writable\n")
        if message is None:
            raise
        hint = getattr(module, "ON_DISK_FULL", "")
        parser.exit(1, f"bertpipe {command}: error: {message}{hint}\n")
    except KeyboardInterrupt as err:
        # One line, and how to continue: the command's partial output is left recognisably unfinished.
        code, how = how_stopped(err)  # 143: SIGTERM (`Terminated`, set by `_stop_on_sigterm` or a command)
        print(f"bertpipe {command}: {how}; {hint}", file=sys.stderr, flush=True)
        if entry_point:
            _end_within(EXIT_GRACE_S, command, code)
        return code

