"""End-to-end tests through the real CLI on the bundled Wikipedia dump and books."""

from __future__ import annotations

import json

import numpy as np
import pyarrow as pa
import pytest

from launch import cli
from pipeline.inspect_corpus import read_shard
from pipeline.manifest import read_manifest

MANIFEST_KEYS = {
    "format", "format_version", "seed", "seq_len", "dupe_factor", "masked_lm_prob", "max_predictions",
    "short_seq_prob", "whole_word_mask", "lowercase", "vocab_file", "vocab_sha256", "vocab_size",
    "num_instances", "shards", "counters", "config",
}
COLUMNS = {
    "input_ids": pa.list_(pa.int32()), "token_type_ids": pa.list_(pa.int8()),
    "masked_lm_positions": pa.list_(pa.int32()), "masked_lm_ids": pa.list_(pa.int32()),
    "next_sentence_label": pa.int8(), "length": pa.int32(), "doc_id": pa.string(),
}


def corpus(out, inputs, vocab, *extra: str) -> dict:
    argv = ["corpus", "--input", *map(str, inputs), "--vocab", str(vocab), "--out", str(out), *extra]
    assert cli.main(argv) == 0
    return read_manifest(out)


def test_small_corpus_layout(small_corpus, data_dir):
    """The shared session corpus (a book + the real Wikipedia dump) follows docs/ARCHITECTURE.md."""
    m = read_manifest(small_corpus)
    assert MANIFEST_KEYS <= set(m) and m["format"] == "bertpipe-corpus" and m["format_version"] == 1
    assert (m["seq_len"], m["max_predictions"], m["dupe_factor"], m["seed"]) == (64, 10, 1, 1234)
    assert (small_corpus / "vocab.txt").read_bytes() == (data_dir / "vocab" / "bert-base-uncased-vocab.txt").read_bytes()
    assert m["vocab_size"] == 30522 and m["lowercase"] is True
    splits = [s["split"] for s in m["shards"]]
    assert splits.count("train") == 2 and splits.count("heldout") >= 1
    assert [s["path"] for s in m["shards"]][:2] == ["train-00000-of-00002.arrow", "train-00001-of-00002.arrow"]
    c = m["counters"]
    assert c["documents_read"] == 107 and c["skipped_wiki_redirect"] == 100 and c["instances"] == m["num_instances"]
    assert c["documents_train"] + c["documents_heldout"] == 107
    # At least two heldout documents (2% of 107 hashes to about one): alone in its bucket, a document's
    # "random" second segments all came from itself, and eval_nsp_accuracy scored half-wrong labels.
    assert c["documents_heldout"] >= 2 and c.get("buckets_with_one_document", 0) == 0
    total = 0
    heldout_docs, train_docs = set(), set()
    for shard in m["shards"]:
        table = read_shard(small_corpus / shard["path"])
        assert {f.name: f.type for f in table.schema} == COLUMNS
        assert table.num_rows == shard["num_instances"]
        total += table.num_rows
        docs = set(table.column("doc_id").to_pylist())
        (heldout_docs if shard["split"] == "heldout" else train_docs).update(docs)
        lengths = table.column("length").to_numpy()
        assert lengths.max() <= 64 and np.array_equal(lengths, [len(x) for x in table.column("input_ids").to_pylist()])
    assert total == m["num_instances"] and not heldout_docs & train_docs  # whole documents per split
    # Train shards are balanced.
    sizes = [s["num_instances"] for s in m["shards"] if s["split"] == "train"]
    assert abs(sizes[0] - sizes[1]) < 0.05 * sum(sizes)


def test_inspect(small_corpus, capsys):
    assert cli.main(["corpus", "inspect", str(small_corpus), "--examples", "2"]) == 0
    out = capsys.readouterr().out
    assert "train-00000-of-00002.arrow" in out and "[CLS]" in out and "[MASK]{" in out and "documents_read" in out
    with pytest.raises(SystemExit) as err:
        cli.main(["corpus", "inspect", str(small_corpus / "nope")])
    assert err.value.code == 2 and "no manifest.json" in capsys.readouterr().err
    # Build flags beside inspect are refused, not ignored: the corpus shows as it was built.
    for extra, named in [(["--seq-len", "32"], "--seq-len"), (["--input", "x"], "--input"),
                         (["--runner", "DirectRunner"], "--runner"), (["--flink_master=h:1"], "--flink_master")]:
        with pytest.raises(SystemExit) as err:
            cli.main(["corpus", "inspect", str(small_corpus), *extra])
        assert err.value.code == 2 and f"drop {named} (build flags" in capsys.readouterr().err
    with pytest.raises(SystemExit) as err:
        cli.main(["corpus", "inspect", str(small_corpus), "--examples", "-1"])
    assert err.value.code == 2 and "--examples -1" in capsys.readouterr().err


