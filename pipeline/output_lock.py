"""One writer per output directory: an exclusive lock file holding the writer's pid and host; and
never a write over a file in it that bertpipe did not write (`refuse_others_files`, `mark_output`).

`corpus`, `pretrain`, `finetune` and `sweep` hold `OUT/.bertpipe.lock` while they write `OUT`; `export`,
whose `OUT` appears whole by a rename, and `features`, whose `OUT` is the stem of its files' names, hold
`.OUT.bertpipe.lock` beside it, named from its real path (a link to `OUT` takes the same lock). A second
command on the same `OUT` is refused with a message naming the holder. A lock left by a process that
died (same host, pid gone, or the pid now another process's: a restarted container reuses pids) is
taken over with a warning (renamed aside and deleted only if it is still the file judged: of two
processes taking over one stale lock at once, the second does not delete the first's new lock). The holder also refreshes the lock file's modification time every
HEARTBEAT_S seconds (a lease): a lock from another host, whose pid cannot be checked (a restarted
Kubernetes pod, a new Ray head), is taken over once no refresh is seen for LEASE_S seconds, and
refused as soon as one is. A lock file without a heartbeat (an older bertpipe) from another host is
refused, with the way out in the message. The lock is created with O_EXCL, so two commands starting at the
same moment cannot both get it; only local or mounted directories are locked (object stores have no
such primitive; the engines' own job ids keep those apart).
"""

from __future__ import annotations

import errno
import json
import logging
import os
import socket
import sys
import threading
import time
from pathlib import Path
from typing import Iterable

from pipeline.atomic_write import write_text_atomic

log = logging.getLogger(__name__)

LOCK_NAME = ".bertpipe.lock"
HEARTBEAT_S = 15.0  # the holder refreshes the lock file's modification time this often
LEASE_S = 60.0  # without a refresh for this long (watched for at least 2 heartbeats), the holder is gone


def lock_beside(out: str | os.PathLike, stem: bool = False) -> Path:
    """The lock of an output that must not exist until it is whole (renamed into place): `.OUT.bertpipe.lock`
    beside it, for `OutputLock(out, command, lock_file=lock_beside(out))`. Named from the real path, so every
    spelling of one output (a link to it or to a folder above it, `..`) takes the one lock. `stem`: `out`
    names files `OUT.*` (not itself written), so only the folder it is in is resolved."""
    out = Path(out)
    real = Path(os.path.realpath(out.parent)) / out.name if stem else Path(os.path.realpath(out))
    return real.parent / f".{real.name}.bertpipe.lock"


class OutputLocked(ValueError):
    """Another live process writes this output, or an output directory held by its own lock is a file (a
    user error: the message says what to do)."""


class LockUnwritable(OSError):
    """The lock beside an output cannot be written (a read-only or another user's folder, maybe the one a link
    as --out leads to, not the link's); its str() is the one line for the user."""

    def __init__(self, out: Path, err: OSError):
        super().__init__(err.errno, err.strerror, err.filename)
        self.out = out

    def __str__(self) -> str:
        return f"cannot write --out {self.out}: {self.strerror}: {self.filename}; choose another --out or make it writable"


