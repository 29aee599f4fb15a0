"""Padding samples into a batch, and dynamic masking: the one home of how a training batch is laid out.

`Collator` pads unpadded instances to the batch's longest (contract in docs/ARCHITECTURE.md,
"Batches") and, with dynamic masking, re-masks each sample from (seed, epoch, sample id) alone, so a
sample's masks do not depend on the world size, the micro-batch or the prefetch depth.
"""

from __future__ import annotations

import hashlib
from typing import Any

import numpy as np
import torch

from pipeline.masking import MaskingVocab, derive_seed, mask_tokens

PCG_INC = 0xDA3E39CB94B95BDB  # fixed odd PCG64 stream increment; the key goes into the state


class Collator:
    """Pads samples to the batch's longest; optionally re-masks them first (dynamic masking)."""

    def __init__(self, manifest: dict[str, Any], vocab: MaskingVocab | None = None, seed: int = 0) -> None:
        self.vocab = vocab
        self.seed = seed
        self.masked_lm_prob = float(manifest["masked_lm_prob"])  # keys checked by `open_corpus`
        self.max_predictions = int(manifest["max_predictions"])
        self.whole_word_mask = bool(manifest["whole_word_mask"])
        # One generator re-keyed per sample: building a fresh PCG64 through SeedSequence costs ~20 us,
        # as much as collating a sample; setting the state of an existing one costs ~3 us.
        self._rng = np.random.Generator(np.random.PCG64(0))
        self._state: dict[str, Any] = {
            "bit_generator": "PCG64", "state": {"state": 0, "inc": PCG_INC}, "has_uint32": 0, "uinteger": 0,
        }

    def _rng_for(self, *parts: object) -> np.random.Generator:
        self._rng.bit_generator.state = {
            "bit_generator": "PCG64", "state": {"state": derive_seed(*parts), "inc": PCG_INC},
            "has_uint32": 0, "uinteger": 0,
        }
        return self._rng

    def remask(self, sample: dict[str, Any], sample_id: int, epoch: int) -> dict[str, Any]:
        """Undo the corpus's static masks and draw new ones from (seed, epoch, sample id)."""
        original = np.array(sample["input_ids"], dtype=np.int32)
        original[sample["masked_lm_positions"]] = sample["masked_lm_ids"]
        masked = mask_tokens(
            original, rng=self._rng_for("dynamic-mask", self.seed, epoch, sample_id), vocab=self.vocab,
            masked_lm_prob=self.masked_lm_prob, max_predictions=self.max_predictions,
            whole_word_mask=self.whole_word_mask,
        )
        return dict(sample, input_ids=masked.input_ids, masked_lm_positions=masked.positions,
                    masked_lm_ids=masked.labels)

    def remasked(self, samples: list[dict[str, Any]], sample_ids: np.ndarray,
                 epochs: np.ndarray) -> dict[str, torch.Tensor]:
        """`self([self.remask(s, i, e) ...], sample_ids)` bit for bit; per sample, only the RNG draws.

        `mask_tokens` (non-whole-word) on sample i, keyed by (seed, epoch, id), draws `keys = random(C)`,
        `action = random(K)`, `repl = integers(0, R, K)` from its own generator (C maskable tokens,
        K to predict; nothing when C = 0), takes the K candidates with the smallest keys, and applies
        the 80/10/10 rule in ascending position order. Here each sample's generator makes the same
        calls (`random(C + K)` yields the same doubles as `random(C)` then `random(K)`: one 64-bit
        draw each, no buffering); restoring, choosing (the K-th smallest key per row as a threshold
        over a [B, L] key matrix), replacing and padding are done once for the whole batch. A tie at
        the threshold (two equal doubles; argpartition's pick would be arbitrary) or whole-word
        masking falls back to the per-sample reference path.
        """
        vocab = self.vocab
        assert vocab is not None
        if self.whole_word_mask or self.max_predictions <= 0 or self.masked_lm_prob <= 0.0:
            return self._remasked_reference(samples, sample_ids, epochs)
        n = len(samples)
        lengths = [len(s["input_ids"]) for s in samples]
        seq = max(lengths)
        input_ids = np.zeros((n, seq), dtype=np.int64)  # [B, L]
        token_type_ids = np.zeros((n, seq), dtype=np.int64)  # [B, L]
        nsp = np.empty(n, dtype=np.int64)
        for i, s in enumerate(samples):  # copy, then undo the corpus's static masks
            row = input_ids[i]
            row[:lengths[i]] = s["input_ids"]
            row[s["masked_lm_positions"]] = s["masked_lm_ids"]
            token_type_ids[i, :lengths[i]] = s["token_type_ids"]
            nsp[i] = s["next_sentence_label"]
        length_col = np.asarray(lengths, dtype=np.int64)[:, None]  # [B, 1]
        attention = np.arange(seq) < length_col  # [B, L] bool
        cand = vocab.is_maskable[input_ids]  # [B, L] bool
        cand &= attention
        n_cand = cand.sum(axis=1)  # [B]
        # mask_tokens: min(max_predictions, max(1, round(C * p))); Python's round and rint both round half to even.
        k = np.minimum(self.max_predictions, np.maximum(1, np.rint(n_cand * self.masked_lm_prob).astype(np.int64)))
        k[n_cand == 0] = 0

        # Per sample: re-key the generator exactly as _rng_for does, and draw.
        rng, bitgen, state, inner = self._rng, self._rng.bit_generator, self._state, self._state["state"]
        num_random = self.vocab.random_ids.size
        prefix = f"dynamic-mask\x1f{self.seed}\x1f"
        blake2b, from_bytes = hashlib.blake2b, int.from_bytes
        draws, repl = [], []
        per_sample = zip(n_cand.tolist(), k.tolist(), np.asarray(sample_ids).tolist(), np.asarray(epochs).tolist())
        for c, kk, sid, ep in per_sample:
            if c == 0:
                continue
            inner["state"] = from_bytes(blake2b(f"{prefix}{ep}\x1f{sid}".encode(), digest_size=8).digest(), "little")
            bitgen.state = state
            draws.append(rng.random(c + kk))
            repl.append(rng.integers(0, num_random, size=kk))
        if not draws:
            return self._remasked_reference(samples, sample_ids, epochs)
        flat = np.concatenate(draws)
        seg = n_cand + k  # [B] draws per sample
        starts = np.cumsum(seg) - seg
        is_key = (np.arange(flat.size) - np.repeat(starts, seg)) < np.repeat(n_cand, seg)
        keys = np.full((n, seq), np.inf)  # [B, L]
        keys[cand] = flat[is_key]  # row-major: each row's candidates in ascending position, as mask_tokens orders them
        ordered = np.sort(keys, axis=1)
        rows = np.arange(n)
        thresh = ordered[rows, np.maximum(k - 1, 0)]
        thresh[k == 0] = -1.0
        nxt = ordered[rows, np.minimum(k, seq - 1)]
        chosen = keys <= thresh[:, None]  # [B, L]
        if ((k < n_cand) & (nxt == thresh)).any() or not np.array_equal(chosen.sum(axis=1), k):
            return self._remasked_reference(samples, sample_ids, epochs)
        pos_r, pos_c = chosen.nonzero()  # row-major: per sample, ascending positions
        labels = input_ids[pos_r, pos_c]
        action = flat[~is_key]
        replacement = vocab.random_ids[np.concatenate(repl)]
        input_ids[pos_r, pos_c] = np.where(action < 0.8, vocab.mask_id, np.where(action < 0.9, labels, replacement))

        num_pred = max(int(k.max()), 1)
        slot = np.arange(pos_r.size) - np.repeat(np.cumsum(k) - k, k)
        positions = np.zeros((n, num_pred), dtype=np.int64)  # [B, P]
        out_labels = np.full((n, num_pred), -100, dtype=np.int64)  # [B, P]
        positions[pos_r, slot] = pos_c
        out_labels[pos_r, slot] = labels
        return {
            "input_ids": torch.from_numpy(input_ids),
            "token_type_ids": torch.from_numpy(token_type_ids),
            "attention_mask": torch.from_numpy(attention.astype(np.int64)),
            "masked_lm_positions": torch.from_numpy(positions),
            "masked_lm_ids": torch.from_numpy(out_labels),
            "next_sentence_label": torch.from_numpy(nsp),
            "sample_index": torch.from_numpy(np.asarray(sample_ids, dtype=np.int64)),
        }

    def _remasked_reference(self, samples: list[dict[str, Any]], sample_ids: np.ndarray,
                            epochs: np.ndarray) -> dict[str, torch.Tensor]:
        """Per sample `remask` (calls `mask_tokens`), then collate: the definition `remasked` must equal."""
        return self([self.remask(s, int(i), int(e)) for s, i, e in zip(samples, sample_ids, epochs)], sample_ids)

    def __call__(self, samples: list[dict[str, Any]], sample_ids: np.ndarray) -> dict[str, torch.Tensor]:
        n = len(samples)
        lengths = [len(s["input_ids"]) for s in samples]
        preds = [len(s["masked_lm_positions"]) for s in samples]
        seq, num_pred = max(lengths), max(max(preds), 1)
        input_ids = np.zeros((n, seq), dtype=np.int64)  # [B, L]
        token_type_ids = np.zeros((n, seq), dtype=np.int64)  # [B, L]
        attention_mask = np.zeros((n, seq), dtype=np.int64)  # [B, L]
        positions = np.zeros((n, num_pred), dtype=np.int64)  # [B, P]
        labels = np.full((n, num_pred), -100, dtype=np.int64)  # [B, P]
        nsp = np.empty(n, dtype=np.int64)
        for i, s in enumerate(samples):
            length, p = lengths[i], preds[i]
            input_ids[i, :length] = s["input_ids"]
            token_type_ids[i, :length] = s["token_type_ids"]
            attention_mask[i, :length] = 1
            positions[i, :p] = s["masked_lm_positions"]
            labels[i, :p] = s["masked_lm_ids"]
            nsp[i] = s["next_sentence_label"]
        return {
            "input_ids": torch.from_numpy(input_ids),
            "token_type_ids": torch.from_numpy(token_type_ids),
            "attention_mask": torch.from_numpy(attention_mask),
            "masked_lm_positions": torch.from_numpy(positions),
            "masked_lm_ids": torch.from_numpy(labels),
            "next_sentence_label": torch.from_numpy(nsp),
            "sample_index": torch.from_numpy(np.asarray(sample_ids, dtype=np.int64)),
        }
