"""A corpus directory's `manifest.json`: its format marker, reading it back, and file checksums.

Kept free of Beam and torch imports: the corpus job writes the manifest, and the loader, `corpus
inspect`, the trainer and fine-tuning read it or check files against the sha256 values in it.
"""

from __future__ import annotations

import json
import os
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from pipeline.download.checksums import hash_file

FORMAT = "bertpipe-corpus"
FORMAT_VERSION = 1


def read_manifest(corpus_dir: str | Path) -> dict[str, Any]:
    """The manifest of a corpus written by `bertpipe corpus --out DIR`; a clear error for anything else.
    Its fields are checked by `pipeline.corpus_info.open_corpus`, which every reader goes through."""
    path = Path(corpus_dir) / "manifest.json"
    if not path.is_file():
        raise ValueError(f"{corpus_dir} has no manifest.json; pass a directory written by `bertpipe corpus --out`")
    try:
        manifest = json.loads(path.read_text(encoding="utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as err:
        raise ValueError(f"{path} is not valid JSON ({err}); the corpus is damaged or unfinished, rebuild it") from None
    if not isinstance(manifest, dict):
        raise ValueError(f"{path} holds a JSON {type(manifest).__name__}, not a bertpipe corpus manifest; rebuild the corpus")
    if manifest.get("format") != FORMAT or manifest.get("format_version") != FORMAT_VERSION:
        raise ValueError(f"{path} is not a bertpipe corpus manifest (format {manifest.get('format')!r}, version "
                         f"{manifest.get('format_version')!r}; expected {FORMAT!r} version {FORMAT_VERSION}); "
                         "rebuild the corpus")
    return manifest


def sha256_file(path: str | Path) -> str:
    """Hex sha256 of a file (vocabularies, manifests, shards), by the one file hasher the downloader uses too."""
    return hash_file(Path(path), ["sha256"])["sha256"]


def verify_shards(corpus_dir: str | Path, manifest: dict[str, Any], threads: int | None = None) -> None:
    """Every shard listed in the manifest exists and has its recorded sha256; else a ValueError naming it.

    Shards are hashed in parallel threads (hashlib releases the GIL on large reads), so verifying is
    bounded by disk speed: see bench/shard_verify.py and docs/PERFORMANCE.md.
    """
    corpus_dir = Path(corpus_dir)
    shards = manifest["shards"]
    for shard in shards:
        if not (corpus_dir / shard["path"]).is_file():
            raise ValueError(f"shard {corpus_dir / shard['path']} listed in manifest.json is missing; "
                             "the corpus is incomplete, rebuild it")
    workers = threads or min(8, os.cpu_count() or 1, max(1, len(shards)))
    with ThreadPoolExecutor(workers) as pool:
        digests = list(pool.map(lambda s: sha256_file(corpus_dir / s["path"]), shards))
    for shard, digest in zip(shards, digests):
        if digest != shard["sha256"]:
            raise ValueError(f"shard {corpus_dir / shard['path']} is damaged: its sha256 is not the one in "
                             "manifest.json (truncated or changed after it was written); rebuild the corpus "
                             "or restore that file")
