"""One Beam `TestPipeline` + `assert_that` test per PTransform of the corpus job."""

from __future__ import annotations

import bz2
import json

import apache_beam as beam
import numpy as np
from apache_beam.testing.test_pipeline import TestPipeline as BeamTestPipeline
from apache_beam.testing.util import assert_that, equal_to

from pipeline.instance_batch import InstanceBatch
from pipeline.instances import Instance, InstanceSettings
from pipeline.masking import MaskingVocab
from pipeline.nsp import CreateInstances, SplitSettings
from pipeline.readers import RawDocument, Skip
from pipeline.corpus_output import WriteDeadLetters
from pipeline.shards import WriteShards, shard_name
from pipeline.inspect_corpus import read_shard
from pipeline.sources import DEAD_LETTER, ReadDocuments
from pipeline.tokenize import TokenizeDocuments, TokenizedDocument, build_tokenizer
from pipeline.vocab_training import CountWords, read_count_files

PROSE = "The quick brown fox jumps over the lazy dog. It was a very sunny day in the valley."


def pipeline() -> BeamTestPipeline:
    return BeamTestPipeline(runner="FnApiRunner")


def test_read_documents(tmp_path):
    book = tmp_path / "book.txt"
    book.write_text(f"{PROSE}\n\n{PROSE}\n", encoding="utf-8")
    lines = tmp_path / "lines.txt.bz2"
    lines.write_bytes(bz2.compress(b"One sentence here.\nTwo sentences here.\nThree of them!\nFour, yes.\nFive.\n\nNext doc.\n"))
    binary = tmp_path / "blob.bin"
    binary.write_bytes(bytes(range(256)) * 10)
    with pipeline() as p:
        out = p | beam.Create([str(book), str(lines), str(binary)]) | ReadDocuments()
        assert_that(
            out.documents | "Ids" >> beam.Map(lambda d: (d.doc_id, len(d.segments), d.presplit)),
            equal_to([("book.txt", 2, False), ("lines.txt.bz2:0", 5, True), ("lines.txt.bz2:1", 1, True)]),
        )
        assert_that(
            out[DEAD_LETTER] | "Reasons" >> beam.Map(lambda s: (s.record_id.rsplit("/", 1)[-1], s.reason)),
            equal_to([("blob.bin", "binary_file")]),
            label="DeadLetters",
        )


def test_tokenize_documents(data_dir):
    vocab_text = (data_dir / "vocab" / "bert-base-uncased-vocab.txt").read_text(encoding="utf-8")
    tok = build_tokenizer(vocab_text, lowercase=True)
    expected = [e.ids for e in tok.encode_batch(["The quick brown fox jumps over the lazy dog.",
                                                 "It was a very sunny day in the valley."], add_special_tokens=False)]
    docs = [RawDocument("a", [PROSE]), RawDocument("empty", ["   "]), RawDocument("b", ["Hello there.", "General Kenobi!"], presplit=True)]
    with pipeline() as p:
        out = p | beam.Create(docs) | TokenizeDocuments(vocab_text, lowercase=True)
        assert_that(
            out.documents | beam.Map(lambda d: (d.doc_id, [s.tolist() for s in d.sentences])),
            equal_to([("a", expected), ("b", [[7592, 2045, 1012], [2236, 6358, 16429, 2072, 999]])]),
        )
        assert_that(out[DEAD_LETTER] | "Reasons" >> beam.Map(lambda s: (s.record_id, s.reason)),
                    equal_to([("empty", "empty_document")]), label="Empty")


def test_special_tokens_written_in_the_text_are_text_in_the_corpus(data_dir):
    # They were matched as the tokens: a book's "[MASK]" became a mask with no label, "[SEP]" a boundary.
    vocab_text = (data_dir / "vocab" / "bert-base-uncased-vocab.txt").read_text(encoding="utf-8")
    text = "The model sees [MASK] here, then [SEP] and [CLS] and [PAD] and [UNK] in the text."
    words = "the model sees [ mask ] here , then [ sep ] and [ cl ##s ] and [ pad ] and [ un ##k ] in the text ."
    tok = build_tokenizer(vocab_text, lowercase=True)
    with pipeline() as p:
        out = p | beam.Create([RawDocument("a", [text])]) | TokenizeDocuments(vocab_text, lowercase=True)
        assert_that(out.documents | beam.Map(lambda d: [tok.id_to_token(i) for s in d.sentences for i in s.tolist()]),
                    equal_to([words.split()]))


