"""`CreateInstances`: tokenized documents -> masked NSP instances, with bounded memory.

NSP negatives are drawn within a bucket of documents (a `GroupByKey` on a hash of the document
id), never from a global list: a worker holds one bucket (`docs_per_bucket` documents) at a time.
The number of buckets comes from a one-integer side input (the document count). Whole documents
go to the `heldout` split by a hash of (seed, doc id); every random draw comes from a generator
seeded by (seed, doc id, dupe index), so bundling, retries and worker counts cannot change output.
"""

from __future__ import annotations

import hashlib
import math
from dataclasses import dataclass
from typing import Iterable

import apache_beam as beam
import numpy as np
from apache_beam.metrics import Metrics

from pipeline.instance_batch import InstanceBatch
from pipeline.instances import InstanceSettings, create_instances_from_document
from pipeline.masking import MaskingVocab, derive_seed, rng_for
from pipeline.progress import ProgressWriter
from pipeline.tokenize import TokenizedDocument

TRAIN, HELDOUT = "train", "heldout"
_U64 = float(2**64)
# Below this many documents a guaranteed heldout document would take too much of the training text.
MIN_DOCS_FOR_FORCED_HELDOUT = 10
FORCED_HELDOUT = 2  # the lowest-scoring documents that are heldout whatever the fraction (in such corpora)
# Instances per `InstanceBatch` leaving a bucket (~5 MB at seq 512): bounds one element's memory.
BATCH_INSTANCES = 4096


@dataclass(frozen=True)
class SplitSettings:
    seed: int
    heldout_fraction: float
    docs_per_bucket: int
    dupe_factor: int


def heldout_score(seed: int, doc_id: str) -> float:
    """Uniform in [0, 1): a document is heldout when its score is below the heldout fraction."""
    return derive_seed(seed, "heldout", doc_id) / _U64


class _DocStats(beam.CombineFn):
    """(number of documents, the FORCED_HELDOUT lowest (heldout score, doc id), the highest one or None)
    over the whole corpus."""

    def __init__(self, seed: int):
        self.seed = seed

    def create_accumulator(self):
        return (0, (), None)

    def add_input(self, acc, doc_id):
        scored = (heldout_score(self.seed, doc_id), doc_id)
        return (acc[0] + 1, tuple(sorted(acc[1] + (scored,))[:FORCED_HELDOUT]), max(x for x in (acc[2], scored) if x))

    def merge_accumulators(self, accs):
        accs = list(accs)
        highest = [a[2] for a in accs if a[2]]
        return (sum(a[0] for a in accs), tuple(sorted(x for a in accs for x in a[1])[:FORCED_HELDOUT]),
                max(highest) if highest else None)

    def extract_output(self, acc):
        return acc


def assign_split(doc_id: str, stats, settings: SplitSettings) -> str:
    fraction = settings.heldout_fraction
    if fraction <= 0:
        return TRAIN
    n_docs, lowest, highest = stats
    # A few documents could all hash below the fraction: the one scoring highest always trains, else the
    # corpus would have no training instance (and the job report success).
    if highest is not None and doc_id == highest[1]:
        return TRAIN
    if heldout_score(settings.seed, doc_id) < fraction:
        return HELDOUT
    # A small corpus could hash no document, or one, below the fraction; the trainer still needs a heldout
    # set, and its NSP pairs a second document: alone in its bucket, a document's "random" B is its own.
    if n_docs >= MIN_DOCS_FOR_FORCED_HELDOUT and any(doc_id == d for _, d in lowest):
        return HELDOUT
    return TRAIN


def num_buckets(split: str, stats, settings: SplitSettings) -> int:
    n_docs = stats[0]
    share = settings.heldout_fraction if split == HELDOUT else 1.0 - settings.heldout_fraction
    return max(1, math.ceil(n_docs * share / settings.docs_per_bucket))


class _KeyByBucket(beam.DoFn):
    def __init__(self, settings: SplitSettings):
        self.settings = settings

    def process(self, doc: TokenizedDocument, stats) -> Iterable:
        split = assign_split(doc.doc_id, stats, self.settings)
        Metrics.counter("corpus", f"documents_{split}").inc()
        bucket = derive_seed(self.settings.seed, "bucket", doc.doc_id) % num_buckets(split, stats, self.settings)
        yield (split, bucket), doc


