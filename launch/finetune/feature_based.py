"""The feature-based approach (the paper's Section 5.3, Table 7): a new head on frozen activations.

`bertpipe finetune --feature-based --layers LAYERS` reads the task's data and encodes it exactly as
fine-tuning does (same features, same first-sub-token labels for NER), then, instead of loading the
task model, takes the chosen hidden states of the frozen encoder from the feature cache
(`launch/finetune/feature_cache.py`; the encoder is loaded and run only for layers not cached yet)
and trains `model.heads.FrozenFeatureHead` on them: the layers combined (`parse_layers` of
`bertpipe features`: concatenated, summed, or the learned ELMo-style weighted sum), a two-layer
BiLSTM (`--lstm-hidden`, the paper's 768) or none (`--feature-head linear`), and a classifier.
Scoring, predictions and metrics.json are fine-tuning's (`Finetuner.evaluate`, `Task.score`).

Token tasks (conll2003, tag) and sentence tasks (GLUE, classify, regress) are supported; squad and
swag need per-window or per-choice activations that are too large to cache, and are refused.

Shape legend: B batch, L length, K chosen layers, H hidden, T tokens of a split.
"""

from __future__ import annotations

import json
import logging
import time
from pathlib import Path
from typing import Any, Callable

import numpy as np
import torch
from torch.utils.data import BatchSampler, RandomSampler

from launch.finetune.encoding import LengthGroupedBatches, collate, loss_weights, use_length_grouping
from launch.finetune.examples import DataError
from launch.finetune.feature_cache import CacheStats, FeatureCache, SplitKey, checkpoint_digest, data_digest, default_cache_dir
from launch.finetune.feature_extraction import parse_layers

logger = logging.getLogger(__name__)


class CachedFeatures(list):
    """A split's features as `Task.featurize` made them, with their frozen activations:
    `layers_TKH` [T, K, H] (fp16) for the tokens of all features in order, feature i at
    rows offsets[i]:offsets[i + 1]."""

    def __init__(self, feats: list, layers_TKH: torch.Tensor, offsets: np.ndarray,
                 collate_fn: Callable[[list], dict[str, torch.Tensor]]) -> None:
        super().__init__(feats)
        self.layers_TKH, self.offsets, self.collate_fn = layers_TKH, offsets, collate_fn

    def batch(self, idx: list[int]) -> dict[str, torch.Tensor]:
        """Fine-tuning's padded batch (labels, attention_mask) plus `features` [B, L, K, H] in fp32.

        `collate_fn` is the task's (`Task.collate`): a regression task's float labels stay floats (the
        plain collate made them integers, and the head was trained toward floor(label))."""
        batch = self.collate_fn([self[i] for i in idx])
        _, k, h = self.layers_TKH.shape
        feats_BLKH = torch.zeros(len(idx), batch["attention_mask"].shape[1], k, h)
        for r, i in enumerate(idx):
            a, b = self.offsets[i], self.offsets[i + 1]
            feats_BLKH[r, : b - a] = self.layers_TKH[a:b]
        batch["features"] = feats_BLKH
        return batch


# The encoder's batch size, not --eval-batch-size: activations differ in their last bits with the batch they were
# computed in (its padded length), and a cache entry must hold the same bytes whichever run filled it.
ENCODER_BATCH = 64


