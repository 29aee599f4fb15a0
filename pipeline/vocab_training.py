"""WordPiece vocabulary trained on the input (`--train-vocab-size`), in two steps that scale apart.

1. `CountWords` (Beam): BERT's normalizer and pre-tokenizer split every sentence into words; words
   are counted with `CombinePerKey(sum)`, distributed like any word count, and only words seen at
   least `min_frequency` times leave the job. Work grows with the corpus, memory with the number of
   distinct words per worker.
2. `train_wordpiece` (driver): HF `tokenizers`' WordPiece trainer over the word-count table. Its
   cost grows with the number of distinct words, not the corpus: counts are scaled so that about
   `max_trainer_words` word occurrences are fed, which keeps relative frequencies (what the merges
   depend on) and bounds the driver's time. A scaled count is rounded up or down at random, by a hash
   of the word: every word keeps its expected frequency, so the many rare words keep their share (fed
   at least once each, on two bundled books scaled 100x, words seen under 100 times were 32% of the
   text and 87% of what the trainer saw).
"""

from __future__ import annotations

import hashlib
import json
import math
from typing import Iterable, Iterator

import apache_beam as beam
from apache_beam.metrics import Metrics

from pipeline.readers import RawDocument
from pipeline.tokenize import split_sentences

SPECIAL_TOKENS = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]


# WordPiece's longest word (`max_input_chars_per_word`, BERT's and tokenizers' 100): a longer one is
# one [UNK] when the corpus is tokenized, whatever the vocabulary.
MAX_WORD_CHARS = 100


class _WordsFn(beam.DoFn):
    def __init__(self, lowercase: bool):
        self.lowercase = lowercase
        self.tok = None
        self.too_long = Metrics.counter("corpus", "vocab_words_too_long")

    def setup(self) -> None:
        from tokenizers import BertWordPieceTokenizer

        self.tok = BertWordPieceTokenizer(lowercase=self.lowercase, strip_accents=self.lowercase)

    def process(self, doc: RawDocument) -> Iterable:
        counts: dict[str, int] = {}
        for sentence in split_sentences(doc):
            normalized = self.tok.normalizer.normalize_str(sentence)
            for word, _ in self.tok.pre_tokenizer.pre_tokenize_str(normalized):
                if len(word) > MAX_WORD_CHARS:
                    # Not for the trainer: its time grows with the square of a word's length (a DNA string or
                    # hex dump seen twice, 400k characters, took minutes), and it can only become [UNK].
                    self.too_long.inc()
                    continue
                counts[word] = counts.get(word, 0) + 1
        yield from counts.items()


class CountWords(beam.PTransform):
    """`RawDocument`s -> `(word, count)` for words seen at least `min_frequency` times."""

    def __init__(self, lowercase: bool, min_frequency: int = 2):
        super().__init__()
        self.lowercase = lowercase
        self.min_frequency = min_frequency

    def expand(self, docs):
        min_frequency = self.min_frequency
        return (
            docs
            | "Words" >> beam.ParDo(_WordsFn(self.lowercase))
            | "Sum" >> beam.CombinePerKey(sum)
            | "Frequent" >> beam.Filter(lambda kv: kv[1] >= min_frequency)
            | "Count" >> beam.Map(_count_distinct)
        )


def _count_distinct(kv):
    Metrics.counter("corpus", "vocab_distinct_words").inc()
    return kv


def _dither(word: str) -> float:
    """A number in [0, 1) fixed by the word: deterministic rounding that is unbiased over many words."""
    return int.from_bytes(hashlib.blake2b(word.encode("utf-8"), digest_size=8).digest(), "big") / 2.0**64


def _scaled_text(counts: list[tuple[str, int]], max_words: int) -> Iterator[str]:
    total = sum(c for _, c in counts)
    scale = max(1.0, total / max_words)
    for word, count in counts:
        # Unscaled (a corpus under max_words) every count is exact; scaled, a word below the scale goes in
        # once or not at all, in proportion to its count.
        repeat = count if scale == 1.0 else math.floor(count / scale + _dither(word))
        # Lines of bounded size so the trainer never sees a giant string.
        while repeat > 0:
            n = min(repeat, 4096)
            yield " ".join([word] * n)
            repeat -= n


def _alphabet(counts: list[tuple[str, int]], limit: int) -> list[str]:
    """The `limit` most frequent characters (ties by character), sorted."""
    chars: dict[str, int] = {}
    for word, count in counts:
        for ch in word:
            chars[ch] = chars.get(ch, 0) + count
    return sorted(sorted(chars, key=lambda ch: (-chars[ch], ch))[:limit])


def train_wordpiece(
    counts: list[tuple[str, int]], vocab_size: int, lowercase: bool, min_frequency: int = 2,
    max_trainer_words: int = 20_000_000, limit_alphabet: int = 1000,
) -> list[str]:
    """Vocabulary tokens in id order (`[PAD]` first, as BERT's), trained from a word-count table.

    Deterministic: HF's trainer numbers `##x` pieces in hash-map order and breaks ties between
    equally frequent merges by those numbers, so two runs on the same text can differ. Fixing the
    alphabet and giving every `##x` a fixed id up front (as extra leading tokens) makes every tie
    break the same way, hence the same vocabulary, hence the same shards.
    """
    from tokenizers import BertWordPieceTokenizer

    if not counts:
        raise ValueError("no word occurs often enough to train a vocabulary; give more text or a --vocab file")
    counts = sorted(counts)  # the trainer sees the same stream whatever the runner delivered
    alphabet = _alphabet(counts, limit_alphabet)
    fixed = SPECIAL_TOKENS + [f"##{ch}" for ch in alphabet]
    if vocab_size <= len(fixed) + len(alphabet):
        raise ValueError(
            f"--train-vocab-size {vocab_size} leaves no room for word pieces: the text has {len(alphabet)} characters; "
            f"use at least {len(fixed) + len(alphabet) + 100}"
        )
    tok = BertWordPieceTokenizer(lowercase=lowercase, strip_accents=lowercase)
    tok.train_from_iterator(
        _scaled_text(counts, max_trainer_words),
        vocab_size=vocab_size,
        min_frequency=1,  # already applied to the true counts in CountWords
        special_tokens=fixed,
        initial_alphabet=alphabet,
        limit_alphabet=len(alphabet),
        show_progress=False,
    )
    vocab = tok.get_vocab()
    return [tok_ for tok_, _ in sorted(vocab.items(), key=lambda kv: kv[1])]


def read_count_files(paths: Iterable[str]) -> list[tuple[str, int]]:
    from apache_beam.io.filesystems import FileSystems

    counts = []
    for path in paths:
        with FileSystems.open(path) as f:
            for line in f:
                if line.strip():
                    word, count = json.loads(line)
                    counts.append((word, int(count)))
    return counts
