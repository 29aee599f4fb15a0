"""`open_corpus`: a corpus directory read and validated once, then passed to the loader."""

from __future__ import annotations

import json
import shutil

import pytest

from pipeline.corpus_info import open_corpus
from pipeline.loader import PretrainLoader, ShardedSplit


@pytest.fixture
def corpus_copy(small_corpus, tmp_path):
    out = tmp_path / "c"
    shutil.copytree(small_corpus, out)
    return out


def test_the_loader_reads_nothing_the_corpus_info_already_holds(corpus_copy):
    corpus = open_corpus(corpus_copy)
    assert corpus.vocab.size == corpus.manifest["vocab_size"] == 30522 and corpus.vocab.lowercase is True
    assert corpus.num_instances("train") + corpus.num_instances("heldout") == corpus.manifest["num_instances"]
    # Neither the manifest nor the vocabulary is read again: the splits and dynamic masking use the object.
    (corpus_copy / "manifest.json").unlink()
    (corpus_copy / "vocab.txt").unlink()
    train = ShardedSplit(corpus, "train")
    assert len(train) == corpus.num_instances("train") and train.manifest is corpus.manifest
    loader = PretrainLoader(train, seed=1, micro_batch_size=4, global_batch_size=8, dynamic_masking=True, prefetch=0)
    batch, position = next(iter(loader))
    assert position == 4 and batch["input_ids"].shape[0] == 4
    with pytest.raises(ValueError, match="no manifest.json"):
        ShardedSplit(corpus_copy, "train")  # a directory is opened (and validated) here instead


def _edit_manifest(path, **changes):
    m = json.loads((path / "manifest.json").read_text())
    m.update(changes)
    for key in [k for k, v in changes.items() if v is None]:
        del m[key]
    (path / "manifest.json").write_text(json.dumps(m))


def test_bad_corpus_directories_are_refused_with_the_fix(corpus_copy):
    _edit_manifest(corpus_copy, vocab_size=30000)
    with pytest.raises(ValueError, match="has 30522 tokens but manifest.json says vocab_size 30000"):
        open_corpus(corpus_copy)
    _edit_manifest(corpus_copy, vocab_size=30522, masked_lm_prob=None)
    with pytest.raises(ValueError, match="lacks masked_lm_prob; rebuild the corpus"):
        open_corpus(corpus_copy)
    _edit_manifest(corpus_copy, masked_lm_prob=0.15)
    corpus = open_corpus(corpus_copy)
    n = corpus.num_instances("train")
    corpus.check_fits(n)
    with pytest.raises(ValueError, match=f"too small: {n} train instances, fewer than one global batch"):
        corpus.check_fits(n + 1)
    (corpus_copy / "vocab.txt").unlink()
    with pytest.raises(ValueError, match="vocab.txt is missing"):
        open_corpus(corpus_copy)


@pytest.mark.parametrize("edit, message", [
    (lambda m: m.__setitem__("shards", m["shards"][1:]), "its shards hold .* instances but num_instances says"),
    (lambda m: m["shards"][0].pop("path"), "shard entry 0 lacks a valid path"),
    (lambda m: m["shards"][1].__setitem__("num_instances", "many"), "shard entry 1 lacks a valid num_instances"),
    (lambda m: m.__setitem__("shards", {"a": 1}), "shards must be a non-empty list"),
    (lambda m: m.pop("vocab_sha256"), "lacks vocab_sha256"),
    (lambda m: m["shards"][1].__setitem__("path", m["shards"][0]["path"]), "lists train-00000-of-00002.arrow more than once"),
    # a TypeError traceback; read as true; a shard or vocabulary read from another directory
    (lambda m: m.__setitem__("vocab_file", None), r"vocab_file is None, not a valid value \(edited by hand\?\)"),
    (lambda m: m.__setitem__("lowercase", "no"), r"lowercase is 'no', not a valid value"),
    (lambda m: m.__setitem__("num_instances", -5), r"num_instances is -5, not a valid value"),
    (lambda m: m["shards"][0].__setitem__("path", "../other/train-00000-of-00002.arrow"), "outside the corpus directory"),
    (lambda m: m.__setitem__("vocab_file", "/etc/vocab.txt"), "lies outside the corpus directory"),
])
def test_a_hand_edited_shard_list_is_refused_not_half_read(corpus_copy, edit, message):
    """An entry edited out of the manifest would drop its shard from training without a word."""
    m = json.loads((corpus_copy / "manifest.json").read_text())
    edit(m)
    (corpus_copy / "manifest.json").write_text(json.dumps(m))
    with pytest.raises(ValueError, match=message):
        open_corpus(corpus_copy)