class FrozenEncoder:
    """The checkpoint's encoder, loaded on first use: never when every layer asked for is cached."""

    def __init__(self, hf_dir: Path, device: torch.device, batch_size: int, bf16: bool, stats: CacheStats) -> None:
        self.hf_dir, self.device, self.batch_size, self.bf16, self.stats = hf_dir, device, batch_size, bf16, stats
        self.model = None

    @torch.no_grad()
    def hidden_states(self, feats: list, layers: list[int], num_tokens: int) -> dict[int, torch.Tensor]:
        """{layer: [T, H]} for the tokens of `feats` in order (padding dropped)."""
        if self.model is None:
            from model import BertModel, load_pretrained

            self.model, _ = load_pretrained(BertModel, self.hf_dir, config_overrides={"unpad": True},
                                            add_pooling_layer=False)
            self.model.to(self.device).eval()
            logger.info("loaded the frozen encoder from %s", self.hf_dir)
        hidden = self.model.config.hidden_size
        out = {k: torch.zeros(num_tokens, hidden, dtype=torch.float16) for k in layers}
        starts = np.concatenate([[0], np.cumsum([len(f.input_ids) for f in feats])])
        order = sorted(range(len(feats)), key=lambda i: len(feats[i].input_ids))
        # Layers above the deepest one asked for are not run (the embeddings alone cost almost nothing).
        full = self.model.encoder.layers
        self.model.encoder.layers = full[: max(layers)]
        try:
            self._run(feats, layers, order, starts, out)
        finally:
            self.model.encoder.layers = full
        return out

    def _run(self, feats: list, layers: list[int], order: list[int], starts: np.ndarray,
             out: dict[int, torch.Tensor]) -> None:
        for b in range(0, len(order), self.batch_size):
            idx = order[b : b + self.batch_size]
            batch = {k: v.to(self.device) for k, v in collate([feats[i] for i in idx]).items() if k != "labels"}
            with torch.autocast(self.device.type, dtype=torch.bfloat16, enabled=self.bf16):
                states = self.model(batch["input_ids"], batch["token_type_ids"], batch["attention_mask"],
                                    output_hidden_states=True).hidden_states
            self.stats.encoder_batches += 1
            for k in layers:
                h_BLH = states[k].float().cpu()
                for r, i in enumerate(idx):
                    out[k][starts[i] : starts[i + 1]] = h_BLH[r, : starts[i + 1] - starts[i]]


