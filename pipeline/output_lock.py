"""One writer per output directory: an exclusive lock file holding the writer's pid and host; and
never a write over a file in it that bertpipe did not write (`refuse_others_files`, `mark_output`).

`corpus`, `pretrain`, `finetune` and `sweep` hold `OUT/.bertpipe.lock` while they write `OUT`. A second
command on the same `OUT` is refused with a message naming the holder. A lock left by a process that
died (same host, pid gone) is taken over with a warning; a lock from another host cannot be checked
and is refused, with the way out in the message. The lock is created with O_EXCL, so two commands
starting at the same moment cannot both get it; only local directories are locked (object stores
have no such primitive; the engines' own job ids keep those apart).
"""

from __future__ import annotations

import json
import logging
import os
import socket
import sys
import time
from pathlib import Path
from typing import Iterable

log = logging.getLogger(__name__)

LOCK_NAME = ".bertpipe.lock"


class OutputLocked(ValueError):
    """Another live process writes this output directory (a user error: the message says what to do)."""


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # exists, owned by someone else
        return True
    return True


class OutputLock:
    """`with OutputLock(out, "corpus"):` holds `out/.bertpipe.lock` for the duration (re-entrant per pid)."""

    def __init__(self, out: str | os.PathLike, command: str):
        self.out = Path(out)
        self.path = self.out / LOCK_NAME
        self.command = command
        self._owned = False
        self._created = False

    def acquire(self) -> "OutputLock":
        if "://" in str(self.out):
            return self
        if self.out.exists() and not self.out.is_dir():
            raise ValueError(f"--out {self.out} is a file; pass a directory")
        # A directory we create only to hold the lock is removed again if the command leaves it empty
        # (a refused command must not leave an empty output folder behind).
        self._created = not self.out.exists()
        self.out.mkdir(parents=True, exist_ok=True)
        record = {"pid": os.getpid(), "host": socket.gethostname(), "command": self.command,
                  "argv": sys.argv[1:], "since": time.strftime("%Y-%m-%d %H:%M:%S")}
        for _ in range(3):
            try:
                fd = os.open(self.path, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o644)
            except FileExistsError:
                holder = self._holder()
                if holder.get("pid") == os.getpid() and holder.get("host") == socket.gethostname():
                    return self  # this process already holds it (e.g. the CLI around a library call)
                if self._stale(holder):
                    log.warning("taking over the lock %s of %s (pid %s, which is no longer running)",
                                self.path, holder.get("command", "?"), holder.get("pid", "?"))
                    self.path.unlink(missing_ok=True)
                    continue
                raise OutputLocked(self._refusal(holder)) from None
            with os.fdopen(fd, "w") as f:
                json.dump(record, f)
            self._owned = True
            return self
        raise OutputLocked(f"could not take the lock {self.path} (another process keeps recreating it)")

    def release(self) -> None:
        if self._owned:
            holder = self._holder()
            if holder.get("pid") == os.getpid():
                self.path.unlink(missing_ok=True)
            self._owned = False
            if self._created:
                try:
                    self.out.rmdir()  # only succeeds if empty: nothing but our lock was ever there
                except OSError:
                    pass

    def __enter__(self) -> "OutputLock":
        return self.acquire()

    def __exit__(self, *exc) -> None:
        self.release()

    def _holder(self) -> dict:
        try:
            data = json.loads(self.path.read_text(encoding="utf-8"))
            return data if isinstance(data, dict) else {}
        except (OSError, ValueError):
            return {}  # half-written by a process that died between create and write

    def _stale(self, holder: dict) -> bool:
        if not holder:
            # Unreadable: stale only if old (a writer fills it within microseconds of creating it).
            try:
                return time.time() - self.path.stat().st_mtime > 10
            except OSError:
                return True
        return holder.get("host") == socket.gethostname() and not _pid_alive(int(holder.get("pid", -1)))

    def _refusal(self, holder: dict) -> str:
        who = f"`bertpipe {holder.get('command', '?')}` (pid {holder.get('pid', '?')} on {holder.get('host', '?')}, " \
              f"since {holder.get('since', '?')})"
        hint = ("wait for it to finish or use another --out" if holder.get("host") == socket.gethostname()
                else f"if that process is gone, delete {self.path}")
        return f"{self.out} is being written by {who}; {hint}"


def refuse_others_files(out: Path, names: Iterable[str], marker: str, command: str, ours: bool = False) -> None:
    """Refuse to write `names` into `out` where some of them already exist and nothing proves that an
    earlier `bertpipe command` wrote them: its `marker` file in `out`, or `ours` (a proof the caller has,
    such as a run directory's verified checkpoints)."""
    if ours or "://" in str(out) or not out.is_dir() or (out / marker).is_file():
        return
    clash = sorted(name for name in names if (out / name).exists())
    if clash:
        raise ValueError(f"--out {out} holds {', '.join(clash)}, which `bertpipe {command}` did not write "
                         f"(no {marker}) and would overwrite; choose a new or empty --out")


def mark_output(out: Path, marker: str, command: str) -> None:
    """Create `out` with the `marker` that lets later runs of `command` rewrite their own files there."""
    out.mkdir(parents=True, exist_ok=True)
    if not (out / marker).is_file():
        (out / marker).write_text(f"written by `bertpipe {command}`, which may rewrite its own files here\n")