@pytest.mark.slow
def test_one_vs_two_workers_identical(small_corpus, tmp_path, data_dir, monkeypatch):
    """The session corpus ran on one worker; two worker processes give byte-identical shards."""
    # `make test` exports PYTHONHASHSEED=0, which the worker processes would inherit: give each its
    # own salt, so output that leaned on Python's `hash()` (sets, dict keys) would differ here.
    monkeypatch.setenv("PYTHONHASHSEED", "random")
    m1 = read_manifest(small_corpus)
    m2 = corpus(
        tmp_path / "two", [data_dir / "books" / "persuasion.txt", data_dir / "wiki" / WIKI_NAME],
        data_dir / "vocab" / "bert-base-uncased-vocab.txt",
        "--seq-len", "64", "--max-predictions", "10", "--dupe-factor", "1", "--seed", "1234", "--num-shards", "2",
        "--direct_num_workers=2",
    )
    assert [(s["path"], s["sha256"]) for s in m2["shards"]] == [(s["path"], s["sha256"]) for s in m1["shards"]]
    assert m2["counters"] == m1["counters"]


WIKI_NAME = "enwiki-latest-pages-articles1.xml-p000000010p000030302-shortened.bz2"


@pytest.fixture(scope="module")
def books_corpus(tmp_path_factory, data_dir):
    """Both bundled books at BERT's phase-1 length, two dupes."""
    out = tmp_path_factory.mktemp("books") / "c"
    m = corpus(out, sorted((data_dir / "books").glob("*.txt")), data_dir / "vocab" / "bert-base-uncased-vocab.txt",
               "--seq-len", "128", "--dupe-factor", "2", "--seed", "5", "--num-shards", "2")
    return out, m


def _rows(out, m):
    return pa.concat_tables([read_shard(out / s["path"]) for s in m["shards"]]).to_pylist()


def test_statistics_on_real_text(books_corpus):
    out, m = books_corpus
    rows = _rows(out, m)
    specials = {0, 100, 101, 102, 103}
    masked = candidates = as_mask = unchanged = 0
    for row in rows:
        ids = np.array(row["input_ids"])
        labels = np.array(row["masked_lm_ids"])
        pos = np.array(row["masked_lm_positions"])
        restored = ids.copy()
        restored[pos] = labels
        n_cand = int(sum(t not in specials for t in restored.tolist()))
        if round(n_cand * 0.15) >= m["max_predictions"]:
            continue  # the cap binds: not the 15% regime
        masked += pos.size
        candidates += n_cand
        as_mask += int((ids[pos] == 103).sum())
        unchanged += int((ids[pos] == labels).sum())
        assert not set(labels.tolist()) & specials
    assert candidates > 100_000
    assert abs(masked / candidates - 0.15) < 0.01
    assert abs(as_mask / masked - 0.80) < 0.03
    assert abs(unchanged / masked - 0.10) < 0.03
    assert abs((masked - as_mask - unchanged) / masked - 0.10) < 0.03
    nsp = np.mean([r["next_sentence_label"] for r in rows])
    assert abs(nsp - 0.5) < 0.03, nsp
    assert m["counters"]["masked_tokens"] == sum(len(r["masked_lm_positions"]) for r in rows)


def test_true_next_pairs_are_contiguous_runs_of_their_document(books_corpus, data_dir):
    """For label 0, A followed by B (masks restored) is a contiguous run of the document's token ids."""
    from pipeline.readers import ReadStats, read_file
    from pipeline.tokenize import build_tokenizer, split_sentences

    out, m = books_corpus
    tok = build_tokenizer((out / "vocab.txt").read_text(encoding="utf-8"), lowercase=True, specials_in_text=False)
    doc_bytes = {}
    for path in sorted((data_dir / "books").glob("*.txt")):
        with open(path, "rb") as f:
            (doc,) = list(read_file(f, str(path), "auto", 16_000_000, ReadStats()))
        ids = [i for e in tok.encode_batch(split_sentences(doc), add_special_tokens=False) for i in e.ids]
        doc_bytes[doc.doc_id] = np.array(ids, dtype=np.int32).tobytes()
    checked = 0
    for row in _rows(out, m):
        if row["next_sentence_label"] != 0:
            continue
        ids = np.array(row["input_ids"], dtype=np.int32)
        ids[row["masked_lm_positions"]] = row["masked_lm_ids"]
        types = np.array(row["token_type_ids"])
        a = ids[1 : int((types == 0).sum()) - 1]
        b = ids[int((types == 0).sum()) : -1]
        needle = np.concatenate([a, b]).tobytes()
        hay = doc_bytes[row["doc_id"]]
        at = hay.find(needle)
        while at >= 0 and at % 4:  # int32-aligned matches only
            at = hay.find(needle, at + 1)
        assert at >= 0, row["doc_id"]
        checked += 1
    assert checked > 1000


