"""A sweep's record of each finished trial, and the fingerprint of the files it ran on.

A trial that finishes writes OUT/trials/<trial>/trial_result.json (its settings, metrics, the inputs'
fingerprint and their sha256; written, fsynced and renamed into place) before it reports to Tune; a
resumed sweep keeps a trial whose record verifies and names this sweep's settings and inputs.
"""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path
from typing import Any, Iterator, Sequence

from pipeline.atomic_write import write_text_atomic

RECORD = "trial_result.json"  # OUT/trials/<trial>/: a finished trial's settings and metrics
# How or where a trial ran, not what it computed or wrote: a resume that changes only these keeps finished trials.
RESOURCE_SETTINGS = frozenset({"threads", "feature_cache", "progress"})


def _digest(body: dict[str, Any]) -> str:
    return hashlib.sha256(json.dumps(body, sort_keys=True).encode()).hexdigest()


def inputs_fingerprint(checkpoint: str | Path, data_dir: str | Path, exclude: Sequence[str | Path] = ()) -> str:
    """What the checkpoint and data folders hold, cheaply: sha256 over every file's path, size and
    modification time (bertpipe's own `export/` and hidden files aside, and the folders in `exclude`: the
    sweep's own --out or feature cache inside them, which every trial changes). A trial is kept on resume
    only if it ran on the same; settings alone name the folders, whose files may have been replaced since."""
    h = hashlib.sha256()
    skip = [Path(os.path.realpath(p)) for p in exclude]
    for root in (Path(checkpoint), Path(data_dir)):
        files = [root] if root.is_file() else sorted(
            p for p in _files_under(root)
            if not any(part.startswith(".") or part == "export" for part in p.relative_to(root).parts)
            and not any(s == (real := Path(os.path.realpath(p))) or s in real.parents for s in skip))
        for p in files:
            st = p.stat()
            h.update(f"{p.relative_to(root) if p != root else p.name}\t{st.st_size}\t{st.st_mtime_ns}\n".encode())
        h.update(b"--\n")
    return h.hexdigest()


def _files_under(root: Path) -> Iterator[Path]:
    """Every file below `root`, through linked folders too (`data/SST-2 -> /mnt/...` is common, and
    `Path.rglob` does not enter them), each real folder once (a link loop ends)."""
    seen: set[str] = set()
    for folder, dirs, names in os.walk(root, followlinks=True):
        real = os.path.realpath(folder)
        if real in seen:
            dirs.clear()
            continue
        seen.add(real)
        for name in names:
            path = Path(folder) / name
            if path.is_file():
                yield path


def write_record(trial_dir: Path, settings: dict[str, Any], metrics: dict[str, float], inputs: str) -> Path:
    """Record a finished trial durably: written, fsynced and renamed into place (then the folder fsynced),
    so that a crash at any moment leaves either no record or a complete one."""
    body = {"settings": settings, "metrics": metrics, "inputs": inputs}
    return write_text_atomic(trial_dir / RECORD,
                             json.dumps({**body, "sha256": _digest(body)}, indent=2, sort_keys=True) + "\n")


def read_record(trial_dir: Path, settings: dict[str, Any], inputs: str) -> tuple[dict[str, float] | None, str]:
    """(the recorded metrics, "") for a complete record of a trial with exactly `settings` on `inputs`
    (`inputs_fingerprint`), else (None, why)."""
    path = trial_dir / RECORD
    if not path.is_file():
        return None, ""
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as err:
        return None, f"{path} does not parse ({err})"
    body = ({"settings": data.get("settings"), "metrics": data.get("metrics"), "inputs": data.get("inputs")}
            if isinstance(data, dict) else {})
    if not body or data.get("sha256") != _digest(body):
        return None, f"{path} does not match its sha256 (torn or edited)"
    wanted, ran = json.loads(json.dumps(settings)), body["settings"] or {}
    differ = sorted(k for k in set(wanted) | set(ran) if k not in RESOURCE_SETTINGS and wanted.get(k) != ran.get(k))
    if differ:
        return None, f"{path} records a run with other settings ({', '.join(differ)})"
    if body["inputs"] != inputs:
        return None, f"{path} records a run on other files: the checkpoint or the data changed since"
    return body["metrics"], ""
