"""Worker entry point: `deepspeed [--hostfile H] --module launch.pretrain ...`, `torchrun ... -m
launch.pretrain ...`, or started by `bertpipe pretrain --nproc N`. Same flags as `bertpipe pretrain`.

The flags (`add_arguments`) and how they become a `PretrainConfig` (`load_run_config`) live here, in
the library, so that the worker does not depend on the CLI layer; `launch.cli.pretrain` reuses them.
"""

from __future__ import annotations

import argparse
import contextlib
import logging
import os
import sys
from pathlib import Path
from typing import Any, Callable

from launch.config import load_yaml, missing_keys, preset_names, to_dict
from launch.config_flags import add_config_flags, config_from_args, out_dir, warn_deprecated
from launch.log import global_rank, setup_logging
from launch.pretrain.pretrain_config import PretrainConfig

log = logging.getLogger(__name__)

# Set while a process of ours holds the run dir's lock, for the worker processes it starts.
LOCK_HELD_ENV = "BERTPIPE_RUN_LOCK_HELD"

# Shortcuts kept from the first releases: the same flags as --schedule.total-steps / --checkpoint.save-every.
ALIASES = {"schedule.total_steps": ["--max-steps"], "checkpoint.save_every": ["--save-every"]}


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("overrides", nargs="*", metavar="KEY=VALUE", help=argparse.SUPPRESS)  # deprecated form
    parser.add_argument("--data", type=Path, required=True, help="corpus directory written by `bertpipe corpus`")
    parser.add_argument("--out", type=out_dir, required=True, help="run directory (checkpoints, metrics, configs)")
    parser.add_argument("--nproc", type=int, default=None,
                        help="local processes to start (default: the number of GPUs, or 1 on CPU); "
                             "ignored under deepspeed/torchrun, which set the world themselves")
    parser.add_argument("--resume", action="store_true",
                        help="continue from the newest checkpoint in --out that verifies (a damaged one is skipped; a "
                             "fresh start if there is none; refused if none is intact)")
    # The deepspeed launcher appends --local_rank (`deepspeed --no_python bertpipe pretrain ...` puts it before
    # the command name, from where launch.cli moves it here);
    # LOCAL_RANK in the environment is what we use.
    parser.add_argument("--local_rank", "--local-rank", type=int, default=None, help=argparse.SUPPRESS)
    add_config_flags(parser, PretrainConfig, aliases=ALIASES,
                     config_help=f"preset name ({', '.join(preset_names())}) or YAML file "
                     "(default with --resume: RUN/config.yaml); flags given here win")


def load_run_config(args: argparse.Namespace) -> PretrainConfig:
    """Defaults <- --config preset/YAML (or the run's saved config on --resume) <- flags."""
    config = args.config
    if config is None:
        saved = args.out / "config.yaml"
        if not (args.resume and saved.is_file()):
            raise ValueError(f"pass --config PRESET_OR_YAML (presets: {', '.join(preset_names())})")
        config = saved
    warn_deprecated("pretrain", args.overrides, PretrainConfig)
    cfg = config_from_args(args, PretrainConfig, legacy=args.overrides, preset=True, config_file=config)
    if args.config is None:  # RUN/config.yaml, which bertpipe writes whole: one that lacks keys was cut short
        missing = missing_keys(load_yaml(config), to_dict(PretrainConfig()))
        if missing:  # and its cut value (beta1: 0.9 -> 0), and the defaults for what went, would be the run's
            raise ValueError(
                f"{config} lacks {', '.join(missing[:3])}{' ...' if len(missing) > 3 else ''}, which bertpipe writes "
                "there: cut short (an interrupted copy of the run?) or written by an older bertpipe; restore it, or "
                "resume with --config and the run's flags (its settings: checkpoints/<tag>/bertpipe.json)")
    return cfg


