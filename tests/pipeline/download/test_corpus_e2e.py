"""`bertpipe corpus --input DIR` reads a `bertpipe download` directory as it lies."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import pytest

from launch import cli

from repo_paths import REPO
VOCAB = REPO / "data" / "vocab" / "bert-base-uncased-vocab.txt"
FAST = ["--retries", "3", "--backoff", "0.01", "--timeout", "10", "--no-progress"]

pytestmark = pytest.mark.skipif(
    importlib.util.find_spec("launch.cli.corpus") is None,
    reason="the corpus stage (launch/cli/corpus.py) is not in this tree yet",
)


@pytest.mark.slow
def test_corpus_reads_a_download_directory_end_to_end(mirror, dump_names, tmp_path: Path) -> None:
    raw, out = tmp_path / "raw", tmp_path / "corpus"
    # Both sources into one directory, plus the leftovers of an interrupted and a corrupt download.
    assert cli.main(["download", "wikipedia", "--date", dump_names["date"], "--out", str(raw), "--mirror", mirror.url, *FAST]) == 0
    assert cli.main(["download", "books", "--ids", "105", "121", "--out", str(raw), "--mirror", mirror.url, *FAST]) == 0
    (raw / "gutenberg" / "999.txt.part").write_bytes(b"half a book that must not be read")
    (raw / "gutenberg" / "998.txt.partial").write_bytes(b"raw Gutenberg file in progress")

    from pipeline.sources import expand_inputs

    expected = sorted([*(str(raw / n) for n in dump_names["parts"]), str(raw / "gutenberg" / "105.txt"), str(raw / "gutenberg" / "121.txt")])
    assert expand_inputs([str(raw)]) == expected

    argv = ["corpus", "--input", str(raw), "--vocab", str(VOCAB), "--out", str(out), "--seq-len", "64",
            "--num-shards", "1", "--dupe-factor", "1", "--seed", "7"]
    assert cli.main(argv) == 0
    manifest = json.loads((out / "manifest.json").read_text())
    counters = manifest["counters"]
    # Both numbered dump parts were read as MediaWiki XML, both books as text.
    assert counters["files_wiki_xml"] == 2 and counters["files_text"] == 2, counters
    assert counters["documents_read"] > 50 and manifest["num_instances"] > 0
    import pyarrow as pa

    doc_ids: set[str] = set()
    for shard in manifest["shards"]:
        with pa.memory_map(str(out / shard["path"])) as source:
            doc_ids |= set(pa.ipc.open_file(source).read_all().column("doc_id").to_pylist())
    names = {d.split("#")[0].split(":")[0] for d in doc_ids}
    assert {*dump_names["parts"], "105.txt", "121.txt"} <= names, names
