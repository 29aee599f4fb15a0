"""The no-context masked-LM level: what a held-out MLM accuracy is compared with (pipeline/mlm_baseline.py)."""

from __future__ import annotations

import json

import numpy as np
import pytest
from pipeline.corpus_info import open_corpus
from pipeline.loader import ShardedSplit
from pipeline.mlm_baseline import no_context_mlm_accuracy


def _targets(corpus, split):
    data = ShardedSplit(corpus, split)
    samples = data.samples(np.arange(len(data)))
    target = np.concatenate([s["masked_lm_ids"] for s in samples])
    shown = np.concatenate([s["input_ids"][s["masked_lm_positions"]] for s in samples])
    return target, shown


def test_no_context_level_counts_the_targets_bert_leaves_visible(small_corpus, tmp_path):
    mask_id = open_corpus(small_corpus).vocab.tokens.index("[MASK]")
    train, _ = _targets(small_corpus, "train")
    target, shown = _targets(small_corpus, "heldout")
    common = np.bincount(train).argmax()
    level = no_context_mlm_accuracy(small_corpus)

    masked = shown == mask_id
    assert level.masked_share == pytest.approx(masked.mean()) and 0.7 < level.masked_share < 0.9  # BERT's 80%
    assert level.unigram == pytest.approx(np.mean(target == common)) and 0.01 < level.unigram < 0.2  # "the", ","
    # Copying the visible token is right at the ~10% kept as they were (never at [MASK]) ...
    kept = ~masked & (shown == target)
    assert 0.05 < kept.mean() < 0.15
    # ... so the no-context level sits near 10% + 0.8 x unigram, far above the unigram rate alone.
    assert level.no_context == pytest.approx(kept.mean() + np.mean(masked & (target == common)))
    assert level.no_context > level.unigram + 0.05
    assert ShardedSplit(small_corpus, "train").masked_token_counts().sum() == len(train)
    assert level.unigram_at_mask == pytest.approx(np.mean(target[masked] == common))

    # NSP's chance level: what always the corpus's commoner label scores on the held-out pairs (not 0.5 where
    # most are random, as at seq 32: the demo's loss.png drew 0.5 under a model at 0.80 that had learned nothing).
    counters = open_corpus(small_corpus).manifest["counters"]
    commoner = int(counters["instances_random_next"] > counters["instances"] / 2)
    held = ShardedSplit(small_corpus, "heldout")
    labels = np.array([int(s["next_sentence_label"]) for s in held.samples(np.arange(len(held)))])
    assert level.nsp_majority == pytest.approx(np.mean(labels == commoner)) and 0 < level.nsp_majority < 1

    # On the first instances only, as a run's evaluation scores them (log.eval_samples).
    first = ShardedSplit(small_corpus, "heldout").samples(np.arange(40))
    few = np.concatenate([s["masked_lm_ids"] for s in first])
    assert no_context_mlm_accuracy(small_corpus, max_samples=40).unigram == pytest.approx(np.mean(few == common))

    # A corpus without a held-out split: told how to build one.
    import shutil

    bare = tmp_path / "no_heldout"
    shutil.copytree(small_corpus, bare)
    manifest = json.loads((bare / "manifest.json").read_text())
    for shard in [s for s in manifest["shards"] if s["split"] == "heldout"]:
        manifest["shards"].remove(shard)
        manifest["num_instances"] -= shard["num_instances"]  # as a corpus built without a held-out split says
        (bare / shard["path"]).unlink()
    (bare / "manifest.json").write_text(json.dumps(manifest))
    with pytest.raises(ValueError, match="no held-out masked tokens; build it with --heldout-fraction > 0"):
        no_context_mlm_accuracy(bare)
