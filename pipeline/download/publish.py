"""A downloaded file's last steps: one writer per file, and publishing the verified `.part`."""

from __future__ import annotations

import contextlib
import fcntl
import os
from pathlib import Path
from typing import Iterator

from pipeline.download.errors import DownloadError, ExistingFileError


@contextlib.contextmanager
def only_writer(dest: Path) -> Iterator[None]:
    """One process per file: two appending to one `.part` corrupt it (a second run found 3,020,000
    bytes where the mirror lists 3,000,000)."""
    lock = dest.with_name(f".{dest.name}.lock")
    for _ in range(3):
        with open(lock, "a") as f:
            try:
                fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                raise DownloadError(f"{dest.name} is being downloaded into {dest.parent} by another process; wait "
                                    "for it to finish, or stop it and rerun (the download resumes)") from None
            # The holder removes the lock file as it leaves: a lock taken on the file it removed (opened just
            # before) is no lock, as a newcomer locks a new file under the name. Take the one the name holds.
            try:
                current = os.path.samestat(os.fstat(f.fileno()), os.stat(lock))
            except FileNotFoundError:
                current = False
            if not current:
                continue
            try:
                yield
            finally:
                lock.unlink(missing_ok=True)
            return
    raise DownloadError(f"{dest.name}: could not take its download lock {lock}; rerun")


def publish(part: Path, dest: Path) -> None:
    """`part` -> `dest`, durably and never over a file that appeared at `dest` meanwhile (not ours)."""
    with open(part, "rb+") as f:
        os.fsync(f.fileno())  # else a crash can leave a short file under the final name
    try:
        os.link(part, dest)
    except FileExistsError:
        raise ExistingFileError(f"{dest} appeared while it was being downloaded; it is not ours to replace: move "
                                f"it aside and rerun (the verified download is kept as {part})") from None
    except OSError:  # a filesystem without hard links: a plain rename, checked just before
        if dest.exists():
            raise ExistingFileError(f"{dest} appeared while it was being downloaded; move it aside and rerun") from None
        os.replace(part, dest)
        return
    part.unlink()
