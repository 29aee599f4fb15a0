"""Batching is a speed choice, never an output choice: packed instances, batched tokenizer calls and
batch sizes must give exactly what one-at-a-time processing gives."""

from __future__ import annotations

import platform
import subprocess
import sys

import apache_beam as beam
import numpy as np
import pytest
from apache_beam.testing.test_pipeline import TestPipeline as BeamTestPipeline

import pipeline.nsp as nsp
import pipeline.tokenize as tokenize
from pipeline.instance_batch import InstanceBatch
from pipeline.instances import Instance, InstanceSettings, create_instances_from_document
from pipeline.masking import MaskingVocab
from pipeline.nsp import CreateInstances, SplitSettings
from pipeline.readers import RawDocument
from pipeline.shards import WriteShards, batch_to_table
from pipeline.sources import DEAD_LETTER
from pipeline.tokenize import TokenizedDocument
from repo_paths import BOOKS, REPO, VOCAB


def _docs(n: int, seed: int = 0) -> list[TokenizedDocument]:
    rng = np.random.default_rng(seed)
    return [TokenizedDocument.from_sentences(f"d{i}", [rng.integers(1000, 5000, rng.integers(3, 30)).astype(np.int32)
                                                       for _ in range(rng.integers(2, 15))]) for i in range(n)]


def _instances():
    vocab = MaskingVocab.from_vocab_file(VOCAB)
    docs = _docs(6)
    sentences = [d.sentences for d in docs]
    ids = [d.doc_id for d in docs]
    keys, made = [], []
    for i in range(len(docs)):
        out = create_instances_from_document(i, sentences, ids, InstanceSettings(seq_len=48), vocab, np.random.default_rng(i))
        keys += [(int(x), ids[i], 0, k) for k, x in enumerate(np.random.default_rng(99 + i).integers(0, 2**63, len(out)))]
        made += out
    return keys, made


def test_instance_batch_holds_exactly_the_instances():
    keys, made = _instances()
    batch = InstanceBatch.from_instances(keys, made)
    assert len(batch) == len(made) > 20
    rows = batch_to_table(batch).to_pylist()
    for row, inst in zip(rows, made):
        assert row["input_ids"] == inst.input_ids.tolist() and row["token_type_ids"] == inst.token_type_ids.tolist()
        assert row["masked_lm_positions"] == inst.masked_lm_positions.tolist()
        assert row["masked_lm_ids"] == inst.masked_lm_ids.tolist()
        assert (row["next_sentence_label"], row["length"], row["doc_id"]) == (
            inst.next_sentence_label, inst.input_ids.size, inst.doc_id)
    # take, concat and sort move whole rows: the sorted batch is the instances in key order.
    perm = np.random.default_rng(1).permutation(len(made))
    shuffled = InstanceBatch.concat([batch.take(perm[:10]), batch.take(perm[10:])])
    ordered = shuffled.sorted_by_key()
    expect = [made[i] for i in sorted(range(len(made)), key=keys.__getitem__)]
    for row, inst in enumerate(expect):
        got = ordered.instance(row)
        assert got.doc_id == inst.doc_id and got.next_sentence_label == inst.next_sentence_label
        for name in ("input_ids", "token_type_ids", "masked_lm_positions", "masked_lm_ids"):
            assert np.array_equal(getattr(got, name), getattr(inst, name)), name


def _tokenize_all(docs, monkeypatch, batch_sentences: int):
    monkeypatch.setattr(tokenize, "BATCH_SENTENCES", batch_sentences)
    fn = tokenize._TokenizeFn(VOCAB.read_text(encoding="utf-8"), lowercase=True)
    fn.setup()
    fn.start_bundle()
    out = [o for d in docs for o in fn.process(d)] + list(fn.finish_bundle())
    values = [getattr(o, "value", o) for o in out]  # unwrap the bundle end's windowed values
    good = [(d.doc_id, d.ids.tolist(), d.ends.tolist()) for d in values if isinstance(d, TokenizedDocument)]
    dead = [(o.tag, getattr(o.value, "value", o.value).record_id) for o in out if isinstance(o, beam.pvalue.TaggedOutput)]
    return good, dead


