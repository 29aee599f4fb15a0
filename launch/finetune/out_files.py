"""Which files in a fine-tuning `--out` a rerun may delete: those an earlier run wrote, never the user's.

A run lists, when it starts, the files it found under its output names (`OUT_FILES` in runner.py) and
kept, and when it ends, the files it wrote with their sha256 (`RECORD`). A rerun deletes what the earlier
run wrote, as it wrote it, or, when that run never finished, everything but what it had kept (without a
record, nothing); a file added since a finished run (notes in `predictions/`, say), or one of its files
edited since, is the user's, kept and named in a warning (and refused where the rerun would write that
very file). Without this, a rerun removed whole folders (`model/`, `predictions/`, `tensorboard/`) with
whatever the user had put in them.
"""

from __future__ import annotations

import json
import logging
import os
from pathlib import Path
from typing import Collection, Iterable

logger = logging.getLogger(__name__)

RECORD = ".bertpipe-finetune-files.json"


def files_under(out: Path, names: Iterable[str]) -> list[str]:
    """Every file (or link) at or under `out/name` for each name, as a path relative to `out`."""
    found = []
    for name in names:
        path = out / name
        if path.is_dir() and not path.is_symlink():
            for folder, _, files in os.walk(path):
                found += [Path(folder, f).relative_to(out).as_posix() for f in files]
        elif path.exists() or path.is_symlink():
            found.append(name)
    return sorted(found)


def _read_record(out: Path) -> dict:
    try:
        record = json.loads((out / RECORD).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return {}
    return record if isinstance(record, dict) else {}


def has_record(out: Path) -> bool:
    """Whether `out` holds the record an earlier run started (proof, with the marker, that bertpipe wrote there)."""
    return isinstance(_read_record(out).get("kept"), list)


def _write_record(out: Path, record: dict) -> None:
    from pipeline.atomic_write import write_text_atomic

    write_text_atomic(out / RECORD, json.dumps(record, indent=1) + "\n")


def clear_earlier_run(out: Path, names: Iterable[str], writes: Collection[str] = ()) -> list[str]:
    """Delete the earlier run's files under `names` (and the folders they leave empty); returns the files
    kept, which this run records as not its own. A kept file at a path in `writes` (what this run may write),
    or a kept link (or file) where this run writes into a folder (`OUT/model` a link to the user's own model
    folder), would be written over, or through: refused, before anything is deleted."""
    names = list(names)
    record = _read_record(out)
    written = record.get("written")
    kept_then = set(record["kept"]) if isinstance(record.get("kept"), list) else set()
    existing = files_under(out, names)
    if isinstance(written, dict):  # a finished run: exactly its files, as it wrote them (an edit since is the user's)
        ours = {rel for rel in existing if rel in written and _sha256(out / rel) == written[rel]}
    elif isinstance(written, list):  # a finished run's record before it held hashes
        ours = set(existing) & set(written)
    elif "kept" in record:  # never finished: all but what it kept
        ours = set(existing) - kept_then
    else:  # no record: nothing proves which files a run wrote (a config.yaml is no proof: users write those too)
        ours = set()
    clash = [rel for rel in existing if rel not in ours and (rel in writes or any(w.startswith(f"{rel}/") for w in writes))]
    if clash:
        raise FileExistsError(f"--out {out} holds {', '.join(clash[:3])}{' ...' if len(clash) > 3 else ''}, which "
                              "bertpipe did not write (or which changed since it did), where this run writes its own: "
                              "move it out of --out, or choose another --out")
    for rel in sorted(ours):
        (out / rel).unlink()
    for name in names:  # the folders emptied, deepest first
        path = out / name
        if path.is_dir() and not path.is_symlink():
            for folder, _, _ in sorted(os.walk(path), key=lambda w: -len(w[0])):
                if not os.listdir(folder):
                    os.rmdir(folder)
    kept = [rel for rel in existing if rel not in ours]
    if kept:
        logger.warning("%s also holds %d file(s) bertpipe did not write, left as they are: %s", out, len(kept),
                       ", ".join(kept[:5]) + (" ..." if len(kept) > 5 else ""))
    out.mkdir(parents=True, exist_ok=True)
    _write_record(out, {"kept": kept})
    return kept


def record_written(out: Path, names: Iterable[str], kept: list[str]) -> None:
    """At the end of a run: what it wrote, for the next run to delete."""
    theirs = set(kept)
    mine = {rel: _sha256(out / rel) for rel in files_under(out, names) if rel not in theirs}
    _write_record(out, {"kept": kept, "written": mine})


def _sha256(path: Path) -> str | None:
    from pipeline.manifest import sha256_file

    try:
        return sha256_file(path) if path.is_file() else None  # a link to a folder, say: never ours to compare
    except OSError:
        return None
