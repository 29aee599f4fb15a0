"""One logging path for every stage: `get_logger(__name__)`, gated on rank 0 in one place.

Libraries (`pipeline/`, `model/`) use the standard `logging.getLogger(__name__)` and never configure
handlers; entry points call `setup_logging()` once. Under a distributed launcher only global rank 0
logs at INFO; other ranks log warnings and errors, prefixed with their rank.
"""

from __future__ import annotations

import logging
import os
import sys
import threading

from launch.errors import WRITE_LIMITS


def global_rank() -> int:
    # torchrun and the deepspeed launcher set RANK; under mpirun only Open MPI's / PMI's own variables exist.
    for name in ("RANK", "OMPI_COMM_WORLD_RANK", "PMI_RANK"):
        if name in os.environ:
            return int(os.environ[name])
    return 0


def launcher_world_size() -> int | None:
    """The world size a launcher started this process in (torchrun / deepspeed: RANK and WORLD_SIZE;
    mpirun: Open MPI's or PMI's own), or None when no launcher did."""
    if "RANK" in os.environ and "WORLD_SIZE" in os.environ:
        return int(os.environ["WORLD_SIZE"])
    for name in ("OMPI_COMM_WORLD_SIZE", "PMI_SIZE"):
        if name in os.environ:
            return int(os.environ[name])
    return None


def is_rank_zero() -> bool:
    return global_rank() == 0


class _DropKnownNoise(logging.Filter):
    """Drops import-time warnings of optional cloud extras we do not use (Beam's GCP/BigQuery clients),
    and the tracebacks Beam logs for a Ctrl-C or a write that did not fit (a full disk, a quota, a file-size
    limit) inside a DoFn (the CLI reports those in one line)."""

    NOISE = ("apitools not found",)

    def filter(self, record: logging.LogRecord) -> bool:
        if record.exc_info and isinstance(record.exc_info[1], KeyboardInterrupt):
            return False
        message = str(record.msg)
        # Beam logs a failing DoFn with its traceback before re-raising; for these two the CLI says it in one line.
        return not message.startswith(self.NOISE) and not any(
            f"{what} [while running" in message for what in ("KeyboardInterrupt", *WRITE_LIMITS.values()))


class _DropDeepSpeedNoise(logging.Filter):
    """DeepSpeed's warnings that do not apply to a bertpipe run: on a machine without GPUs it warns that it
    found none (our trainer's first line says CPU or GPU), and it calls every optimizer but its own
    "untested" under ZeRO (ours, AdamW and LAMB, are tested there: tests/launch/pretrain/test_lamb_zero.py)."""

    NOISE = ("Setting accelerator to CPU.", "**** You are using ZeRO with an untested optimizer")

    def filter(self, record: logging.LogRecord) -> bool:
        return not str(record.msg).startswith(self.NOISE)


_DEEPSPEED_NOISE = _DropDeepSpeedNoise()


class _StderrHandler(logging.StreamHandler):
    """Writes to sys.stderr as it is at each record, not as it was at setup: a caller in the same process
    may swap it (pytest's capture does, then closes the one it swapped out, which a handler holding it
    would write into: "I/O operation on closed file")."""

    @property
    def stream(self):
        return sys.stderr

    @stream.setter
    def stream(self, _value) -> None:  # StreamHandler.__init__ sets it
        pass


def setup_logging(level: int = logging.INFO) -> None:
    rank = global_rank()
    prefix = "" if rank == 0 else f"[rank{rank}] "
    handler = _StderrHandler()
    handler.setFormatter(logging.Formatter(f"%(asctime)s {prefix}%(levelname)s %(name)s: %(message)s", "%H:%M:%S"))
    handler.addFilter(_DropKnownNoise())
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(level if rank == 0 else max(level, logging.WARNING))
    # DeepSpeed's logger has its own handler and does not propagate to ours; a filter on the logger itself
    # holds for the records it logs as it is imported, if this runs first (it is made on first use by either).
    logging.getLogger("DeepSpeed").addFilter(_DEEPSPEED_NOISE)  # one instance: a second setup adds nothing
    # Third-party loggers that are chatty at INFO on every rank.
    for noisy in ("DeepSpeed", "deepspeed", "torch.distributed", "apache_beam", "ray"):
        logging.getLogger(noisy).setLevel(max(level, logging.WARNING))
    # Beam announces at import that GCS support is not installed; a gs:// input says so itself.
    logging.getLogger("apache_beam.io.filesystems").setLevel(max(level, logging.ERROR))
    global _previous_thread_hook
    if threading.excepthook is not _write_limit_in_a_thread:  # a second setup must not wrap it twice
        _previous_thread_hook, threading.excepthook = threading.excepthook, _write_limit_in_a_thread


_previous_thread_hook = threading.excepthook


def _write_limit_in_a_thread(args: threading.ExceptHookArgs) -> None:
    """A write that did not fit, met by a library's own writer thread (TensorBoard's event writer on a full
    disk): one warning line naming the file, not the thread's traceback (what the run does then, it says
    itself). Anything else goes to the hook that was there before."""
    from launch.errors import disk_full_message

    said = disk_full_message(args.exc_value, "its output") if args.exc_value is not None else None
    if said is None:
        _previous_thread_hook(args)
        return
    import traceback

    files = [frame.filename for frame in traceback.extract_tb(args.exc_traceback)]
    packages = [f.split("-packages/")[1].split("/")[0] for f in files if "-packages/" in f]
    thread = f"{packages[-1]}'s writer thread" if packages else f"thread {args.thread.name if args.thread else '?'}"
    logging.getLogger(__name__).warning("%s stopped: %s", thread, said.split("; ")[0])


def get_logger(name: str) -> logging.Logger:
    return logging.getLogger(name)