def test_same_seed_same_bytes(books_corpus, tmp_path, data_dir):
    out, m = books_corpus
    again = corpus(tmp_path / "again", sorted((data_dir / "books").glob("*.txt")),
                   data_dir / "vocab" / "bert-base-uncased-vocab.txt",
                   "--seq-len", "128", "--dupe-factor", "2", "--seed", "5", "--num-shards", "2")
    assert [s["sha256"] for s in again["shards"]] == [s["sha256"] for s in m["shards"]]
    for s in again["shards"]:
        assert (tmp_path / "again" / s["path"]).read_bytes() == (out / s["path"]).read_bytes()


def test_inspect_of_an_incomplete_corpus_is_a_clear_error(small_corpus, tmp_path, capsys):
    import shutil

    broken = tmp_path / "broken"
    shutil.copytree(small_corpus, broken)
    (broken / "train-00000-of-00002.arrow").unlink()
    with pytest.raises(SystemExit) as err:
        cli.main(["corpus", "inspect", str(broken)])
    assert err.value.code == 2 and "is missing; the corpus is incomplete" in capsys.readouterr().err


def test_config_file_overrides_and_flags_layer(tmp_path, data_dir):
    """Defaults <- --config YAML <- key=value overrides <- explicit flags; the manifest keeps the result."""
    text = (data_dir / "books" / "persuasion.txt").read_text(encoding="utf-8")[:40_000]
    (tmp_path / "book.txt").write_text(text, encoding="utf-8")
    config = tmp_path / "corpus.yaml"
    config.write_text(
        f"inputs: [{tmp_path / 'book.txt'}]\nvocab: {data_dir / 'vocab' / 'bert-base-uncased-vocab.txt'}\n"
        "seq_len: 64\ndupe_factor: 3\nseed: 1\nheldout_fraction: 0.0\n"
    )
    out = tmp_path / "out"
    assert cli.main(["corpus", "--config", str(config), "dupe_factor=1", "max_predictions=5",
                     "--seed", "7", "--whole-word-mask", "--out", str(out)]) == 0
    manifest = json.loads((out / "manifest.json").read_text())
    settings = manifest["config"]
    assert (settings["seq_len"], settings["dupe_factor"], settings["max_predictions"], settings["seed"]) == (64, 1, 5, 7)
    assert settings["short_seq_prob"] == 0.1  # untouched default
    # The loader's dynamic masking reads whole_word_mask from the top level: it must say how this corpus was built.
    assert manifest["whole_word_mask"] is True and settings["whole_word_mask"] is True


def test_config_typos_are_refused_before_work(tmp_path, capsys):
    with pytest.raises(SystemExit) as err:
        cli.main(["corpus", "--input", str(tmp_path), "--vocab", "v.txt", "--out", str(tmp_path / "o"), "seq_lenn=64"])
    assert err.value.code == 2 and "unknown config key(s) seq_lenn" in capsys.readouterr().err
    # A key of the wrong type is named as the flag that sets it, which for `inputs` is --input (not --inputs).
    (tmp_path / "c.yaml").write_text("inputs: books/\n")
    with pytest.raises(SystemExit) as err:
        cli.main(["corpus", "--config", str(tmp_path / "c.yaml"), "--vocab", "v.txt", "--out", str(tmp_path / "o")])
    assert err.value.code == 2 and "error: --input: expected a list, got 'books/'" in capsys.readouterr().err


def test_unknown_input_format_is_refused_before_work(tmp_path, capsys):
    with pytest.raises(SystemExit) as err:
        cli.main(["corpus", "--input", str(tmp_path), "--train-vocab-size", "100", "--out", str(tmp_path / "o"),
                  "--format", "sentences"])
    assert err.value.code == 2 and "--format 'sentences' is not one of auto | wiki-xml | text | lines | jsonl | wikiextractor" in capsys.readouterr().err
    assert not (tmp_path / "o").exists()