def test_dead_letters_are_the_same_bytes_whatever_the_order_they_arrive_in(tmp_path):
    # Beam's WriteToText split them among files, and ordered them, by bundle: two runs with 2 workers
    # wrote different bytes.
    skips = [Skip(f"f{i % 3}.jsonl", f"f{i % 3}.jsonl:{i}", "malformed_json", f"line {i}") for i in range(40)]
    written = []
    for run, order in enumerate((skips, skips[::-1])):
        with pipeline() as p:
            _ = p | beam.Create(order, reshuffle=False) | WriteDeadLetters(str(tmp_path / str(run)))
        written.append([f.read_bytes() for f in sorted((tmp_path / str(run) / "dead_letter").iterdir())])
    assert written[0] == written[1] and len(written[0]) == 1
    assert [json.loads(line)["record_id"] for line in written[0][0].decode().splitlines()] == sorted(
        s.record_id for s in skips)


def _synthetic_docs(n_docs: int) -> list[TokenizedDocument]:
    rng = np.random.default_rng(0)
    return [
        TokenizedDocument.from_sentences(f"doc{i:03d}", [rng.integers(1000, 2000, size=rng.integers(5, 20)).astype(np.int32) for _ in range(12)])
        for i in range(n_docs)
    ]


def test_create_instances_splits_buckets_and_dupes(data_dir):
    vocab = MaskingVocab.from_vocab_file(data_dir / "vocab" / "bert-base-uncased-vocab.txt")
    docs = _synthetic_docs(40)
    settings = InstanceSettings(seq_len=32, short_seq_prob=0.0)
    split = SplitSettings(seed=7, heldout_fraction=0.1, docs_per_bucket=8, dupe_factor=2)

    def check(elements):
        by_doc: dict[str, set] = {}
        for split_name, batch in elements:
            for row in range(len(batch)):
                inst = batch.instance(row)
                assert isinstance(inst, Instance) and inst.input_ids.size <= 32
                assert batch.doc_ids[row] == inst.doc_id and batch.dupes[row] in (0, 1)
                by_doc.setdefault(inst.doc_id, set()).add((split_name, int(batch.dupes[row])))
        assert set(by_doc) == {d.doc_id for d in docs}  # no document lost
        heldout = {d for d, v in by_doc.items() if ("heldout", 0) in v}
        assert 1 <= len(heldout) <= 12 and all({s for s, _ in by_doc[d]} == {"heldout"} for d in heldout)
        assert all({k for _, k in v} == {0, 1} for v in by_doc.values())  # both dupes of every document

    with pipeline() as p:
        out = p | beam.Create(docs) | CreateInstances(split, settings, vocab)
        assert_that(out, check)


def test_the_training_split_is_never_empty_whatever_the_hash(data_dir):
    # Three documents that all hash below a heldout fraction of 0.9: every one went to heldout, the train
    # shard held 0 instances, and the job reported success (pretrain refused the corpus only later).
    from pipeline.nsp import heldout_score

    vocab = MaskingVocab.from_vocab_file(data_dir / "vocab" / "bert-base-uncased-vocab.txt")
    docs = _synthetic_docs(3)
    seed = next(s for s in range(1000) if all(heldout_score(s, d.doc_id) < 0.9 for d in docs))
    split = SplitSettings(seed=seed, heldout_fraction=0.9, docs_per_bucket=8, dupe_factor=1)
    last = max(docs, key=lambda d: heldout_score(seed, d.doc_id)).doc_id

    def check(elements):
        splits = {(name, batch.doc_ids[row]) for name, batch in elements for row in range(len(batch))}
        assert {d for name, d in splits if name == "train"} == {last}
        assert {d for name, d in splits if name == "heldout"} == {d.doc_id for d in docs} - {last}

    with pipeline() as p:
        assert_that(p | beam.Create(docs) | CreateInstances(split, InstanceSettings(seq_len=32), vocab), check)


