"""One fine-tuning run: checkpoint + task -> trained head, dev metrics, predictions, HF model.

`Finetuner(cfg).run()` reads: validate everything (data, labels, checkpoint, vocab) before any
training, then train (AdamW, linear warm-up and decay, gradient clipping, bf16 autocast on CUDA),
then evaluate every dev/test split and write the outputs. The final model is the one evaluated,
as in the paper (no early stopping on dev).
"""

from __future__ import annotations

import json
import logging
import math
import time
from pathlib import Path
from typing import Any, Callable

import numpy as np
import torch
from torch.utils.data import DataLoader

from launch.config import save_config
from launch.finetune.checkpoint import load_tokenizer, open_checkpoint
from launch.finetune.device import pick_device
from launch.finetune.finetune_config import FinetuneConfig
from launch.finetune.history import TrainingHistory
from launch.finetune.examples import DataError
from launch.finetune.encoding import IGNORE, LengthGroupedBatches, loss_weights, use_length_grouping
from launch.finetune.kinds import Task, TaskData
from launch.finetune.out_files import clear_earlier_run, has_record, record_written
from launch.finetune.tasks import get_task
from launch.pretrain.pretrain_config import ScheduleSection
from launch.pretrain.schedule import build_scheduler, lr_multiplier
from launch.pretrain.optimizers import param_groups
from pipeline.atomic_write import write_text_atomic
from pipeline.output_lock import mark_output, refuse_others_files
from pipeline.vocab import TOKENIZER_CONFIG, Vocab

logger = logging.getLogger(__name__)

# What a fine-tuning run writes into --out; where they exist, the marker (or the record of the files an
# earlier run wrote, out_files.RECORD) must prove an earlier `finetune` wrote them: a config.yaml that
# names this --out does not (users keep their own configs there).
OUT_MARKER = ".bertpipe-finetune"
OUT_FILES = ("config.yaml", "metrics.json", "predictions", "submission", "confusion_matrix.txt",
             "confusion_matrix.png", "confusion_matrix_mismatched.txt", "confusion_matrix_mismatched.png",
             "dev_entity_report.txt", "test_entity_report.txt", "model", "head", "log_history.json",
             "learning_curve.png", "tensorboard")
# What `save` writes into OUT/model (`model.save_pretrained`, then the tokenizer files), and a feature-based
# run into OUT/head; with OUT_FILES' files and each split's predictions, what a run may write (`_may_write`).
MODEL_FILES = ("config.json", "model.safetensors", "vocab.txt", "tokenizer.json", TOKENIZER_CONFIG)
HEAD_FILES = ("head.safetensors", "head.json")
SUBSET_SEED = 0  # subsets are the same for every trial seed: seeds then vary only init and order


def _model_class(kind: str):
    from model.heads import (
        BertForMultipleChoice,
        BertForQuestionAnswering,
        BertForSequenceClassification,
        BertForTokenClassification,
    )

    return {"sequence": BertForSequenceClassification, "qa": BertForQuestionAnswering,
            "token": BertForTokenClassification, "choice": BertForMultipleChoice}[kind]


def _subset(items: list, n: int | None) -> list:
    if n is None or n >= len(items):
        return items
    keep = np.sort(np.random.default_rng(SUBSET_SEED).permutation(len(items))[:n])
    return [items[i] for i in keep]


def _length(feat: Any) -> int:
    ids = feat.input_ids
    return max(len(x) for x in ids) if ids and isinstance(ids[0], list) else len(ids)




def _param_groups(model: torch.nn.Module, weight_decay: float) -> list[dict[str, Any]]:
    """No weight decay on biases and LayerNorm weights: pre-training's rule (`param_groups`), one home."""
    return [{k: v for k, v in g.items() if k != "layer_adaptation"} for g in param_groups(model, weight_decay)]


