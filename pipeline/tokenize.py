"""Sentences (blingfire) and WordPiece ids (HF `tokenizers`): the `TokenizeDocuments` PTransform.

The vocabulary travels inside the DoFn as text (a few hundred KB), so workers on a remote runner
need no access to the driver's files; the tokenizer itself is built once per worker in `setup()`.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Iterable

import apache_beam as beam
import blingfire
import numpy as np
from apache_beam.metrics import Metrics

from pipeline.readers import RawDocument, Skip
from pipeline.sources import DEAD_LETTER

log = logging.getLogger(__name__)
PROGRESS_EVERY = 1000


@dataclass(frozen=True)
class TokenizedDocument:
    """A document as WordPiece ids, one int32 array per sentence (empty sentences dropped)."""

    doc_id: str
    sentences: list[np.ndarray]

    @property
    def num_tokens(self) -> int:
        return int(sum(s.size for s in self.sentences))


def read_vocab_tokens(vocab_text: str) -> list[str]:
    tokens = [line.rstrip("\r") for line in vocab_text.split("\n")]
    while tokens and tokens[-1] == "":
        tokens.pop()
    return tokens


def vocab_is_cased(tokens: list[str]) -> bool:
    """A cased vocab holds capitalised word pieces; bert-base-uncased holds (almost) none."""
    plain = [t for t in tokens if not (t.startswith("[") and t.endswith("]"))]
    upper = sum(1 for t in plain if any(c.isupper() for c in t))
    return upper > 0.05 * max(1, len(plain))


def build_tokenizer(vocab_text: str, lowercase: bool):
    from tokenizers import BertWordPieceTokenizer

    tokens = read_vocab_tokens(vocab_text)
    return BertWordPieceTokenizer(
        {tok: i for i, tok in enumerate(tokens)},
        lowercase=lowercase,
        strip_accents=lowercase,  # as BERT: accents are stripped exactly for uncased models
        clean_text=True,
        handle_chinese_chars=True,
    )


def split_sentences(document: RawDocument) -> list[str]:
    if document.presplit:
        return [s for s in document.segments if s.strip()]
    sentences: list[str] = []
    for paragraph in document.segments:
        if paragraph.strip():
            sentences.extend(s for s in blingfire.text_to_sentences(paragraph).split("\n") if s.strip())
    return sentences


class _TokenizeFn(beam.DoFn):
    def __init__(self, vocab_text: str, lowercase: bool):
        self.vocab_text = vocab_text
        self.lowercase = lowercase
        self.tokenizer = None
        self.sentence_count = Metrics.counter("corpus", "sentences")
        self.token_count = Metrics.counter("corpus", "tokens")

    def setup(self) -> None:
        self.tokenizer = build_tokenizer(self.vocab_text, self.lowercase)
        self.seen_docs = self.seen_tokens = 0

    def _progress(self, n_tokens: int) -> None:
        # Progress of a long local run; per worker, since counters are only summed at the end.
        self.seen_docs += 1
        self.seen_tokens += n_tokens
        if self.seen_docs % PROGRESS_EVERY == 0:
            log.info("tokenized %d documents, %d tokens (this worker)", self.seen_docs, self.seen_tokens)

    def process(self, document: RawDocument) -> Iterable:
        sentences = split_sentences(document)
        encodings = self.tokenizer.encode_batch(sentences, add_special_tokens=False) if sentences else []
        ids = [np.asarray(e.ids, dtype=np.int32) for e in encodings]
        ids = [s for s in ids if s.size]
        if not ids:
            Metrics.counter("corpus", "skipped_empty_document").inc()
            yield beam.pvalue.TaggedOutput(DEAD_LETTER, Skip("", document.doc_id, "empty_document", "no tokens"))
            return
        doc = TokenizedDocument(document.doc_id, ids)
        self.sentence_count.inc(len(ids))
        self.token_count.inc(doc.num_tokens)
        self._progress(doc.num_tokens)
        yield doc


class TokenizeDocuments(beam.PTransform):
    """`RawDocument`s -> `TokenizedDocument`s (main) and empty documents (tagged `dead_letter`)."""

    def __init__(self, vocab_text: str, lowercase: bool):
        super().__init__()
        self.vocab_text = vocab_text
        self.lowercase = lowercase

    def expand(self, documents):
        return documents | "SentencesAndWordPiece" >> beam.ParDo(
            _TokenizeFn(self.vocab_text, self.lowercase)
        ).with_outputs(DEAD_LETTER, main="documents")
