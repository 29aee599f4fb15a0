"""Writes whose OSError names the file: Python's write errors name none, Beam passes a worker's error on as
text, and the one-line report of a full disk (launch/errors.py) then had to guess the newest file in --out
(a progress file, not the shard that failed).
"""

from __future__ import annotations

import contextlib
import os

from apache_beam.io.filesystems import FileSystems


class WriteFailed(OSError):
    """A write's OSError with its file named, said `[Errno 28] PATH: No space left on device`: ending in the C
    library's words, as Beam's text of a failed DoFn is matched on (launch/log.py drops its traceback then)."""

    def __str__(self) -> str:
        return f"[Errno {self.errno}] {self.filename}: {self.strerror}"


@contextlib.contextmanager
def naming(path: str):
    """An OSError raised inside, naming no file, is raised again naming `path`."""
    try:
        yield
    except OSError as err:
        if err.errno is None or err.filename is not None:
            raise
        raise WriteFailed(err.errno, err.strerror or os.strerror(err.errno), path) from err


def write_file(path: str, data: bytes) -> None:
    """`data` as the file `path` (local or remote); a failed write's OSError names it."""
    with naming(path), FileSystems.create(path) as f:
        f.write(data)