def linear_schedule(warmup: int, steps: int, decay_over: str = "after_warmup") -> ScheduleSection:
    """Linear warm-up over `warmup` steps to the peak, then linear decay to 0 at `steps`: from the peak
    over the steps after warm-up (`after_warmup`, transformers' `get_linear_schedule_with_warmup` as in
    run_glue, except that the first update already uses peak/warmup), or over the whole run (`run`,
    google-research/bert's run_classifier: 0.9 x peak when a 10% warm-up ends). Pre-training's schedule
    (`launch.pretrain.schedule`) with these settings."""
    return ScheduleSection(total_steps=steps, warmup_steps=warmup, decay="linear", min_lr_ratio=0.0,
                           decay_over=decay_over)


def _loss_terms(batch: dict[str, torch.Tensor], model_kind: str) -> torch.Tensor:
    """Per example, the terms the task's mean loss averages over: its labelled tokens for token tasks
    (labels are IGNORE elsewhere), else 1."""
    labels = batch.get("labels")
    if model_kind == "token" and labels is not None:
        return (labels != IGNORE).sum(dim=1)
    return torch.ones(len(next(iter(batch.values()))), dtype=torch.long)


def lr_factor(step: int, warmup: int, steps: int, decay_over: str = "after_warmup") -> float:
    """Multiplier of the peak lr at optimizer step `step` (0-based)."""
    return lr_multiplier(step, linear_schedule(warmup, steps, decay_over))