def test_a_corpus_of_ten_or_more_documents_always_has_a_heldout_split(data_dir):
    # At fraction 0.01 a small corpus usually hashes no document below it, and the trainer needs a heldout
    # set (of two documents: alone in its bucket, a document's random B is its own). From 10 documents on,
    # the 2 lowest-scoring are heldout whatever the fraction; below 10 that would take too much training text.
    from pipeline.nsp import heldout_score

    vocab = MaskingVocab.from_vocab_file(data_dir / "vocab" / "bert-base-uncased-vocab.txt")
    docs = _synthetic_docs(12)
    seed = next(s for s in range(1000) if all(heldout_score(s, d.doc_id) >= 0.01 for d in docs))
    split = SplitSettings(seed=seed, heldout_fraction=0.01, docs_per_bucket=8, dupe_factor=1)
    lowest = sorted((d.doc_id for d in docs), key=lambda d: heldout_score(seed, d))[:2]

    def splits_are(heldout, all_docs):
        def check(elements):
            splits = {(name, batch.doc_ids[row]) for name, batch in elements for row in range(len(batch))}
            assert {d for name, d in splits if name == "heldout"} == set(heldout)
            assert {d for name, d in splits if name == "train"} == {d.doc_id for d in all_docs} - set(heldout)
        return check

    with pipeline() as p:
        twelve = p | "Twelve" >> beam.Create(docs) | "Split12" >> CreateInstances(split, InstanceSettings(seq_len=32), vocab)
        assert_that(twelve, splits_are(lowest, docs), label="Check12")
        nine = p | "Nine" >> beam.Create(docs[:9]) | "Split9" >> CreateInstances(split, InstanceSettings(seq_len=32), vocab)
        assert_that(nine, splits_are([], docs[:9]), label="Check9")


def test_a_buckets_output_does_not_depend_on_arrival_order(data_dir):
    """The runner delivers a bucket's documents in any order; random B segments are drawn by index into them."""
    from pipeline.nsp import _BucketInstancesFn

    vocab = MaskingVocab.from_vocab_file(data_dir / "vocab" / "bert-base-uncased-vocab.txt")
    a, b, c = _synthetic_docs(3)
    fn = _BucketInstancesFn(SplitSettings(seed=3, heldout_fraction=0.0, docs_per_bucket=8, dupe_factor=2),
                            InstanceSettings(seq_len=32, short_seq_prob=0.0), vocab)
    fn.setup()

    def run(docs):
        batch = InstanceBatch.concat([b for _, b in fn.process((("train", 0), docs))]).sorted_by_key()
        return [(batch.doc_ids[r], batch.instance(r).input_ids.tolist(), batch.instance(r).masked_lm_positions.tolist())
                for r in range(len(batch))]

    assert run([a, b, c]) == run([c, a, b]) == run([b, c, a])


def _instance(doc: str, n: int) -> Instance:
    return Instance(doc, np.arange(n, dtype=np.int32), np.zeros(n, dtype=np.int8), np.array([1], dtype=np.int32),
                    np.array([7], dtype=np.int32), n % 2)


def _batch(keys, instances) -> InstanceBatch:
    return InstanceBatch.from_instances(keys, instances)


def test_write_shards_balanced_sorted_and_complete(tmp_path):
    # Three batches, in no key order: each spreads over every shard, and shards sort their rows.
    ks = [list(range(k, 200, 3)) for k in (2, 0, 1)]
    elements = [("train", _batch([(k, f"d{k % 7}", 0, k) for k in part], [_instance(f"d{k % 7}", 3 + k % 5) for k in part]))
                for part in ks]
    elements.append(("heldout", _batch([(5, "h", 0, 0)], [_instance("h", 4)])))

    def check(infos):
        infos = sorted(infos, key=lambda s: s["path"])
        assert [s["path"] for s in infos] == [shard_name("heldout", 0, 1, "arrow")] + [
            shard_name("train", i, 4, "arrow") for i in range(4)
        ]
        assert [s["num_instances"] for s in infos] == [1, 50, 50, 50, 50]

    with pipeline() as p:
        infos = p | beam.Create(elements) | WriteShards(str(tmp_path), "arrow", num_shards=4)
        assert_that(infos, check)
    table = read_shard(tmp_path / "train-00001-of-00004.arrow")
    # Rows of shard 1 are the keys = 1 mod 4, in key order.
    assert table.column("doc_id").to_pylist() == [f"d{k % 7}" for k in range(1, 200, 4)]
    assert table.column("length").to_pylist() == [3 + k % 5 for k in range(1, 200, 4)]
    assert str(table.schema.field("input_ids").type) == "list<item: int32>"


def test_write_shards_makes_empty_shards(tmp_path):
    elements = [("train", _batch([(0, "d", 0, 0)], [_instance("d", 3)]))]
    with pipeline() as p:
        infos = p | beam.Create(elements) | WriteShards(str(tmp_path), "parquet", num_shards=3)
        assert_that(infos | beam.Map(lambda s: (s["path"], s["num_instances"])), equal_to(
            [("train-00000-of-00003.parquet", 1), ("train-00001-of-00003.parquet", 0), ("train-00002-of-00003.parquet", 0)]))
    assert read_shard(tmp_path / "train-00002-of-00003.parquet").num_rows == 0