def _start_time(pid: int) -> str | None:
    """When `pid` started (clock ticks since boot, Linux's /proc), to tell a reused pid from its holder."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
        return stat[stat.rindex(")") + 2:].split()[19]
    except (OSError, ValueError, IndexError):
        return None


def pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # exists, owned by someone else
        return True
    return True


class OutputLock:
    """`with OutputLock(out, "corpus"):` holds `out/.bertpipe.lock` for the duration (re-entrant per pid).

    `lock_file`: hold this file instead, for an `out` that must not exist until it is complete (an
    export is renamed into place whole) or that names files (features), e.g. `lock_beside(out)`; then
    what `out` may be is for the command to judge."""

    def __init__(self, out: str | os.PathLike, command: str, lock_file: str | os.PathLike | None = None):
        # A remote --out (gs://, s3://) is not locked here (object stores have no exclusive create): checked
        # on the text, as Path("gs://b/x") is the local "gs:/b/x", which acquire would have created.
        self.remote = "://" in str(out)
        self.out = Path(out)
        self.beside = lock_file is not None
        self.path = Path(lock_file) if self.beside else self.out / LOCK_NAME
        self.command = command
        self._owned = False
        self._created = False
        self._stop_heartbeat = threading.Event()

    def acquire(self) -> "OutputLock":
        if self.remote:
            return self
        # A lock beside `out` (`lock_file`) leaves judging `out` to its command: features' --out is a stem.
        if not self.beside and self.out.exists() and not self.out.is_dir():
            raise OutputLocked(f"--out {self.out} is a file; pass a directory")
        # A directory we create only to hold the lock is removed again if the command leaves it empty
        # (a refused command must not leave an empty output folder behind).
        self._created = not self.path.parent.exists()
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
        except OSError as err:
            raise self._unwritable(err) from None
        record = {"pid": os.getpid(), "host": socket.gethostname(), "command": self.command,
                  "argv": sys.argv[1:], "since": time.strftime("%Y-%m-%d %H:%M:%S"), "heartbeat_s": HEARTBEAT_S,
                  "pid_start": _start_time(os.getpid())}
        for _ in range(3):
            try:
                fd = os.open(self.path, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o644)
            except FileExistsError:
                seen = self._identity()
                holder = self._holder()
                if (holder.get("pid") == os.getpid() and holder.get("host") == socket.gethostname()
                        and holder.get("pid_start") in (None, record["pid_start"])):
                    # This process already holds it (e.g. the CLI around a library call). Not a predecessor that
                    # had our pid: a container restarted in place keeps its hostname and starts pids afresh.
                    return self
                if self._stale(holder):
                    log.warning("taking over the lock %s of %s (pid %s, which is no longer running or is another process now)",
                                self.path, holder.get("command", "?"), holder.get("pid", "?"))
                    self._remove_if_still(seen)
                    continue
                if self._lease_expired(holder):
                    log.warning("taking over the lock %s of %s (pid %s on %s): not refreshed for %.0f s, its holder is gone",
                                self.path, holder.get("command", "?"), holder.get("pid", "?"), holder.get("host", "?"),
                                LEASE_S)
                    self._remove_if_still(seen)
                    continue
                raise OutputLocked(self._refusal(holder)) from None
            except OSError as err:
                raise self._unwritable(err) from None
            with os.fdopen(fd, "w") as f:
                json.dump(record, f)
            self._owned = True
            threading.Thread(target=self._heartbeat, name="bertpipe-lock-heartbeat", daemon=True).start()
            return self
        raise OutputLocked(f"could not take the lock {self.path} (another process keeps recreating it)")

    def _unwritable(self, err: OSError) -> OSError:
        """`err` of creating the lock; `LockUnwritable` where that is a lock beside --out the user may not write."""
        if self.beside and err.errno in (errno.EACCES, errno.EPERM, errno.EROFS):
            return LockUnwritable(self.out, err)
        return err

    def _identity(self) -> tuple | None:
        """Which lock file is there now: inode, modification time and bytes (an inode number alone
        can be reused at once by the next file created)."""
        try:
            st = self.path.stat()
            return st.st_ino, st.st_mtime_ns, self.path.read_bytes()
        except OSError:
            return None

    def _remove_if_still(self, seen: tuple | None) -> None:
        """Remove the lock file judged stale, and only it. Two processes can judge the same stale lock at
        once; the first removes it and creates its own, which a plain unlink by the second would then
        remove (both would write). So the file is first renamed aside, atomically, and deleted only if it
        is the one judged; else it is put back where it was."""
        aside = self.path.with_name(f"{self.path.name}.{os.getpid()}.{threading.get_ident()}.stale")
        try:
            os.rename(self.path, aside)
        except FileNotFoundError:
            return  # the other process removed it first; creating ours decides between us
        try:
            st = aside.stat()
            still = seen is not None and (st.st_ino, st.st_mtime_ns, aside.read_bytes()) == seen
        except OSError:
            still = False
        if not still:
            try:
                os.link(aside, self.path)  # put back; fails only if a third process created one meanwhile
            except FileExistsError:
                pass
            except OSError:  # a filesystem without hard links
                os.rename(aside, self.path)
                return
        aside.unlink(missing_ok=True)

    def _heartbeat(self) -> None:
        while not self._stop_heartbeat.wait(HEARTBEAT_S):
            try:
                os.utime(self.path)
            except OSError:
                pass  # the directory went away: nothing left to hold

    def _lease_expired(self, holder: dict) -> bool:
        """For a holder that keeps a heartbeat: watch the lock file; a refresh proves it alive (False);
        none for LEASE_S (and for at least two heartbeats of our own watching, whatever the clocks of
        the hosts sharing the directory say) proves it gone (True)."""
        if "heartbeat_s" not in holder or holder.get("host") == socket.gethostname():
            return False
        try:
            seen = self.path.stat().st_mtime
        except OSError:
            return True
        start = time.monotonic()
        wait = max(LEASE_S - (time.time() - seen), 2 * float(holder["heartbeat_s"]))
        log.info("lock %s of %s (pid %s on %s): watching its heartbeat for up to %.0f s", self.path,
                 holder.get("command", "?"), holder.get("pid", "?"), holder.get("host", "?"), wait)
        while time.monotonic() - start < wait:
            time.sleep(min(1.0, wait / 20))
            try:
                if self.path.stat().st_mtime != seen:
                    return False
            except OSError:
                return True
        return True

    def release(self) -> None:
        self._stop_heartbeat.set()
        if self._owned:
            holder = self._holder()
            if holder.get("pid") == os.getpid():
                self.path.unlink(missing_ok=True)
            self._owned = False
            if self._created:
                try:
                    self.path.parent.rmdir()  # only succeeds if empty: nothing but our lock was ever there
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
        if holder.get("host") != socket.gethostname():
            return False  # its pid means nothing here: see `_lease_expired`
        pid = int(holder.get("pid", -1))
        started = holder.get("pid_start")
        return not pid_alive(pid) or (started is not None and _start_time(pid) not in (None, started))

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
        # In place of a link (a dangling one fails is_file) rather than through it, to wherever it points.
        write_text_atomic(out / marker, f"written by `bertpipe {command}`, which may rewrite its own files here\n")
