"""Sentences (blingfire) and WordPiece ids (HF `tokenizers`): the `TokenizeDocuments` PTransform.

The vocabulary travels inside the DoFn as text (a few hundred KB), so workers on a remote runner
need no access to the driver's files; the tokenizer itself is built once per worker in `setup()`.
"""

from __future__ import annotations

import ctypes
import itertools
import logging
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

import apache_beam as beam
import blingfire
import numpy as np
from apache_beam.metrics import Metrics
from apache_beam.transforms.window import GlobalWindows

from pipeline.instances import id_dtype
from pipeline.progress import ProgressWriter
from pipeline.readers import RawDocument, Skip
from pipeline.sources import DEAD_LETTER
from pipeline.vocab import build_tokenizer

log = logging.getLogger(__name__)
# Sentences per `encode_batch` call: large enough that per-call overhead vanishes and the Rust side
# can spread one call over threads; small enough (~1 MB of text) to bound a worker's memory.
BATCH_SENTENCES = 8192


class SentenceViews(Sequence):
    """A document's sentences, each a view into its id array, made when asked for.

    A view object costs ~100 bytes, about what a 25-token sentence's ids cost as uint16: making
    them on access rather than all at once keeps a bucket's memory at its ids.
    """

    def __init__(self, ids: np.ndarray, ends: np.ndarray):
        self.ids = ids
        self.ends = ends

    def __len__(self) -> int:
        return int(self.ends.size)

    def __getitem__(self, j: int) -> np.ndarray:
        ends = self.ends  # on the NSP hot path: numpy raises the IndexError past the end
        if j < 0:
            j += ends.size
            if j < 0:
                raise IndexError(f"sentence {j - ends.size} of {ends.size}")
        return self.ids[ends[j - 1] if j else 0 : ends[j]]

    def __iter__(self):
        start = 0
        for end in self.ends.tolist():
            yield self.ids[start:end]
            start = end


@dataclass(frozen=True)
class TokenizedDocument:
    """A document as WordPiece ids: every sentence's ids in one array, cut at `ends`.

    One flat array rather than an array per sentence: a runner encodes a document as two buffers,
    not thousands of small ones (that per-array cost was a large share of the job). Empty sentences
    are dropped. Ids are uint16 when they fit (`id_dtype`); every consumer widens them on use (the
    NSP pairing concatenates them with int32 `[CLS]`/`[SEP]`), so the dtype never reaches the shards.
    Legend: T = tokens, S = sentences.
    """

    doc_id: str
    ids: np.ndarray  # [T] uint16 or int32
    ends: np.ndarray  # [S] int64, where each sentence ends in `ids`

    @classmethod
    def from_sentences(cls, doc_id: str, sentences: Sequence[np.ndarray]) -> TokenizedDocument:
        kept = [np.asarray(s) for s in sentences if len(s)]
        ids = np.concatenate(kept) if kept else np.zeros(0, dtype=np.int32)
        ids = ids.astype(id_dtype(int(ids.max(initial=0))))
        return cls(doc_id, ids, np.cumsum([s.size for s in kept], dtype=np.int64))

    @property
    def sentences(self) -> SentenceViews:
        """One view into `ids` per sentence (made on access)."""
        return SentenceViews(self.ids, self.ends)

    @property
    def num_tokens(self) -> int:
        return int(self.ids.size)


class SentenceSplitter:
    """`blingfire.text_to_sentences` with one reused output buffer: the same bytes, less overhead.

    blingfire allocates a zeroed ctypes buffer of twice the input per call, a new ctypes array type
    for each new size (~30 us per paragraph, a third of the split). This calls the same C function
    on a buffer that only grows, and reads what it wrote exactly as blingfire does (up to the first
    NUL, or '' on an error). One per DoFn instance (or per caller): the buffer is not shared.
    Transcribed from blingfire 0.1.8's `text_to_sentences` (pinned in pyproject.toml); a test compares
    the two on the bundled text.
    """

    def __init__(self) -> None:
        self._buffer = ctypes.create_string_buffer(1 << 16)
        self._c_function = blingfire.blingfire.TextToSentences

    def __call__(self, text: str) -> str:
        data = text.encode("utf-8")
        size = len(data) * 2  # the output size blingfire passes, whatever the buffer's capacity
        if size > len(self._buffer):
            self._buffer = ctypes.create_string_buffer(max(size, 2 * len(self._buffer)))
        out_len = self._c_function(ctypes.c_char_p(data), ctypes.c_int(len(data)),
                                   ctypes.byref(self._buffer), ctypes.c_int(size))
        if out_len == -1 or out_len > size:
            return ""
        return ctypes.string_at(self._buffer, out_len).split(b"\0", 1)[0].decode("utf-8")


def split_sentences(document: RawDocument, splitter: SentenceSplitter | None = None) -> list[str]:
    """A document's non-blank sentences: its segments as they are when presplit, else blingfire's."""
    if document.presplit:
        return [s for s in document.segments if s.strip()]
    split = splitter or blingfire.text_to_sentences
    sentences: list[str] = []
    for paragraph in document.segments:
        if paragraph.strip():
            sentences.extend(s for s in split(paragraph).split("\n") if s.strip())
    return sentences


