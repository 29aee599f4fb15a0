"""Remote `--input` / `--out` (gs://, s3://, hdfs://) through the real corpus job, on a Beam file system
with an object store's semantics (tests/object_store.py): no directories, listing by prefix, a
prefix delete that needs its trailing `/`, and (optstore://) no work without pipeline options."""

from __future__ import annotations

import json

from pipeline.corpus_job import CorpusConfig, run

from repo_paths import BOOKS, VOCAB

SMALL = dict(vocab=str(VOCAB), seq_len=64, dupe_factor=1, heldout_fraction=0.1, progress_seconds=0)


def _put(store, key: str, text: str) -> None:
    path = store / key
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text, encoding="utf-8")


def _keys(store, under: str) -> list[str]:
    return sorted(str(p.relative_to(store)) for p in (store / under).rglob("*") if p.is_file())


def _book(n: int) -> str:
    return BOOKS[n].read_text(encoding="utf-8")[20_000:45_000]


def test_a_rerun_on_an_object_store_leaves_no_stale_shards_or_temp_files(store):
    # The earlier run's files were kept (the clean-up was local-only, and deleting the temp "folder"
    # without its trailing / found no object): a rerun with fewer shards listed all of them.
    _put(store, "in/a.txt", _book(0))
    out = "objstore://b/corpus"
    first = run(CorpusConfig(inputs=["objstore://in/a.txt"], out=out, num_shards=3, **SMALL)).manifest
    second = run(CorpusConfig(inputs=["objstore://in/a.txt"], out=out, num_shards=2, **SMALL)).manifest
    shards = [k for k in _keys(store, "b/corpus") if k.endswith(".arrow")]
    assert len([s for s in shards if "train-" in s]) == 2 and all("-of-00002" in s or "heldout" in s for s in shards)
    assert second["num_instances"] == first["num_instances"] and len(second["shards"]) == len(shards)
    assert not [k for k in _keys(store, "b/corpus") if ".bertpipe-tmp" in k]  # the temp folder is gone


def test_remote_inputs_skip_the_output_and_hidden_folders_and_read_a_folder_named_with_a_slash(store):
    _put(store, "data/books/a.txt", _book(0))
    _put(store, "data/books/more/b.txt", _book(1))
    _put(store, "data/.git/notes.txt", "not corpus text. " * 50)
    out = "objstore://data/corpus"
    first = run(CorpusConfig(inputs=["objstore://data/"], out=out, **SMALL)).manifest
    assert first["inputs"] == ["objstore://data/books/a.txt", "objstore://data/books/more/b.txt"]
    # --out inside the input folder: the earlier corpus's vocab.txt and dead letters are not read as text
    again = run(CorpusConfig(inputs=["objstore://data"], out=out, **SMALL)).manifest
    assert again["inputs"] == first["inputs"] and again["num_instances"] == first["num_instances"]


def test_a_file_system_that_needs_the_pipeline_options_gets_them_before_any_path_is_read(store, monkeypatch):
    # HDFS and S3 refuse to work without them; Beam set them only when the Pipeline was built, after
    # the inputs had been expanded: "input hdfs://...: pipeline_options is not set"
    from apache_beam.io.filesystems import FileSystems

    monkeypatch.setattr(FileSystems, "_pipeline_options", None)  # as in a fresh process (an earlier job set them)
    _put(store, "in/a.txt", _book(0))
    manifest = run(CorpusConfig(inputs=["optstore://in/a.txt"], out="optstore://out", **SMALL)).manifest
    assert manifest["num_instances"] > 0 and json.loads((store / "out" / "manifest.json").read_text())["shards"]