@contextlib.contextmanager
def run_dir_lock(out: Path):
    """Hold RUN/.bertpipe.lock for this run: taken by global rank 0 unless a parent process of ours
    (`bertpipe pretrain --nproc N`) already holds it for the same directory."""
    from pipeline.output_lock import OutputLock

    key = str(Path(out).resolve())
    if global_rank() != 0 or os.environ.get(LOCK_HELD_ENV) == key:
        yield
        return
    with OutputLock(out, "pretrain"):
        previous = os.environ.get(LOCK_HELD_ENV)
        os.environ[LOCK_HELD_ENV] = key  # inherited by the workers this process starts
        try:
            yield
        finally:
            if previous is None:
                os.environ.pop(LOCK_HELD_ENV, None)
            else:
                os.environ[LOCK_HELD_ENV] = previous


def build_trainer(args: argparse.Namespace):
    from launch.pretrain.trainer import Trainer

    return Trainer(load_run_config(args), data_dir=args.data, run_dir=args.out, resume=args.resume)


def leave_process_group() -> None:
    """Leave the process group once every rank is done: after training, or on an error every rank agreed
    on (an exit with the group still open can abort in its communication thread, and NCCL warns that it
    "can leak resources"). Not on one rank's own error: the others may still be inside a collective."""
    import torch.distributed as dist

    if dist.is_initialized():
        dist.destroy_process_group()


def leave_if_alone() -> None:
    """Leave a group of this process alone, whatever ended the run (its own error too: no other rank can be
    inside a collective with it). A lone run that exited with its gloo group open was seen to abort after
    its one-line error ("terminate called without an active exception", exit -6 instead of 2)."""
    import torch.distributed as dist

    if dist.is_initialized() and dist.get_world_size() == 1:
        dist.destroy_process_group()


def in_group_with_peers() -> bool:
    # Never imports torch: after a Ctrl-C cut its import short, importing it again fails ("Only a single
    # TORCH_LIBRARY can be used to register the namespace prims").
    dist = sys.modules.get("torch.distributed")
    is_initialized = getattr(dist, "is_initialized", None)  # absent: never imported, or cut short (no group)
    return bool(is_initialized and is_initialized() and dist.get_world_size() > 1)


def exit_if_in_group(code: int, message: str | None = None) -> None:
    """End the process with `code` (after `message`, to stderr) at once if it still belongs to a group with
    peers, or return. A rank stopped by its own error cannot leave its group (the others may be inside a
    collective), and the interpreter's shutdown with gloo's threads alive can abort it (SIGABRT, "terminate
    called without an active exception": exit 134 in place of `code`; seen in CI; pytorch PR 179291). Its
    output is flushed first; nothing else is lost (a checkpoint is complete on disk or not yet referenced)."""
    if not in_group_with_peers():
        return
    if message is not None:
        print(message, file=sys.stderr)
    logging.shutdown()  # flushes the log handlers
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(OSError, ValueError):  # a closed or broken pipe: nothing more to say
            stream.flush()
    os._exit(code)


ASK_STORE_S = 10.0  # how long a failing rank waits for the group's store before it reports anyway

# How gloo says that the other end of a collective is gone (NCCL's watchdog raises a DistError).
PEER_GONE = ("Connection closed by peer", "Connection reset by peer")


def lost_peer_message(err: BaseException) -> str | None:
    """One line for a collective that failed because another rank stopped (killed, crashed, failed), or
    None for anything else: the traceback would be about this rank, not the cause, which that rank or
    the launcher reports. The error may come wrapped (raised from it) by the code that ran the collective."""
    import torch.distributed as dist

    from launch.errors import exception_chain

    for seen in exception_chain(err):
        text = str(seen).strip()
        if isinstance(seen, dist.DistError) or isinstance(seen, RuntimeError) and any(s in text for s in PEER_GONE):
            first = (text.splitlines() or [type(seen).__name__])[0].split(". ")[0]
            return (f"rank {global_rank()}: a collective with the other ranks failed ({first}); another rank stopped, "
                    "and its own message or the launcher's says why")
    return None