class Finetuner:
    """Owns one run's state: config, task, tokenizer, data, model, optimizer."""

    def __init__(self, cfg: FinetuneConfig, on_epoch_end: Callable[[int, float], None] | None = None) -> None:
        cfg.validate()
        self.cfg = cfg
        self.out = Path(cfg.out)
        self.task: Task = get_task(cfg.task)
        self.on_epoch_end = on_epoch_end
        self.device = pick_device(cfg.device)
        self.bf16 = cfg.precision == "bf16" or (cfg.precision == "auto" and self.device.type == "cuda")
        if cfg.threads:
            torch.set_num_threads(cfg.threads)

    # -- setup: every check happens here, before the first step ----------------------------------------

    def prepare(self) -> None:
        cfg = self.cfg
        refuse_others_files(self.out, OUT_FILES, OUT_MARKER, "finetune", ours=has_record(self.out))
        data_dir = Path(cfg.data_dir)
        if not data_dir.is_dir():
            raise DataError(f"--data-dir {data_dir} is not a directory")
        self.ckpt = open_checkpoint(cfg.checkpoint, cfg.vocab)
        hf_config = json.loads((self.ckpt.hf_dir / "config.json").read_text(encoding="utf-8"))
        positions = int(hf_config.get("max_position_embeddings", 512))
        if cfg.max_seq_len > positions:  # else the first forward pass fails on a position id out of range
            raise DataError(f"--max-seq-len {cfg.max_seq_len} exceeds the checkpoint's {positions} position "
                            f"embeddings ({cfg.checkpoint}); use --max-seq-len {positions} or less")
        self.tokenizer = load_tokenizer(self.ckpt)
        self.data: TaskData = self.task.load(data_dir, cfg)
        self.data.train = _subset(self.data.train, cfg.max_train_samples)
        for split in self.data.evals:
            if split.labelled:  # unlabelled (test) splits are predicted whole: a submission needs every row
                split.examples = _subset(split.examples, cfg.max_eval_samples)
        for name, examples in [("training", self.data.train)] + [(s.name, s.examples) for s in self.data.evals]:
            if not examples:  # else the run trains, then fails scoring nothing
                raise DataError(f"{self.task.name}: the {name} split in {data_dir} holds no examples")
        if getattr(self.task, "regression", False):
            self._check_scores_vary(data_dir)
        t0 = time.perf_counter()
        self.train_feats = self.task.featurize(self.data.train, self.tokenizer, cfg, self.data, training=True)
        if not self.train_feats:  # e.g. every SQuAD answer off its offset (warned above): 0 steps, exit 0
            raise DataError(f"{self.task.name}: none of the {len(self.data.train)} training examples in {data_dir} "
                            "could be used (the warnings above say why); fix the training data")
        self.eval_feats = [self.task.featurize(s.examples, self.tokenizer, cfg, self.data, training=False)
                           for s in self.data.evals]
        logger.info("%s: %d train examples (%d features), evals %s; featurised in %.1fs", self.task.name,
                    len(self.data.train) - self.data.train_unused, len(self.train_feats),
                    ", ".join(f"{s.name}={len(s.examples)}" for s in self.data.evals), time.perf_counter() - t0)
        self.load_model()

    def _check_scores_vary(self, data_dir: Path) -> None:
        """A regression split whose scores are all equal: nothing to learn (train), or Pearson and
        Spearman undefined so every run scores 0 (dev). Checked here, on what --max-*-samples kept, for
        `regress` and GLUE's STS-B alike."""
        cfg = self.cfg
        splits = [("training", self.data.train, "--max-train-samples", cfg.max_train_samples)]
        splits += [(s.name, s.examples, "--max-eval-samples", cfg.max_eval_samples) for s in self.data.evals if s.labelled]
        for name, examples, flag, n in splits:
            scores = sorted({float(ex.label) for ex in examples})
            if len(scores) < 2:
                where, fix = (f" (the {n} {flag} kept)", f"raise {flag}") if n is not None else ("", "fix the data")
                raise DataError(f"{self.task.name}: all {len(examples)} example(s) of the {name} split in {data_dir}"
                                f"{where} score {scores[0]:g}; regression needs scores that vary: {fix}")

    def load_model(self) -> None:
        """The task model of the paper's Figure 4 from the checkpoint (the feature-based run replaces this)."""
        from model.hf import load_pretrained

        cfg = self.cfg
        torch.manual_seed(cfg.seed)  # head initialisation
        try:
            model, report = load_pretrained(_model_class(self.task.model_kind), self.ckpt.hf_dir,
                                            config_overrides={"unpad": cfg.unpad}, **self.task.head_kwargs(self.data))
        except (ValueError, KeyError) as err:
            raise DataError(f"cannot load checkpoint {cfg.checkpoint}: {err}") from None
        if report.unexpected_keys and not report.initialized_heads:
            logger.warning("checkpoint tensors ignored: %s", report.unexpected_keys[:8])
        if "classifier" not in report.initialized_heads:
            self._align_head_labels(model, report.head_labels)
        if cfg.init == "random":  # the baseline without pre-training: same shapes and vocabulary, fresh weights
            from model.bert import init_weights

            # The encoder only: the task head is already a fresh draw, the same one the checkpoint's run
            # of this seed gets, so the two runs differ in the encoder alone.
            torch.manual_seed(cfg.seed)
            init_weights(model.bert, model.bert.config)
            logger.info("--init random: the checkpoint's encoder weights are replaced by a fresh initialisation")
        if cfg.freeze:
            for p in model.bert.parameters():
                p.requires_grad_(False)
        self.model = model.to(self.device)

    def _align_head_labels(self, model: torch.nn.Module, theirs: list[str] | None) -> None:
        """A classifier head from the checkpoint keeps what its outputs mean (transformers' run_glue does
        the same): rows reordered where the checkpoint names the task's labels in another order (an MNLI
        model from elsewhere), a fresh head where it names other labels (an RTE model fine-tuned on SST-2
        used to start from the RTE head without a word)."""
        labels = list(self.data.labels or ())
        classifier = getattr(model, "classifier", None)
        if not labels or theirs is None or theirs == labels or getattr(classifier, "out_features", 0) != len(labels):
            return
        if sorted(theirs) == sorted(labels):
            order = [theirs.index(name) for name in labels]
            with torch.no_grad():
                classifier.weight.copy_(classifier.weight[order])
                classifier.bias.copy_(classifier.bias[order])
            logger.info("the checkpoint's classifier orders its labels %s: rows reordered to %s", theirs, labels)
            return
        from model.heads import init_head

        torch.manual_seed(self.cfg.seed)  # the same fresh head for every run of this seed
        init_head(classifier, model.bert.config)
        logger.warning("the checkpoint's classifier was trained for labels %s, not %s: it starts from a fresh "
                       "draw", theirs, labels)

    # -- training ----------------------------------------------------------------------------------------

    def train_batches(self, gen: torch.Generator) -> Any:
        """One epoch's batches (re-iterated each epoch, reshuffled by `gen`); has a len()."""
        cfg = self.cfg
        if use_length_grouping(cfg.group_by_length, self.train_feats):
            # Token-averaged losses (NER) get batches of equal labelled tokens, else grouping re-weights them.
            batches = LengthGroupedBatches([_length(f) for f in self.train_feats], cfg.batch_size, gen,
                                           weights=loss_weights(self.train_feats))
            return DataLoader(self.train_feats, batch_sampler=batches, collate_fn=self.task.collate)
        return DataLoader(self.train_feats, batch_size=cfg.batch_size, shuffle=True, generator=gen,
                          collate_fn=self.task.collate)

    def batch_loss(self, batch: dict[str, torch.Tensor]) -> torch.Tensor:
        batch = {k: v.to(self.device) for k, v in batch.items()}
        with torch.autocast(self.device.type, dtype=torch.bfloat16, enabled=self.bf16):
            out = self.model(batch["input_ids"], batch["token_type_ids"], batch["attention_mask"])
        return self.task.loss(out, batch)

    def _backward(self, batch: dict[str, torch.Tensor], epoch: int, step: int) -> float:
        """The batch's loss, with its gradient. With `micro_batch_size` below the batch, the gradient
        accumulates over slices, each slice's mean loss weighted by its share of the batch's loss terms
        (examples; labelled tokens where the loss averages over tokens): the whole batch's gradient."""
        size = len(next(iter(batch.values())))
        micro = min(self.cfg.micro_batch_size or size, size)
        terms = _loss_terms(batch, self.task.model_kind)
        if micro == size or terms.sum() == 0:
            slices = [(batch, None)]
        else:
            slices = [({k: v[i : i + micro] for k, v in batch.items()}, terms[i : i + micro].sum() / terms.sum())
                      for i in range(0, size, micro)]
        value = 0.0
        for part, share in slices:
            if share is not None and share == 0:
                continue  # no loss term in this slice (no labelled token): nothing to add
            loss = self.batch_loss(part)
            loss = loss if share is None else loss * share
            if not math.isfinite(seen := loss.item()):
                # A ValueError: the CLI says it in one line and a sweep records the trial as failed, not crashed.
                cause = ("before any update, so the checkpoint's weights or the data are at fault, not the learning "
                         "rate" if step == 0 else "training diverged; lower the learning rate (--lr) or keep --max-grad-norm")
                raise ValueError(f"the loss became {seen} at epoch {epoch + 1}, step {step + 1}: {cause}")
            loss.backward()
            value += seen
        return value

    def peak_lr(self) -> float:
        return self.cfg.lr

    def optimizer(self) -> torch.optim.Optimizer:
        # fused: one kernel over all parameters (CPU and CUDA), a large share of a small model's step time.
        return torch.optim.AdamW(_param_groups(self.model, self.cfg.weight_decay), lr=self.peak_lr(), betas=(0.9, 0.999),
                                 eps=self.cfg.adam_epsilon, fused=True)

    def train_stats(self) -> dict[str, Any]:
        """What this kind of training adds to metrics.json."""
        return {}

    def train(self) -> dict[str, float]:
        cfg = self.cfg
        loader = self.train_batches(torch.Generator().manual_seed(cfg.seed))
        steps = cfg.epochs * len(loader)
        opt = self.optimizer()
        sched = build_scheduler(opt, linear_schedule(int(cfg.warmup * steps), steps, cfg.decay_over))
        from tqdm.auto import tqdm

        bar = tqdm(total=steps, desc=f"finetune {self.task.name}", unit="step", disable=not cfg.progress, dynamic_ncols=True)
        t0, eval_seconds = time.perf_counter(), 0.0
        losses: list[float] = []
        history = TrainingHistory(self.out, self.task.metric, tensorboard=cfg.tensorboard)
        self.last_dev: dict[str, float] | None = None
        step = 0
        self.model.train()
        for epoch in range(cfg.epochs):
            epoch_loss, n = 0.0, 0
            for batch in loader:
                value = self._backward(batch, epoch, step)
                if cfg.max_grad_norm > 0:
                    torch.nn.utils.clip_grad_norm_(self.model.parameters(), cfg.max_grad_norm)
                opt.step()
                sched.step()
                opt.zero_grad(set_to_none=True)
                lr = sched.get_last_lr()[0]
                epoch_loss += value
                n += 1
                step += 1
                history.step(step, value, lr)
                bar.update(1)
                bar.set_postfix(loss=f"{value:.4f}", lr=f"{lr:.2e}")
            losses.append(epoch_loss / max(n, 1))
            logger.info("%s epoch %d/%d: mean train loss %.4f", self.task.name, epoch + 1, cfg.epochs, losses[-1])
            if cfg.eval_every_epoch or epoch + 1 == cfg.epochs:
                # The last epoch's evaluation is the run's result (run() does not evaluate again).
                t_eval = time.perf_counter()
                self.last_dev = self.evaluate()
                eval_seconds += time.perf_counter() - t_eval
                history.epoch(epoch + 1, step, losses[-1], sched.get_last_lr()[0], self.last_dev)
                self.model.train()
            if self.on_epoch_end is not None:
                self.on_epoch_end(epoch + 1, losses[-1])
        bar.close()
        history.close()
        # train_seconds is training alone: the per-epoch dev evaluations are eval_seconds.
        return {"train_loss": losses[-1], "train_seconds": time.perf_counter() - t0 - eval_seconds,
                "eval_seconds": eval_seconds, "train_steps": steps,
                "train_examples": len(self.data.train) - self.data.train_unused,  # those it trained on
                **({"train_examples_unused": self.data.train_unused} if self.data.train_unused else {}),
                **self.train_stats()}

    # -- evaluation ----------------------------------------------------------------------------------------

    @torch.no_grad()
    def predict(self, feats: list) -> list[np.ndarray]:
        """Per-feature outputs in feature order; batches are length-sorted so padding stays small."""
        self.model.eval()
        order = sorted(range(len(feats)), key=lambda i: _length(feats[i]))
        outputs: list[np.ndarray | None] = [None] * len(feats)
        bs = self.cfg.eval_batch_size
        for start in range(0, len(order), bs):
            idx = order[start : start + bs]
            batch = {k: v.to(self.device) for k, v in self.task.collate([feats[i] for i in idx]).items()}
            with torch.autocast(self.device.type, dtype=torch.bfloat16, enabled=self.bf16):
                out = self.model(batch["input_ids"], batch["token_type_ids"], batch["attention_mask"])
            for i, row in zip(idx, self.task.gather(out, batch)):
                outputs[i] = row
        return outputs  # type: ignore[return-value]

    def evaluate(self) -> dict[str, float]:
        results: dict[str, float] = {}
        for split, feats in zip(self.data.evals, self.eval_feats):
            t0 = time.perf_counter()
            scores = self.task.score(split, feats, self.predict(feats), self.data, self.out, self.cfg)
            results.update({f"{split.prefix}{k}": v for k, v in scores.items()})
            if split.labelled:
                results[f"{split.prefix}eval_examples"] = len(split.examples)
                logger.info("%s %s: %s (%.1fs)", self.task.name, split.name,
                            ", ".join(f"{k}={v:.4f}" for k, v in scores.items()), time.perf_counter() - t0)
        return results

    # -- the run -------------------------------------------------------------------------------------------

    def run(self) -> dict[str, Any]:
        self.prepare()  # every check first: a refused run leaves no config.yaml behind
        kept = self._clear_earlier_run()
        mark_output(self.out, OUT_MARKER, "finetune")
        save_config(self.cfg, self.out / "config.yaml")
        train_stats = self.train()
        dev = self.last_dev if self.last_dev is not None else self.evaluate()
        result = {"task": self.task.name, "metric": self.task.metric, "score": dev.get(self.task.metric),
                  **dev, **train_stats, "device": str(self.device), "bf16": self.bf16,
                  "checkpoint": str(self.cfg.checkpoint)}
        if self.cfg.save_model:
            self.save()
        # Last, after the model: a run cut short (a full disk) leaves no metrics.json that says it finished.
        write_text_atomic(self.out / "metrics.json", json.dumps(result, indent=2) + "\n")
        record_written(self.out, OUT_FILES, kept)
        return result

    def _clear_earlier_run(self) -> list[str]:
        """An earlier run's files in --out (proven ours by `prepare`): left there, its model, predictions,
        confusion matrix and TensorBoard events sat beside this run's as if they were its own, and its
        metrics.json outlived an interrupted rerun. A file of the user's among them stays (`out_files`)."""
        ckpt = self.ckpt.hf_dir.resolve()
        for name in OUT_FILES:
            path = self.out / name
            if path.resolve() == ckpt or path.resolve() in ckpt.parents:
                raise DataError(f"--checkpoint {self.cfg.checkpoint} is the earlier run's {path}, which this run "
                                "replaces; fine-tune it into another --out")
        try:
            return clear_earlier_run(self.out, OUT_FILES, self._may_write())
        except FileExistsError as err:
            raise DataError(str(err)) from None

    def _may_write(self) -> set[str]:
        """Every file this run may write under OUT, relative to it (the forms of every task kind, so a few more
        than one run writes); TensorBoard's events, whose names are new each run, as one name under its folder."""
        names = {n for n in OUT_FILES if "." in n} | {"tensorboard/events"}
        names |= {f"model/{n}" for n in MODEL_FILES} | {f"head/{n}" for n in HEAD_FILES}
        names |= {"predictions/predictions.json", "predictions/nbest_predictions.json"}  # SQuAD
        for split in self.data.evals:
            stem = split.name.removesuffix(".tsv")
            names |= {f"predictions/{stem}.tsv", f"predictions/{split.name}.tsv", f"predictions/{split.name}.txt"}
            if split.submission:
                names.add(f"submission/{split.submission}")
        return names

    def save(self) -> Path:
        from model.hf import save_pretrained

        extra: dict[str, Any] = {"finetuning_task": self.task.name}
        if self.data.labels:
            extra["id2label"] = {str(i): name for i, name in enumerate(self.data.labels)}
            extra["label2id"] = {name: i for i, name in enumerate(self.data.labels)}
        path = save_pretrained(self.model, self.out / "model", vocab_file=self.ckpt.vocab_file, extra_config=extra)
        Vocab.read(self.ckpt.vocab_file, lowercase=self.ckpt.lowercase).write_tokenizer_files(
            path, model_max_length=self.model.config.max_position_embeddings)
        return path


def finetuner_for(cfg: FinetuneConfig, **kwargs: Any) -> Finetuner:
    """The run's trainer: `Finetuner`, or with `feature_based` the paper's Table 7 setup (a head on cached
    frozen activations) composed onto it."""
    if cfg.feature_based:
        from launch.finetune.feature_based import FeatureBased

        return type("FeatureBasedFinetuner", (FeatureBased, Finetuner), {})(cfg, **kwargs)
    return Finetuner(cfg, **kwargs)


def finetune(cfg: FinetuneConfig, **kwargs: Any) -> dict[str, Any]:
    """Run one fine-tuning job; returns what it wrote to OUT/metrics.json."""
    return finetuner_for(cfg, **kwargs).run()