class _TokenizeFn(beam.DoFn):
    """Sentence-splits documents and feeds their sentences to `encode_batch` in large batches.

    Documents are held until about `BATCH_SENTENCES` sentences are waiting (or the bundle ends), so
    a stream of short documents (JSONL lines, stub articles) still makes few large tokenizer calls.
    Each document's ids depend only on its own sentences, so where a batch is cut changes nothing.
    """

    def __init__(self, vocab_text: str, lowercase: bool, progress_dir: str | None = None):
        self.vocab_text = vocab_text
        self.lowercase = lowercase
        self.progress_dir = progress_dir
        self.tokenizer = None
        self.sentence_count = Metrics.counter("corpus", "sentences")
        self.token_count = Metrics.counter("corpus", "tokens")
        # How well the vocabulary fits the text: a wrong vocab turns most of it into [UNK] (see corpus_job).
        self.unk_count = Metrics.counter("corpus", "unk_tokens")

    def setup(self) -> None:
        self.tokenizer = build_tokenizer(self.vocab_text, self.lowercase, specials_in_text=False)
        self.unk_id = self.tokenizer.token_to_id("[UNK]")
        self.id_dtype = id_dtype(max(self.tokenizer.get_vocab(with_added_tokens=True).values()))
        self.progress = ProgressWriter(self.progress_dir, "tokenize")
        self.splitter = SentenceSplitter()
        # The same ids without the character offsets `encode_batch` also computes (tokenizers >= 0.21, on
        # the wrapped `tokenizers.Tokenizer`); the wrapper's own call where that is missing.
        inner = getattr(self.tokenizer, "_tokenizer", None)
        self.encode_batch = getattr(inner, "encode_batch_fast", None) or self.tokenizer.encode_batch

    def start_bundle(self) -> None:
        self.pending: list[tuple[str, str, list[str]]] = []  # (doc_id, source, sentences)
        self.pending_sentences = 0

    def process(self, document: RawDocument) -> Iterable:
        sentences = split_sentences(document, self.splitter)
        # Not the document: its text would stay held beside its sentences until the batch is encoded.
        self.pending.append((document.doc_id, document.source, sentences))
        self.pending_sentences += len(sentences)
        if self.pending_sentences >= BATCH_SENTENCES:
            yield from self._flush()

    def finish_bundle(self) -> Iterable:
        for out in self._flush():
            if isinstance(out, beam.pvalue.TaggedOutput):
                yield beam.pvalue.TaggedOutput(out.tag, GlobalWindows.windowed_value(out.value))
            else:
                yield GlobalWindows.windowed_value(out)
        self.progress.flush()

    def teardown(self) -> None:
        if self.tokenizer is not None:
            self.progress.flush()

    def _flush(self) -> Iterable:
        pending, self.pending, self.pending_sentences = self.pending, [], 0
        flat = [s for _, _, sentences in pending for s in sentences]
        id_lists = [e.ids for e in self.encode_batch(flat, add_special_tokens=False)] if flat else []
        lengths = np.fromiter(map(len, id_lists), dtype=np.int64, count=len(id_lists))
        ids = np.fromiter(itertools.chain.from_iterable(id_lists), dtype=self.id_dtype, count=int(lengths.sum()))
        ends = np.cumsum(lengths)
        if ids.size:
            self.unk_count.inc(int(np.count_nonzero(ids == self.unk_id)))
        first = 0
        for doc_id, source, sentences in pending:
            last = first + len(sentences)
            doc_lengths = lengths[first:last]
            start = int(ends[first - 1]) if first else 0
            doc_ids = ids[start : int(ends[last - 1])] if last > first else ids[:0]
            first = last
            if not doc_ids.size:
                Metrics.counter("corpus", "skipped_empty_document").inc()
                # Its file's path, as every other dead letter has: the base name in its id alone was not enough.
                yield beam.pvalue.TaggedOutput(DEAD_LETTER, Skip(source, doc_id, "empty_document", "no tokens"))
                continue
            kept = doc_lengths[doc_lengths > 0]  # sentences with no WordPiece (only control characters)
            self.sentence_count.inc(int(kept.size))
            self.token_count.inc(int(doc_ids.size))
            self.progress.add(documents=1, sentences=int(kept.size), tokens=int(doc_ids.size))
            # A copy, so the document does not keep the whole batch's id array alive.
            yield TokenizedDocument(doc_id, doc_ids.copy(), np.cumsum(kept))


class TokenizeDocuments(beam.PTransform):
    """`RawDocument`s -> `TokenizedDocument`s (main) and empty documents (tagged `dead_letter`)."""

    def __init__(self, vocab_text: str, lowercase: bool, progress_dir: str | None = None):
        super().__init__()
        self.vocab_text = vocab_text
        self.lowercase = lowercase
        self.progress_dir = progress_dir

    def expand(self, documents):
        return documents | "SentencesAndWordPiece" >> beam.ParDo(
            _TokenizeFn(self.vocab_text, self.lowercase, self.progress_dir)
        ).with_outputs(DEAD_LETTER, main="documents")