class FeatureBased:
    """What replaces `Finetuner`'s task model: a head on cached frozen activations.

    A mixin, composed with `Finetuner` by `launch.finetune.runner.finetune`, so that this module does
    not import the runner: it overrides the model (`load_model`), the batches, the loss, the learning
    rate and `predict`; the training loop, evaluation, history and outputs are fine-tuning's own.
    """

    def __init__(self, cfg, **kwargs: Any) -> None:
        super().__init__(cfg, **kwargs)
        if self.task.model_kind not in ("token", "sequence"):
            raise DataError(f"--feature-based trains token (conll2003, tag) and sentence (GLUE, classify, regress) "
                            f"heads; {self.task.name} needs fine-tuning (drop --feature-based)")

    def load_model(self) -> None:
        cfg, kind = self.cfg, self.task.model_kind
        hf_config = json.loads((self.ckpt.hf_dir / "config.json").read_text(encoding="utf-8"))
        self.selection = parse_layers(cfg.layers, int(hf_config["num_hidden_layers"]))
        hidden = int(hf_config["hidden_size"])
        self.cache_stats = CacheStats()
        root = Path(cfg.feature_cache) if cfg.feature_cache else default_cache_dir()
        try:  # here, not when the first split is cached: a file there was blamed on --out, /sys a traceback
            root.mkdir(parents=True, exist_ok=True)
        except OSError as err:
            raise DataError(f"--feature-cache {root} cannot be a folder ({err.strerror}: {err.filename}); pass a "
                            "writable folder") from None
        cache = FeatureCache(root, self.cache_stats)
        encoder = FrozenEncoder(self.ckpt.hf_dir, self.device, ENCODER_BATCH, self.bf16, self.cache_stats)
        ckpt = checkpoint_digest(self.ckpt.hf_dir)

        def cached(split: str, feats: list) -> CachedFeatures:
            lengths = [len(f.input_ids) for f in feats]
            offsets = np.concatenate([[0], np.cumsum(lengths)]).astype(np.int64)
            key = SplitKey(ckpt, data_digest(feats), self.task.name, split, cfg.max_seq_len,
                           f"{self.device.type}-{'bf16' if self.bf16 else 'fp32'}")
            layers_TKH = cache.layers(key, self.selection.indices, int(offsets[-1]), hidden,
                                      lambda missing: encoder.hidden_states(feats, missing, int(offsets[-1])))
            return CachedFeatures(feats, layers_TKH, offsets, self.task.collate)

        t0 = time.perf_counter()
        self.train_feats = cached("train", self.train_feats)
        self.eval_feats = [cached(s.name, f) for s, f in zip(self.data.evals, self.eval_feats)]
        self.encoder_loaded = encoder.model is not None
        self.feature_seconds = time.perf_counter() - t0
        del encoder  # the head alone trains from here on
        from model.heads import FrozenFeatureHead

        torch.manual_seed(cfg.seed)  # head initialisation
        self.model = FrozenFeatureHead(
            len(self.selection.indices), hidden, self.task.head_kwargs(self.data)["num_labels"],
            combine=self.selection.combine, per_token=kind == "token",
            lstm_hidden=cfg.lstm_hidden if cfg.feature_head == "bilstm" else 0).to(self.device)
        logger.info("%s: feature-based head (%s, layers %s %s) on frozen activations, %d parameters", self.task.name,
                    cfg.feature_head, self.selection.indices, self.selection.combine,
                    sum(p.numel() for p in self.model.parameters()))

    def _forward(self, batch: dict[str, torch.Tensor]) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        batch = {k: v.to(self.device) for k, v in batch.items()}
        return self.model(batch["features"], batch["attention_mask"]), batch

    def train_batches(self, gen: torch.Generator) -> "_Batches":
        feats = self.train_feats
        if use_length_grouping(self.cfg.group_by_length, feats):  # the same batches fine-tuning would draw
            sampler = LengthGroupedBatches([len(f.input_ids) for f in feats], self.cfg.batch_size, gen,
                                           weights=loss_weights(feats))
        else:
            sampler = BatchSampler(RandomSampler(range(len(feats)), generator=gen), self.cfg.batch_size, drop_last=False)
        return _Batches(feats, sampler)

    def batch_loss(self, batch: dict[str, torch.Tensor]) -> torch.Tensor:
        out, batch = self._forward(batch)
        return self.task.loss(out, batch)

    def peak_lr(self) -> float:
        return self.cfg.feature_lr  # a freshly initialised head learns at its own rate

    def train_stats(self) -> dict[str, Any]:
        s = self.cache_stats
        return {"feature_seconds": self.feature_seconds, "feature_cache_hits": s.hits, "feature_cache_misses": s.misses,
                "encoder_batches": s.encoder_batches, "encoder_loaded": int(self.encoder_loaded),
                "feature_based": True, "layers": self.cfg.layers, "feature_head": self.cfg.feature_head}

    @torch.no_grad()
    def predict(self, feats: CachedFeatures) -> list[np.ndarray]:
        self.model.eval()
        order = sorted(range(len(feats)), key=lambda i: len(feats[i].input_ids))
        outputs: list[np.ndarray | None] = [None] * len(feats)
        for start in range(0, len(order), self.cfg.eval_batch_size):
            idx = order[start : start + self.cfg.eval_batch_size]
            out, batch = self._forward(feats.batch(idx))
            for i, row in zip(idx, self.task.gather(out, batch)):
                outputs[i] = row
        return outputs  # type: ignore[return-value]

    def save(self) -> Path:
        """The head's tensors and what rebuilds it (the encoder is the unchanged checkpoint)."""
        from safetensors.torch import save_file

        path = self.out / "head"
        path.mkdir(parents=True, exist_ok=True)
        save_file({k: v.contiguous() for k, v in self.model.state_dict().items()}, str(path / "head.safetensors"))
        info: dict[str, Any] = {"checkpoint": str(self.ckpt.hf_dir), "task": self.task.name, "layers": self.cfg.layers,
                                "indices": self.selection.indices, "combine": self.selection.combine,
                                "feature_head": self.cfg.feature_head, "lstm_hidden": self.cfg.lstm_hidden,
                                "labels": list(self.data.labels) if self.data.labels else None}
        (path / "head.json").write_text(json.dumps(info, indent=2) + "\n")
        return path


class _Batches:
    """The cached features' batches for one epoch, drawn afresh from `sampler` each time it is iterated."""

    def __init__(self, feats: CachedFeatures, sampler: Any) -> None:
        self.feats, self.sampler = feats, sampler

    def __len__(self) -> int:
        return len(self.sampler)

    def __iter__(self):
        return (self.feats.batch(list(idx)) for idx in self.sampler)
