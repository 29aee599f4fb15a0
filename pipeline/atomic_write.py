"""Write a small file so that a crash at any moment leaves the old file or the new one, never half of it.

Used for every small record a resume or a reader trusts: checkpoint metadata and `latest`, finished
sweep trials, `metrics.jsonl` rewrites, the download manifest, feature-cache records.
"""

from __future__ import annotations

import os
from pathlib import Path


def write_text_atomic(path: str | os.PathLike, text: str, *, durable: bool = True) -> Path:
    """Write `text` (UTF-8) to a temporary name beside `path`, then rename it into place."""
    return write_bytes_atomic(path, text.encode("utf-8"), durable=durable)


def write_bytes_atomic(path: str | os.PathLike, data: bytes, *, durable: bool = True) -> Path:
    """Write `data` to a temporary name beside `path`, then rename it into place. The rename replaces a
    link at `path` rather than writing through it (a run branched with `cp -rs` keeps its source intact).

    durable: fsync the data before the rename and the folder after it, so that the rename itself
    survives a power loss (what a resume relies on); off for files that are only progress hints.
    """
    path = Path(path)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    try:
        with open(tmp, "wb") as f:
            f.write(data)
            if durable:
                f.flush()
                os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        try:  # a full disk or a failed rename must not leave our temp file behind
            tmp.unlink(missing_ok=True)
        except OSError:
            pass  # e.g. a read-only folder, where open() failed: there is nothing to remove
        raise
    if durable:
        folder = os.open(path.parent, os.O_RDONLY)
        try:
            os.fsync(folder)
        finally:
            os.close(folder)
    return path
