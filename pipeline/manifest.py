"""A corpus directory's `manifest.json`: its format marker, reading it back, and file checksums.

Kept free of Beam and torch imports: the corpus job writes the manifest, and the loader, `corpus
inspect`, the trainer and fine-tuning read it or check files against the sha256 values in it.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any

FORMAT = "bertpipe-corpus"
FORMAT_VERSION = 1


def read_manifest(corpus_dir: str | Path) -> dict[str, Any]:
    """The manifest of a corpus written by `bertpipe corpus --out DIR`; a clear error for anything else."""
    path = Path(corpus_dir) / "manifest.json"
    if not path.is_file():
        raise ValueError(f"{corpus_dir} has no manifest.json; pass a directory written by `bertpipe corpus --out`")
    manifest = json.loads(path.read_text(encoding="utf-8"))
    if manifest.get("format") != FORMAT or manifest.get("format_version") != FORMAT_VERSION:
        raise ValueError(f"{path} is not a bertpipe corpus manifest (format {manifest.get('format')!r}, version "
                         f"{manifest.get('format_version')!r}; expected {FORMAT!r} version {FORMAT_VERSION}); "
                         "rebuild the corpus")
    return manifest


def sha256_file(path: str | Path) -> str:
    """Hex sha256 of a file, read in 1 MiB chunks (vocabularies, manifests, shards)."""
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()