def test_tokenizer_batches_do_not_change_documents(monkeypatch):
    text = BOOKS[0].read_text(encoding="utf-8")[:60_000].split("\n\n")
    docs = [RawDocument(f"b{i}", text[i * 40 : (i + 1) * 40]) for i in range(5)]
    docs.insert(2, RawDocument("empty", ["  ", "\u0007"]))
    one_by_one = _tokenize_all(docs, monkeypatch, 1)
    assert one_by_one == _tokenize_all(docs, monkeypatch, 50) == _tokenize_all(docs, monkeypatch, 10**6)
    good, dead = one_by_one
    assert [d for d, _, _ in good] == ["b0", "b1", "b2", "b3", "b4"] and dead == [(DEAD_LETTER, "empty")]
    tok = tokenize.build_tokenizer(VOCAB.read_text(encoding="utf-8"), lowercase=True)
    expected = [i for e in tok.encode_batch(tokenize.split_sentences(docs[0]), add_special_tokens=False) for i in e.ids]
    assert good[0][1] == expected


def _shard_bytes(tmp_path, monkeypatch, batch_instances: int) -> dict[str, bytes]:
    monkeypatch.setattr(nsp, "BATCH_INSTANCES", batch_instances)
    out = tmp_path / f"b{batch_instances}"
    split = SplitSettings(seed=4, heldout_fraction=0.1, docs_per_bucket=6, dupe_factor=2)
    with BeamTestPipeline(runner="FnApiRunner") as p:
        _ = (p | beam.Create(_docs(30, seed=3)) | CreateInstances(split, InstanceSettings(seq_len=40),
                                                                  MaskingVocab.from_vocab_file(VOCAB))
             | WriteShards(str(out), "arrow", num_shards=3))
    return {f.name: f.read_bytes() for f in sorted(out.iterdir())}


def test_instance_batch_size_does_not_change_shards(tmp_path, monkeypatch):
    small = _shard_bytes(tmp_path, monkeypatch, 3)
    assert small == _shard_bytes(tmp_path, monkeypatch, 4096)
    assert len(small) >= 4 and all(small.values())


def test_ids_travel_compact_and_reach_shards_as_int32():
    # BERT-sized ids travel as uint16 between stages; past 65536 pieces they stay int32. The shard
    # schema is int32 either way, and token types (kept as one count per row) come back per token.
    for top_id in (30_521, 70_000):
        inst = Instance("d", np.array([101, 5, top_id, 102, 7, 102], np.int32), np.array([0, 0, 0, 0, 1, 1], np.int8),
                        np.array([2], np.int32), np.array([top_id], np.int32), 1)
        batch = InstanceBatch.from_instances([(3, "d", 0, 0)], [inst])
        assert batch.input_ids.dtype == (np.uint16 if top_id < 2**16 else np.int32)
        table = batch_to_table(batch)
        assert str(table.schema.field("input_ids").type) == "list<item: int32>"
        assert table.to_pylist()[0] == {"input_ids": [101, 5, top_id, 102, 7, 102], "token_type_ids": [0, 0, 0, 0, 1, 1],
                                        "masked_lm_positions": [2], "masked_lm_ids": [top_id], "next_sentence_label": 1,
                                        "length": 6, "doc_id": "d"}
        doc = TokenizedDocument.from_sentences("d", [np.array([top_id, 1], np.int32), np.array([2], np.int32)])
        assert doc.ids.dtype == (np.uint16 if top_id < 2**16 else np.int32)


def test_sentence_views_are_the_split_document():
    doc = _docs(1, seed=5)[0]
    expected = np.split(doc.ids, doc.ends[:-1])
    views = doc.sentences
    assert len(views) == len(expected) and doc.ids.dtype == np.uint16
    assert all(np.array_equal(a, b) for a, b in zip(views, expected))
    assert all(np.array_equal(views[j], expected[j]) for j in range(-len(expected), len(expected)))
    with pytest.raises(IndexError):
        views[len(expected)]


