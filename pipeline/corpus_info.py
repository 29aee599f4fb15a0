"""A corpus directory read and validated once: `open_corpus(dir) -> CorpusInfo`.

The manifest (strictly), its sha256, the vocabulary (checked against the manifest's sha256 and
size, casing as the corpus job decided it) and the shard list, resolved in one place and passed on:
the trainer's preflight, the loader's splits and its dynamic masking all take this object instead
of reading the directory again (the manifest used to be read four times per rank).
"""

from __future__ import annotations

import hashlib
import json
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pipeline.manifest import read_manifest, sha256_file
from pipeline.vocab import Vocab

# What the loader and trainer use; format version 1 always writes them, so no defaults restated.
REQUIRED_KEYS = ("seq_len", "masked_lm_prob", "max_predictions", "whole_word_mask", "lowercase", "vocab_file",
                 "vocab_size", "vocab_sha256", "num_instances", "shards")
# Their types (the shards' own are SHARD_KEYS): a hand-edited `"vocab_file": null` was a TypeError traceback,
# `"lowercase": "no"` read as true.
_KINDS = {"seq_len": int, "masked_lm_prob": (int, float), "max_predictions": int, "whole_word_mask": bool,
          "lowercase": bool, "vocab_file": str, "vocab_size": int, "vocab_sha256": str, "num_instances": int}
SHARD_KEYS = {"path": str, "split": str, "num_instances": int, "sha256": str}
_OF_N = re.compile(r"-of-(\d+)\.")  # train-00003-of-00016.arrow
SPLITS = ("train", "heldout")


@dataclass(frozen=True)
class CorpusInfo:
    dir: Path
    manifest: dict[str, Any]
    manifest_sha256: str  # what a checkpoint records, so a resume can refuse another corpus
    vocab_file: Path
    vocab: Vocab

    @property
    def data_sha256(self) -> str:
        """What the shards hold and how they were made, without where (the manifest also records its
        --out and input paths): a byte-identical rebuild elsewhere has the same one, another corpus not."""
        m = self.manifest
        content = {k: m[k] for k in REQUIRED_KEYS if k not in ("vocab_file", "shards")}
        content["shards"] = sorted((s["path"], s["split"], s["num_instances"], s["sha256"]) for s in m["shards"])
        return hashlib.sha256(json.dumps(content, sort_keys=True).encode("utf-8")).hexdigest()

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
    wrong = [k for k, kind in _KINDS.items() if not isinstance(manifest[k], kind)
             or (kind is not bool and isinstance(manifest[k], bool)) or (kind is int and manifest[k] < 0)]
    if wrong:
        raise ValueError(f"{corpus_dir / 'manifest.json'}: {wrong[0]} is {manifest[wrong[0]]!r}, not a valid value "
                         "(edited by hand?); restore the corpus's own manifest.json or rebuild the corpus")
    _check_shard_list(corpus_dir / "manifest.json", manifest)
    if _outside(manifest["vocab_file"]):
        raise ValueError(f"{corpus_dir / 'manifest.json'}: vocab_file {manifest['vocab_file']!r} lies outside the "
                         "corpus directory; rebuild the corpus")
    vocab_file = corpus_dir / manifest["vocab_file"]
    if not vocab_file.is_file():
        raise ValueError(f"{vocab_file} is missing; the corpus directory must hold the vocabulary it was built with")
    if sha256_file(vocab_file) != manifest["vocab_sha256"]:
        raise ValueError(f"{vocab_file} is not the vocabulary the shards were built with (sha256 differs from "
                         f"manifest.json's vocab_sha256); restore the corpus's own vocab.txt or rebuild the corpus")
    vocab = Vocab.read(vocab_file, lowercase=bool(manifest["lowercase"]))
    if vocab.size != int(manifest["vocab_size"]):
        raise ValueError(f"{vocab_file} has {vocab.size} tokens but manifest.json says vocab_size "
                         f"{manifest['vocab_size']}; restore the corpus's own vocab.txt or rebuild the corpus")
    return CorpusInfo(corpus_dir, manifest, sha256_file(corpus_dir / "manifest.json"), vocab_file, vocab)


def _outside(relative: str) -> bool:
    """A manifest's path that leaves the corpus directory: a shard or vocabulary read from elsewhere."""
    return Path(relative).is_absolute() or ".." in Path(relative).parts


def _check_shard_list(path: Path, manifest: dict[str, Any]) -> None:
    """Each shard entry complete and typed, and the list whole: the counts agree with `num_instances`
    and with the `-of-N` in the shard names (an entry edited out would drop its shard silently)."""
    shards = manifest["shards"]
    if not isinstance(shards, list) or not shards:
        raise ValueError(f"{path}: shards must be a non-empty list of shard entries; rebuild the corpus")
    for i, shard in enumerate(shards):
        wrong = [k for k, kind in SHARD_KEYS.items()
                 if not isinstance(shard, dict) or not isinstance(shard.get(k), kind) or isinstance(shard.get(k), bool)]
        if wrong:
            raise ValueError(f"{path}: shard entry {i} lacks a valid {', '.join(wrong)}; rebuild the corpus")
    bad = sorted({s["split"] for s in shards} - set(SPLITS))
    if bad:
        raise ValueError(f"{path} lists shards of split(s) {', '.join(bad)}; expected {' or '.join(SPLITS)}; "
                         "rebuild the corpus")
    paths = [s["path"] for s in shards]
    outside = [p for p in paths if _outside(p)]
    if outside:  # a shard is a file of the corpus directory, never one read from elsewhere
        raise ValueError(f"{path} lists the shard {outside[0]}, outside the corpus directory; rebuild the corpus")
    twice = sorted({p for p in paths if paths.count(p) > 1})
    if twice:  # one shard read twice, the one it replaced never
        raise ValueError(f"{path} lists {twice[0]} more than once; a shard entry was edited by hand, rebuild the corpus")
    total = sum(s["num_instances"] for s in shards)
    if total != manifest["num_instances"]:
        raise ValueError(f"{path}: its shards hold {total} instances but num_instances says "
                         f"{manifest['num_instances']}; a shard entry was removed or changed, rebuild the corpus")
    for split in SPLITS:
        named = {int(m.group(1)) for s in shards if s["split"] == split and (m := _OF_N.search(s["path"]))}
        listed = sum(1 for s in shards if s["split"] == split)
        if len(named) == 1 and named != {listed}:
            raise ValueError(f"{path} lists {listed} {split} shard(s) whose names say {named.pop()}; a shard entry "
                             "was removed or added by hand, rebuild the corpus")