def test_count_words(tmp_path):
    docs = [RawDocument("a", ["The cat sat. The cat ran!"]), RawDocument("b", ["the CAT, once."])]
    with pipeline() as p:
        counts = p | beam.Create(docs) | CountWords(lowercase=True, min_frequency=2)
        assert_that(counts, equal_to([("the", 3), ("cat", 3), (".", 2)]))
        # The job writes the counts as JSON pairs, one per line; read_count_files must read them back.
        _ = counts | beam.Map(json.dumps) | beam.io.WriteToText(str(tmp_path / "word_counts"), file_name_suffix=".jsonl")
    written = sorted(str(f) for f in tmp_path.glob("word_counts*.jsonl"))
    assert sorted(read_count_files(written)) == sorted([("the", 3), ("cat", 3), (".", 2)])


def test_words_longer_than_wordpiece_reads_are_counted_not_given_to_the_trainer():
    # Such a word is one [UNK] when the corpus is tokenized, and the trainer's time grew with the square
    # of its length (a 400k-character DNA string seen twice: minutes).
    from pipeline.corpus_job import _counters

    dna = "acgt" * 40
    docs = [RawDocument("a", [f"The {dna} cat. The {dna} cat and {'x' * 100} twice, {'x' * 100}."])]
    p = pipeline()
    counts = p | beam.Create(docs) | CountWords(lowercase=True, min_frequency=2)
    assert_that(counts, equal_to([("the", 2), ("cat", 2), (".", 2), ("x" * 100, 2)]))
    result = p.run()
    result.wait_until_finish()
    assert _counters(result)["vocab_words_too_long"] == 2


def test_duplicate_doc_ids_do_not_make_output_depend_on_arrival_order(data_dir):
    """Two files can give documents the same id (`wiki_00:0` in two directories): the bucket's
    output must not depend on the order the runner delivers them in, and ids stay unique."""
    from pipeline.nsp import _BucketInstancesFn, _content_digest

    vocab = MaskingVocab.from_vocab_file(data_dir / "vocab" / "bert-base-uncased-vocab.txt")
    a, b, c = _synthetic_docs(3)
    twin = TokenizedDocument(a.doc_id, b.ids, b.ends)  # same id as `a`, other text
    fn = _BucketInstancesFn(SplitSettings(seed=3, heldout_fraction=0.0, docs_per_bucket=8, dupe_factor=2),
                            InstanceSettings(seq_len=32, short_seq_prob=0.0), vocab)
    fn.setup()

    def run(docs):
        batch = InstanceBatch.concat([b for _, b in fn.process((("train", 0), docs))]).sorted_by_key()
        keys = list(zip(batch.order.tolist(), batch.doc_ids, batch.dupes.tolist(), batch.indexes.tolist()))
        rows = [batch.instance(r) for r in range(len(batch))]
        return [(key, inst.doc_id, inst.input_ids.tolist(), inst.masked_lm_positions.tolist()) for key, inst in zip(keys, rows)]

    first = run([a, twin, c])
    assert first == run([twin, c, a]) == run([c, a, twin])
    assert {doc_id for _, doc_id, _, _ in first} == {a.doc_id, f"{a.doc_id}~{_content_digest(twin).hex()[:16]}", c.doc_id}
    assert len({key for key, _, _, _ in first}) == len(first)  # shard sort keys never tie


def test_renamed_duplicate_ids_never_meet_a_real_id():
    """`a`, `a`, `a~1`: a counter named the second `a` as the third document, so the two shared
    seeds and shard sort keys, and their rows' order followed the runner. The same text given
    twice more under one id gets a name of its own each time."""
    from pipeline.nsp import _content_digest, _unique_ids

    a, b, c = _synthetic_docs(3)
    docs = [TokenizedDocument("a", a.ids, a.ends), TokenizedDocument("a", b.ids, b.ends),
            TokenizedDocument("a~1", c.ids, c.ends), TokenizedDocument("a", b.ids, b.ends)]
    ids = _unique_ids(docs)
    assert len(set(ids)) == 4
    digest_b = _content_digest(docs[1]).hex()[:16]
    assert sorted(ids) == sorted(["a", "a~1", f"a~{digest_b}", f"a~{digest_b}.2"])
    # A real document named as a renamed one would be is not met either.
    docs = [TokenizedDocument("a", a.ids, a.ends), TokenizedDocument("a", b.ids, b.ends),
            TokenizedDocument(f"a~{digest_b}", c.ids, c.ends)]
    assert len(set(_unique_ids(docs))) == 3