def test_tokenizer_output_is_uint16_for_a_bert_vocab():
    fn = tokenize._TokenizeFn(VOCAB.read_text(encoding="utf-8"), lowercase=True)
    fn.setup()
    fn.start_bundle()
    out = list(fn.process(RawDocument("a", ["Hello there. How are you?"]))) + list(fn.finish_bundle())
    doc = out[0].value
    assert doc.ids.dtype == np.uint16 and [s.tolist() for s in doc.sentences] == [[7592, 2045, 1012], [2129, 2024, 2017, 1029]]


# Where glibc puts a large block requested after a larger one was freed, in a fresh process. glibc's own rule
# has raised its mmap threshold above the block by then, so the block comes from the heap, where its memory
# stays in the process once freed; with the threshold fixed at 128 KiB it is mmapped. The block is larger than
# all the main arena's free memory (mallinfo2's fordblks, its top chunk included), so no free chunk can hold it,
# and the answer is read from its own header (IS_MMAPPED, bit 1 of the size word before it).
_MMAP_PROBE = """
import ctypes, sys
class MallInfo2(ctypes.Structure):
    _fields_ = [(n, ctypes.c_size_t) for n in ("arena", "ordblks", "smblks", "hblks", "hblkhd", "usmblks", "fsmblks",
                                                "uordblks", "fordblks", "keepcost")]
libc = ctypes.CDLL(None)
libc.malloc.restype, libc.free.argtypes, libc.mallinfo2.restype = ctypes.c_void_p, [ctypes.c_void_p], MallInfo2
exec(sys.argv[1])
size = ((libc.mallinfo2().fordblks >> 20) + 1) << 20
libc.free(libc.malloc(size + (1 << 20)))
block = libc.malloc(size)
size_word = ctypes.c_size_t.from_address(block - ctypes.sizeof(ctypes.c_size_t)).value
print("mmapped" if size_word & 2 else "heap")
"""


def _where_a_large_block_goes_after(setup: str) -> str:
    return subprocess.run([sys.executable, "-c", _MMAP_PROBE, setup], capture_output=True, text=True, check=True,
                          cwd=REPO).stdout.strip()


@pytest.mark.skipif(platform.libc_ver()[0] != "glibc", reason="mallopt is glibc's")
def test_large_frees_go_back_to_the_os_on_glibc_after_a_local_corpus_job(tmp_path):
    """The corpus job on the local runner fixes the threshold (`return_large_frees_to_os`), and a large block
    freed afterwards goes back to the OS; without it, it stays on the heap (the probe can tell)."""
    assert _where_a_large_block_goes_after("pass") == "heap"
    job = ("from pipeline.corpus_job import CorpusConfig, run\n"
           f"run(CorpusConfig(inputs=[{str(BOOKS[1])!r}], out={str(tmp_path / 'corpus')!r}, vocab={str(VOCAB)!r}, "
           "seq_len=64, dupe_factor=1, num_shards=1, progress_seconds=0))")
    assert _where_a_large_block_goes_after(job) == "mmapped"
    assert (tmp_path / "corpus" / "manifest.json").is_file()


def test_the_reused_buffer_sentence_splitter_is_blingfire_s_own():
    """tokenize.SentenceSplitter calls blingfire's C function on one reused buffer (a transcription of
    blingfire 0.1.8's text_to_sentences): the same sentences on every paragraph of the bundled books,
    after longer ones (buffer reuse), on empty and NUL-holding text."""
    import blingfire

    splitter = tokenize.SentenceSplitter()
    paragraphs = [p for book in BOOKS for p in book.read_text(encoding="utf-8").split("\n\n") if p.strip()]
    cases = sorted(paragraphs, key=len, reverse=True)[:50] + paragraphs[:1500] + ["", "a\0b. C d.", "x" * 300_000]
    assert len(paragraphs) > 1500
    assert [splitter(p) for p in cases] == [blingfire.text_to_sentences(p) for p in cases]
