"""`DIR/download.json`: what was fetched into a download directory (URLs, sizes, checksums, dates).

Several `bertpipe download` commands may target one directory (Wikipedia, then books; or two at
once), so the file is merged under an exclusive lock and replaced atomically: each command adds
its `sources` entry and its files; entries for paths it re-fetched are replaced.

Layout:
    {"format": "bertpipe-download", "format_version": 1,
     "sources": {"wikipedia/enwiki-20260101/parts": {...}, "gutenberg": {...}},
     "files": {"<path relative to DIR>": {"source", "url", "size", "sha1"|"md5"|"sha256", "fetched_at", ...}}}
"""

from __future__ import annotations

import contextlib
import datetime as dt
import fcntl
import json
from pathlib import Path
from typing import Any, Iterator, Sequence

from pipeline.atomic_write import write_text_atomic

MANIFEST_NAME = "download.json"
FORMAT = "bertpipe-download"
FORMAT_VERSION = 1
_LOCK_NAME = ".download.lock"  # hidden: the corpus reader skips it


def utc_now() -> str:
    return dt.datetime.now(dt.timezone.utc).replace(microsecond=0).isoformat().replace("+00:00", "Z")


@contextlib.contextmanager
def _locked(directory: Path) -> Iterator[None]:
    directory.mkdir(parents=True, exist_ok=True)
    with open(directory / _LOCK_NAME, "a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)


def read_manifest(directory: Path) -> dict[str, Any]:
    path = directory / MANIFEST_NAME
    if not path.exists():
        return {"format": FORMAT, "format_version": FORMAT_VERSION, "sources": {}, "files": {}}
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except ValueError as err:
        raise ValueError(f"{path} is not valid JSON ({err}); move it aside and rerun the download") from None
    if not isinstance(data, dict) or data.get("format") != FORMAT or data.get("format_version") != FORMAT_VERSION:
        found = (f"format {data.get('format')!r} version {data.get('format_version')!r}" if isinstance(data, dict)
                 else f"a JSON {type(data).__name__}")
        raise ValueError(f"{path} is not a bertpipe download manifest ({found}); pick another --out directory")
    if not isinstance(data.get("sources"), dict) or not isinstance(data.get("files"), dict):
        raise ValueError(f"{path} is damaged (its `sources` and `files` must be objects); move it aside and rerun "
                         "the download: verified files already there are kept")
    return data


def update_manifest(directory: Path, source_key: str, source: dict[str, Any], files: dict[str, dict[str, Any]],
                    drop: Sequence[str] = ()) -> Path:
    """Merge one command's source entry and files into `directory/download.json`, atomically; the
    entries of `drop` (files that no longer match what was recorded) are removed."""
    with _locked(directory):
        data = read_manifest(directory)
        data["sources"][source_key] = source
        for name in drop:
            data["files"].pop(name, None)
        data["files"].update(files)
        data["files"] = dict(sorted(data["files"].items()))
        path = write_text_atomic(directory / MANIFEST_NAME, json.dumps(data, indent=2, sort_keys=False) + "\n")
    return path
