"""A corpus directory read and validated once: `open_corpus(dir) -> CorpusInfo`.

The manifest (strictly), its sha256, the vocabulary (checked against the manifest's sha256 and
size, casing as the corpus job decided it) and the shard list, resolved in one place and passed on:
the trainer's preflight, the loader's splits and its dynamic masking all take this object instead
of reading the directory again (the manifest used to be read four times per rank).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pipeline.manifest import read_manifest, sha256_file
from pipeline.vocab import Vocab

# What the loader and trainer use; format version 1 always writes them, so no defaults restated.
REQUIRED_KEYS = ("seq_len", "masked_lm_prob", "max_predictions", "whole_word_mask", "lowercase", "vocab_file",
                 "vocab_size", "num_instances", "shards")
SPLITS = ("train", "heldout")


@dataclass(frozen=True)
class CorpusInfo:
    dir: Path
    manifest: dict[str, Any]
    manifest_sha256: str  # what a checkpoint records, so a resume can refuse another corpus
    vocab_file: Path
    vocab: Vocab

    @property
    def seq_len(self) -> int:
        return int(self.manifest["seq_len"])

    def shards(self, split: str) -> list[dict[str, Any]]:
        return [s for s in self.manifest["shards"] if s["split"] == split]

    def num_instances(self, split: str = "train") -> int:
        return sum(int(s["num_instances"]) for s in self.shards(split))

    def check_fits(self, global_batch_size: int, split: str = "train") -> None:
        """The one "fewer than one global batch" check (an epoch would hold no optimizer step)."""
        n = self.num_instances(split)
        if n < global_batch_size:
            raise ValueError(f"the corpus {self.dir} is too small: {n} {split} instances, fewer than one global "
                             f"batch ({global_batch_size}); build it from more input (or a higher --dupe-factor), "
                             "or lower data.global_batch_size")


def open_corpus(corpus_dir: str | Path) -> CorpusInfo:
    """Read and validate a corpus directory written by `bertpipe corpus --out`."""
    corpus_dir = Path(corpus_dir)
    manifest = read_manifest(corpus_dir)
    missing = [k for k in REQUIRED_KEYS if k not in manifest]
    if missing:
        raise ValueError(f"{corpus_dir / 'manifest.json'} lacks {', '.join(missing)}; rebuild the corpus")
    bad = sorted({str(s.get("split")) for s in manifest["shards"]} - set(SPLITS))
    if bad:
        raise ValueError(f"{corpus_dir / 'manifest.json'} lists shards of split(s) {', '.join(bad)}; "
                         f"expected {' or '.join(SPLITS)}; rebuild the corpus")
    vocab_file = corpus_dir / manifest["vocab_file"]
    if not vocab_file.is_file():
        raise ValueError(f"{vocab_file} is missing; the corpus directory must hold the vocabulary it was built with")
    if manifest.get("vocab_sha256") and sha256_file(vocab_file) != manifest["vocab_sha256"]:
        raise ValueError(f"{vocab_file} is not the vocabulary the shards were built with (sha256 differs from "
                         f"manifest.json's vocab_sha256); restore the corpus's own vocab.txt or rebuild the corpus")
    vocab = Vocab.read(vocab_file, lowercase=bool(manifest["lowercase"]))
    if vocab.size != int(manifest["vocab_size"]):
        raise ValueError(f"{vocab_file} has {vocab.size} tokens but manifest.json says vocab_size "
                         f"{manifest['vocab_size']}; restore the corpus's own vocab.txt or rebuild the corpus")
    return CorpusInfo(corpus_dir, manifest, sha256_file(corpus_dir / "manifest.json"), vocab_file, vocab)