def test_a_shard_list_that_lost_an_empty_shard_is_refused(corpus_copy):
    m = json.loads((corpus_copy / "manifest.json").read_text())
    train = [s for s in m["shards"] if s["split"] == "train"]
    m["shards"] = [s for s in m["shards"] if s is not train[-1]]
    m["num_instances"] -= train[-1]["num_instances"]  # as if it had held none: the count alone cannot tell
    (corpus_copy / "manifest.json").write_text(json.dumps(m))
    with pytest.raises(ValueError, match=f"lists {len(train) - 1} train shard\\(s\\) whose names say {len(train)}"):
        open_corpus(corpus_copy)


def test_a_manifest_that_is_not_an_object_and_an_unreadable_shard_are_named(corpus_copy):
    (corpus_copy / "manifest.json").write_text("[1, 2]")
    with pytest.raises(ValueError, match="manifest.json holds a JSON list, not a bertpipe corpus manifest"):
        open_corpus(corpus_copy)


def test_a_cut_short_shard_is_named_by_the_loader(small_corpus, tmp_path):
    out = shutil.copytree(small_corpus, tmp_path / "c")
    shard = sorted(out.glob("train-*.arrow"))[0]
    shard.write_bytes(shard.read_bytes()[: shard.stat().st_size // 2])
    with pytest.raises(ValueError, match=f"shard {shard} cannot be read .*restore it or rebuild the corpus"):
        ShardedSplit(out, "train")


def test_shards_longer_than_the_manifest_says_are_refused_by_the_loader(corpus_copy):
    _edit_manifest(corpus_copy, seq_len=32)  # the shards hold seq-64 instances
    with pytest.raises(ValueError, match=r"train-00000-of-00002.arrow holds an instance of \d+ tokens, more than "
                                         r"manifest.json's seq_len 32"):
        ShardedSplit(corpus_copy, "train")


def test_a_shard_count_edited_in_the_manifest_is_refused_by_the_loader(corpus_copy):
    # The epoch was sized from the rows and the checks from the manifest: with a count raised past the
    # rows, the loader served one sample over and over.
    m = json.loads((corpus_copy / "manifest.json").read_text())
    first = m["shards"][0]
    rows, first["num_instances"] = first["num_instances"], first["num_instances"] + 42
    m["num_instances"] += 42
    (corpus_copy / "manifest.json").write_text(json.dumps(m))
    with pytest.raises(ValueError, match=rf"shard .*{first['path']} holds {rows} instances where .*manifest.json "
                                         rf"lists {rows + 42}; the manifest was edited"):
        ShardedSplit(corpus_copy, "train")


def test_a_manifest_of_another_format_version_is_refused_not_read_as_this_one(corpus_copy):
    # A corpus written by a later bertpipe (another layout of the same marker) must be rebuilt, not guessed at.
    _edit_manifest(corpus_copy, format_version=2)
    with pytest.raises(ValueError, match=r"is not a bertpipe corpus manifest \(format 'bertpipe-corpus', version 2; "
                                         r"expected 'bertpipe-corpus' version 1\)"):
        open_corpus(corpus_copy)


def test_data_sha256_follows_what_the_shards_hold_not_where_the_corpus_lies(corpus_copy, tmp_path):
    # A checkpoint records it so that a resume takes a rebuild elsewhere and refuses another corpus:
    # a shard with other contents (another sha256) is another corpus, even under the same name and count.
    moved = shutil.copytree(corpus_copy, tmp_path / "elsewhere")
    assert open_corpus(moved).data_sha256 == open_corpus(corpus_copy).data_sha256
    m = json.loads((moved / "manifest.json").read_text())
    m["shards"][0]["sha256"] = "0" * 64
    (moved / "manifest.json").write_text(json.dumps(m))
    assert open_corpus(moved).data_sha256 != open_corpus(corpus_copy).data_sha256