class _BucketInstancesFn(beam.DoFn):
    """All dupes of all instances of one bucket; emits `(split, InstanceBatch)`s."""

    def __init__(self, split_settings: SplitSettings, settings: InstanceSettings, vocab: MaskingVocab,
                 progress_dir: str | None = None):
        self.split_settings = split_settings
        self.settings = settings
        self.vocab = vocab
        self.progress_dir = progress_dir
        self.instances = Metrics.counter("corpus", "instances")
        self.random_next = Metrics.counter("corpus", "instances_random_next")
        self.masked = Metrics.counter("corpus", "masked_tokens")
        self.tokens = Metrics.counter("corpus", "instance_tokens")
        self.lonely = Metrics.counter("corpus", "buckets_with_one_document")
        # A sentence longer than a sequence keeps only the sequence's length (as in the original): counted,
        # so that text without sentence ends, which loses nearly all of itself, shows (the CLI warns).
        self.long_sentences = Metrics.counter("corpus", "sentences_longer_than_seq_len")
        self.beyond = Metrics.counter("corpus", "tokens_beyond_seq_len")

    def setup(self) -> None:
        self.progress = ProgressWriter(self.progress_dir, "instances")

    def finish_bundle(self) -> None:
        self.progress.flush()

    def _batch(self, split: str, keys: list, made: list) -> tuple[str, InstanceBatch]:
        batch = InstanceBatch.from_instances(keys, made)
        self.progress.add(instances=len(batch))
        self.instances.inc(len(batch))
        self.random_next.inc(int(batch.next_sentence_labels.sum()))
        self.masked.inc(int(batch.masked_lm_positions.size))
        self.tokens.inc(batch.num_tokens)
        return split, batch

    def _count_long_sentences(self, documents) -> None:
        room = self.settings.seq_len - 3  # [CLS] A [SEP] B [SEP]
        lengths = [s.size for document in documents for s in document]
        over = [n - room for n in lengths if n > room]
        if over:
            self.long_sentences.inc(len(over))
            self.beyond.inc(sum(over))

    def process(self, keyed) -> Iterable:
        (split, _), docs = keyed
        # The runner delivers a bucket's documents in any order; sort so draws never depend on it.
        docs = sorted(docs, key=lambda d: d.doc_id)
        if len(docs) == 1:
            self.lonely.inc()
        doc_ids = _unique_ids(docs)
        sentences = [d.sentences for d in docs]
        self._count_long_sentences(sentences)
        seed = self.split_settings.seed
        keys, made = [], []
        for index, doc_id in enumerate(doc_ids):
            for dupe in range(self.split_settings.dupe_factor):
                rng = rng_for(seed, doc_id, dupe)
                instances = create_instances_from_document(index, sentences, doc_ids, self.settings, self.vocab, rng)
                keys += [(derive_seed(seed, "order", doc_id, dupe, k), doc_id, dupe, k) for k in range(len(instances))]
                made += instances
                # Batches of a bounded size: what they hold, not where they are cut, decides the shards.
                if len(made) >= BATCH_INSTANCES:
                    yield self._batch(split, keys, made)
                    keys, made = [], []
        if made:
            yield self._batch(split, keys, made)


def _content_digest(doc: TokenizedDocument) -> bytes:
    h = hashlib.blake2b(digest_size=16)
    for sentence in doc.sentences:
        h.update(sentence.size.to_bytes(8, "little"))
        h.update(sentence.astype(np.int32, copy=False).tobytes())  # the same digest whatever the id dtype
    return h.digest()


def _unique_ids(docs: list[TokenizedDocument]) -> list[str]:
    """Doc ids of `docs` (sorted by id; re-sorted in place on a clash), unique whatever the arrival order.

    Two inputs can name a document alike (`wiki_00:0` in two directories, a repeated JSONL `id`);
    such documents always share a bucket. Sorted by content, the second and later are renamed
    `id~DIGEST` (their text's digest; `.2`, `.3`, ... for the same text again), so they get their own
    seeds and sort keys and the output stays a function of the input alone. A counter (`id~1`) could
    meet a real document of that name, in this bucket or another, and tie their shard sort keys.
    """
    ids = [d.doc_id for d in docs]
    if len(set(ids)) == len(ids):
        return ids
    digests = {id(d): _content_digest(d) for d in docs}
    docs.sort(key=lambda d: (d.doc_id, digests[id(d)]))
    out, named, taken = [], set(), set(ids)
    for doc in docs:
        name = doc.doc_id
        if name in named:
            Metrics.counter("corpus", "duplicate_doc_ids_renamed").inc()
            name = stem = f"{doc.doc_id}~{digests[id(doc)].hex()[:16]}"
            again = 1
            while name in taken:
                again += 1
                name = f"{stem}.{again}"
        named.add(doc.doc_id)
        taken.add(name)
        out.append(name)
    return out


class CreateInstances(beam.PTransform):
    """`TokenizedDocument`s -> `(split, InstanceBatch)` with `dupe_factor` masks per document."""

    def __init__(self, split_settings: SplitSettings, settings: InstanceSettings, vocab: MaskingVocab,
                 progress_dir: str | None = None):
        super().__init__()
        self.split_settings = split_settings
        self.settings = settings
        self.vocab = vocab
        self.progress_dir = progress_dir

    def expand(self, docs):
        stats = (
            docs
            | "DocIds" >> beam.Map(lambda d: d.doc_id)
            | "CountDocs" >> beam.CombineGlobally(_DocStats(self.split_settings.seed)).without_defaults()
        )
        return (
            docs
            | "KeyByBucket" >> beam.ParDo(_KeyByBucket(self.split_settings), stats=beam.pvalue.AsSingleton(stats))
            | "GroupBuckets" >> beam.GroupByKey()
            | "MakeInstances" >> beam.ParDo(_BucketInstancesFn(self.split_settings, self.settings, self.vocab, self.progress_dir))
        )
