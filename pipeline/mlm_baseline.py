"""The held-out masked-LM accuracy a model reaches without using context: what a run is compared with.

BERT's masked-LM targets show one of three things at their own position (pipeline/masking.py):
`[MASK]` (80%), a random token (10%) or the original token (10%), and the accuracy a run reports
counts all three. A model that has learned nothing about context still sees its own position, so
it scores on the kept 10% by copying what it sees, and on `[MASK]` by guessing the commonest
target: about 10% + 0.8 x the unigram rate, far above the unigram rate alone. Comparing a run with
the unigram rate (as this repo once did) calls a model that only copies "well above chance".
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np

from pipeline.corpus_info import CorpusInfo, open_corpus
from pipeline.loader import ShardedSplit


@dataclass(frozen=True)
class MlmBaseline:
    no_context: float  # held-out accuracy of: the commonest train target at [MASK], the visible token elsewhere
    unigram: float  # held-out accuracy of always the commonest train target
    masked_share: float  # share of held-out targets that show [MASK] (the rest show a token)
    unigram_at_mask: float  # the same as `unigram`, at the targets that show [MASK] only
    # held-out NSP accuracy of always the corpus's commoner label: not 0.5 where most pairs are random, as at
    # seq 32, where BERT pairs a segment that fills its chunk alone with a random one
    nsp_majority: float


def no_context_mlm_accuracy(corpus: CorpusInfo | str | Path, max_samples: int | None = None) -> MlmBaseline:
    """The no-context levels of the corpus's held-out split, under its static masks (those the
    pre-training evaluation scores); `max_samples`: of its first instances only, as a run's
    evaluation takes them (`log.eval_samples`, `pipeline.loader.heldout_batches`)."""
    corpus = corpus if isinstance(corpus, CorpusInfo) else open_corpus(corpus)
    mask_id = corpus.vocab.tokens.index("[MASK]")
    heldout = ShardedSplit(corpus, "heldout")
    samples = heldout.samples(np.arange(min(len(heldout), max_samples or len(heldout))))
    targets = [s["masked_lm_ids"] for s in samples]
    if not sum(len(t) for t in targets):
        raise ValueError(f"{corpus.dir} has no held-out masked tokens; build it with --heldout-fraction > 0")
    target = np.concatenate(targets).astype(np.int64)
    shown = np.concatenate([s["input_ids"][s["masked_lm_positions"]] for s in samples]).astype(np.int64)
    common = int(ShardedSplit(corpus, "train").masked_token_counts().argmax())
    masked = shown == mask_id
    hits = np.where(masked, target == common, shown == target)
    counters = corpus.manifest.get("counters", {})
    random_share = counters.get("instances_random_next", 0) / max(counters.get("instances", 0), 1)
    labels = np.array([int(s["next_sentence_label"]) for s in samples])  # 1: B is a random segment
    nsp_majority = float(np.mean(labels == int(random_share > 0.5)))
    return MlmBaseline(no_context=float(hits.mean()), unigram=float(np.mean(target == common)),
                       masked_share=float(masked.mean()), unigram_at_mask=float(np.mean(target[masked] == common)),
                       nsp_majority=nsp_majority)
