"""What `bertpipe corpus` writes does not depend on how its paths are spelled, through the real CLI on slices of
the bundled books: `[`, `]`, `*` in --out are plain characters, and the order of --input does not change a byte.

Beam's `WriteToText` finds its own files again by glob, and the job read its records back with a glob over
--out: `--out corpus[v1]` failed with Beam's traceback ("src and dst files do not exist ... FinalizeWrite"),
leaving a shard, dead_letter/ and .bertpipe-tmp behind; `--out corpus*` took in another folder's records.
Also here, on the same slices: a --num-shards that leaves shards empty is said.
"""

from __future__ import annotations

import json

import pytest

from launch import cli
from pipeline.manifest import sha256_file
from pipeline.output_lock import LOCK_NAME
from repo_paths import BOOKS, VOCAB


@pytest.fixture(scope="module")
def texts(tmp_path_factory) -> list:
    """The first ~60 KB of each bundled book, whole lines: two real documents, quick to build."""
    folder = tmp_path_factory.mktemp("texts")
    paths = []
    for book in BOOKS:
        text = book.read_text(encoding="utf-8")
        paths.append(folder / book.name)
        paths[-1].write_text(text[:text.index("\n", 60_000) + 1], encoding="utf-8")
    return paths


def _corpus(out, inputs, *vocab: str) -> dict:
    argv = ["corpus", "--input", *map(str, inputs), *(vocab or ("--vocab", str(VOCAB))), "--out", str(out),
            "--seq-len", "64", "--dupe-factor", "1", "--heldout-fraction", "0"]
    assert cli.main(argv) == 0
    return json.loads((out / "manifest.json").read_text())


def _only_the_corpus(out, manifest) -> None:
    """The finished layout: the listed shards (their bytes as listed), vocab, manifest, dead letters; no temp."""
    shards = {s["path"] for s in manifest["shards"]}
    assert manifest["num_instances"] > 0 and shards
    assert {p.name for p in out.iterdir()} == shards | {"manifest.json", "vocab.txt", "dead_letter"}
    for shard in manifest["shards"]:
        assert sha256_file(out / shard["path"]) == shard["sha256"], shard["path"]
    assert not (out / LOCK_NAME).exists()  # the job's lock went with it


@pytest.mark.parametrize("vocab", [(), ("--train-vocab-size", "1000")], ids=["vocab", "trained-vocab"])
def test_out_with_brackets_builds_the_corpus(tmp_path, texts, vocab):
    out = tmp_path / "corpus[v1]"
    manifest = _corpus(out, texts, *vocab)
    _only_the_corpus(out, manifest)
    assert manifest["config"]["out"] == str(out)
    if vocab:
        assert manifest["vocab_size"] == 1000 and manifest["counters"]["vocab_distinct_words"] > 0


def test_out_with_a_star_reads_only_its_own_records(tmp_path, texts):
    """Another folder that `corpus*` would match, holding an unfinished job's records, is not read."""
    other = tmp_path / "corpus-old" / ".bertpipe-tmp"
    other.mkdir(parents=True)
    stray = {"path": "train-00007-of-00009.arrow", "split": "train", "num_instances": 5, "sha256": "0" * 64}
    for name in ("shards-00000-of-00001.jsonl", "shards.files.json"):
        (other / name).write_text(json.dumps(stray) + "\n")
    out = tmp_path / "corpus*"
    manifest = _corpus(out, texts)
    _only_the_corpus(out, manifest)
    assert stray["path"] not in {s["path"] for s in manifest["shards"]}


def test_input_order_does_not_change_the_manifest(tmp_path, texts):
    """`config.inputs` is recorded sorted, as the top-level `inputs` is: the same inputs, the same bytes."""
    out = tmp_path / "corpus"
    _corpus(out, texts)
    first = (out / "manifest.json").read_bytes()
    manifest = _corpus(out, texts[::-1])
    assert (out / "manifest.json").read_bytes() == first
    assert manifest["config"]["inputs"] == sorted(map(str, texts)) == manifest["inputs"]


def test_more_shards_than_instances_fill_is_named_in_a_warning(tmp_path, texts, capsys):
    # --num-shards 5000 on 62 instances wrote 4,940 empty shards (21 MB, a 781 KB manifest) without a word.
    argv = ["corpus", "--input", str(texts[0]), "--vocab", str(VOCAB), "--out", str(tmp_path / "c"), "--seq-len", "64",
            "--dupe-factor", "1", "--heldout-fraction", "0", "--num-shards", "300"]
    assert cli.main(argv) == 0
    manifest = json.loads((tmp_path / "c" / "manifest.json").read_text())
    empty = sum(not s["num_instances"] for s in manifest["shards"])
    assert empty and (f"{empty} of the 300 train shards are empty: --num-shards 300 is more than the corpus's "
                      f"{manifest['num_instances']} training instances fill; lower it") in capsys.readouterr().err