def train_and_report(make_trainer: Callable[[], Any], report: Callable[[str], None]) -> int:
    """Set up and train, then end as every rank must: a user error (exit 2) or a diverged run said through
    `report` (a log line for a launched worker, `bertpipe pretrain: error:` for the CLI), rank 0 alone saying
    what every rank stopped with, and the group left wherever all ranks agree. Faults propagate."""
    from launch.errors import CliError, raised_by_bertpipe
    from launch.pretrain.fast_step import DIVERGED_EXIT, NonFiniteLossError
    from launch.pretrain.process_group import ReportedByRankZero, StoppedTogether

    try:
        trainer = make_trainer()
        trainer.setup()
        rc = trainer.train()
        leave_process_group()
        return rc
    except ReportedByRankZero:  # rank 0 says it, once
        leave_process_group()
        return 2
    except (ValueError, CliError) as err:  # a user error: the message says what to change
        if not (isinstance(err, CliError) or raised_by_bertpipe(err)):
            raise  # a library's own ValueError: a fault (exit 1, retried under Kubernetes), with its traceback
        report(str(err))
        if isinstance(err, StoppedTogether):  # every rank stops with it
            leave_process_group()
        return 2
    except NonFiniteLossError as err:
        report(str(err))
        return DIVERGED_EXIT
    finally:
        leave_if_alone()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="launch.pretrain", description=__doc__)
    add_arguments(parser)
    args = parser.parse_args(argv)
    setup_logging()  # before DeepSpeed is imported (below): what it logs at import goes through our filter
    from pipeline.output_lock import OutputLocked

    try:
        with run_dir_lock(args.out):
            return train_and_report(lambda: build_trainer(args), lambda message: log.error("%s", message))
    except OutputLocked as err:  # rank 0, before any group: a second writer, or --out a file
        log.error("%s", err)
        return 2
    except Exception as err:  # noqa: BLE001 - a full disk or a lost peer becomes one line; anything else re-raises
        code = report_fault(err, args.out)
        if code is None:
            raise
        return code


def first_to_report(what: str) -> bool:
    """True for the first rank of the group to report `what`, so that a fault every rank meets is said
    once, and one that a single rank meets (any rank) is still said. The ranks count in the group's
    key-value store, which answers after a failed collective; without one to ask, every rank reports."""
    import threading

    import torch.distributed as dist

    if not dist.is_initialized():
        return True
    answer: list[int] = []

    def ask() -> None:
        try:
            store = dist.distributed_c10d._get_default_store()  # the store the group was made with
            answer.append(store.add(f"bertpipe/reported/{what}", 1))
        except Exception:  # noqa: BLE001 - its host (the agent, or rank 0) is gone: no answer
            pass

    # A store whose host stopped answering without closing the connection blocks `add` past any
    # set_timeout; this rank is on its way out and must not hang there.
    asking = threading.Thread(target=ask, daemon=True)
    asking.start()
    asking.join(ASK_STORE_S)
    return not answer or answer[0] == 1  # no answer: a second line is better than none


def report_fault(err: BaseException, out: Path) -> int | None:
    """Log a lost peer or a full disk in one line and return the exit code, or None for anything else."""
    from launch.errors import disk_full_message
    from launch.pretrain.launcher import PEER_STOPPED_EXIT

    lost = lost_peer_message(err)
    if lost is not None:
        log.error("%s", lost)
        return PEER_STOPPED_EXIT
    message = disk_full_message(err, out)
    if message is None:
        return None
    # Any rank may be the one whose file did not fit (each writes its own optimizer shard), or all may.
    if first_to_report("disk-full"):
        log.error("%s (add --resume: the last complete checkpoint is kept)", message)
    return 1


if __name__ == "__main__":
    sys.exit(main())
