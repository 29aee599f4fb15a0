"""The pre-training Trainer: owns the engine, loader, metrics and checkpoints; `train()` reads
step, log, evaluate, checkpoint.

Runs the same under `bertpipe pretrain --nproc N` (our local launcher), `deepspeed --module
launch.pretrain` and `torchrun -m launch.pretrain`: it only needs the usual RANK / WORLD_SIZE /
LOCAL_RANK / MASTER_ADDR / MASTER_PORT environment (set here for a lone process).
"""

from __future__ import annotations

import logging
import os
import signal
import time
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist

from launch.config import differences, save_config, to_dict
from launch.checkpoint_dirs import (RUN_FILES, RUN_MARKER, checkpoint_tags, is_run_dir, read_meta, select_checkpoint,
                                    tag_step)
from launch.pretrain.checkpoints import convert_to_universal, load_rng, remove_unfinished, save as save_checkpoint
from launch.pretrain.process_group import init_distributed, on_rank0, same_on_every_rank, stopped_together
from launch.pretrain.hf_export import safe_deepspeed_loads
from launch.pretrain.init_from import load_init_from
from launch.pretrain.pretrain_config import PretrainConfig
from launch.pretrain.preflight import preflight
from launch.pretrain.deepspeed_config import deepspeed_config, write_deepspeed_config
from launch.pretrain.fast_step import UpdateSkipper, compile_blocks, compile_enabled, to_device
from launch.pretrain.launcher import STOP_SIGNALS
from launch.pretrain.training_log import MetricsWriter, flops_per_token, spec_peak_tflops
from launch.pretrain.optimizers import Lamb, attach_zero_partitioning, build_optimizer
from launch.pretrain.schedule import apply_after_load, build_scheduler
from pipeline.atomic_write import write_bytes_atomic
from pipeline.corpus_info import open_corpus
from pipeline.loader import PretrainLoader, ShardedSplit, heldout_batches
from pipeline.masking import derive_seed
from pipeline.output_lock import mark_output, refuse_others_files

log = logging.getLogger(__name__)
# Settings a resumed run must share with the checkpoint, or the sample sequence / model differ.
# How the model runs (model.activation_checkpointing, model.compile) may change: none of its state does.
_RESUME_INVARIANTS = ("data.seed", "data.global_batch_size", "data.dynamic_masking", "model.preset", "model.vocab_size",
                      "model.fields", "optim.name", "zero.stage", "precision.dtype")  # the last two: DeepSpeed's files


def _dotted(tree: dict[str, Any], key: str) -> Any:
    for part in key.split("."):
        tree = tree[part]
    return tree


def use_deterministic_algorithms() -> None:
    """torch's deterministic kernels, on CUDA too: torch refuses a cuBLAS matmul in this mode unless cuBLAS
    has a fixed workspace (a user's own setting is kept). Read when the first cuBLAS handle is made."""
    os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")
    torch.use_deterministic_algorithms(True)


class Trainer:
    def __init__(self, cfg: PretrainConfig, *, data_dir: Path, run_dir: Path, resume: bool = False) -> None:
        self.cfg = cfg
        self.data_dir = Path(data_dir)
        self.run_dir = Path(run_dir)
        self.ckpt_dir = self.run_dir / "checkpoints"
        self.resume = resume
        self.step = 0
        self.position = 0
        self.nonfinite_total = 0
        self._stop_signal: int | None = None

    # ---- setup -------------------------------------------------------------------------------
    def setup(self) -> None:
        import deepspeed
        from deepspeed.accelerator import get_accelerator

        from model import BertForPreTraining, apply_activation_checkpointing

        cfg = self.cfg
        init_distributed()
        self.rank, self.world = dist.get_rank(), dist.get_world_size()
        accel = get_accelerator()
        self.device = torch.device(accel.device_name(int(os.environ.get("LOCAL_RANK", 0))))
        if self.device.type == "cuda":
            torch.cuda.set_device(self.device)
        corpus = self.corpus = same_on_every_rank(  # read and validated once per process; a node may hold a stale copy
            lambda: open_corpus(self.data_dir), lambda c: c.data_sha256, f"--data {self.data_dir}", "read different "
            "corpora (shards, vocabulary or masking settings); give every node a byte-identical copy")
        manifest = self.manifest = corpus.manifest
        self.manifest_sha256 = corpus.manifest_sha256
        self.vocab_file = corpus.vocab_file
        self.mask_id = corpus.vocab.masking().mask_id
        bert_cfg, self.grad_accum = preflight(cfg, corpus, world_size=self.world, device_type=self.device.type,
                                              run_check=on_rank0)
        if cfg.deterministic:
            use_deterministic_algorithms()

        meta = self._resume_meta()
        torch.manual_seed(cfg.seed)  # identical init on every rank
        if cfg.checkpoint.init_from and meta is None:
            model = load_init_from(cfg.checkpoint.init_from, bert_cfg, self.vocab_file)
        else:
            model = BertForPreTraining(bert_cfg)
        self.bert_config = model.config
        if cfg.model.activation_checkpointing:
            apply_activation_checkpointing(model)
        self.params = [p for p in model.parameters() if p.requires_grad]
        # Counted before DeepSpeed sees the model: ZeRO-3 leaves empty placeholders behind.
        num_params = sum(p.numel() for p in self.params)
        non_embedding = sum(p.numel() for n, p in model.named_parameters() if "embeddings" not in n)
        # Dropout differs per rank; a resume restores each rank's exact stream below.
        torch.manual_seed(derive_seed("dropout", cfg.seed, self.rank) % (1 << 63))

        o = cfg.optim
        optimizer = build_optimizer(model, o.name, o.lr, (o.beta1, o.beta2), o.eps, o.weight_decay)
        ds = deepspeed_config(cfg, world_size=self.world, grad_accum=self.grad_accum)
        if meta is not None and meta["tag"].endswith("_universal"):
            ds["checkpoint"] = {"load_universal": True}
        self.ds_config = ds
        if self.rank == 0:
            mark_output(self.run_dir, RUN_MARKER, "pretrain")
        self.engine, self.optimizer, _, self.scheduler = deepspeed.initialize(
            model=model, optimizer=optimizer, config=ds,
            lr_scheduler=lambda opt: build_scheduler(opt, cfg.schedule),
        )
        if cfg.zero.stage == 3:
            deepspeed.zero.register_external_parameter(model.mlm, model.mlm.decoder_weight)
        if isinstance(optimizer, Lamb) and self.engine.optimizer is not optimizer:
            # ZeRO / 16-bit wrappers hand LAMB flat partitions: tell it where each parameter lies.
            attach_zero_partitioning(optimizer, self.engine, self.params)
        self.skipper = UpdateSkipper(optimizer, self.scheduler, cfg.log.max_nonfinite_steps)
        if compile_enabled(cfg.model.compile, self.device.type, cfg.zero.stage):
            # After DeepSpeed placed the model: the blocks compile for the device and dtype they run in.
            compile_blocks(self.engine.module, cfg.model.compile_mode)

        if meta is not None:
            self._load(meta)
        if self.rank == 0:  # after a resume loaded: a refused one leaves the run's own config in place
            save_config(cfg, self.run_dir / "config.yaml")
            write_deepspeed_config(ds, self.run_dir / "ds_config.json")
            write_bytes_atomic(self.run_dir / "vocab.txt", self.vocab_file.read_bytes())
        self.train_split = ShardedSplit(corpus, "train")
        self.heldout = ShardedSplit(corpus, "heldout")
        self.loader = PretrainLoader(
            self.train_split, seed=cfg.data.seed, micro_batch_size=cfg.data.micro_batch_size,
            global_batch_size=cfg.data.global_batch_size, rank=self.rank, world_size=self.world,
            position=self.position, dynamic_masking=cfg.data.dynamic_masking, prefetch=cfg.data.prefetch,
            unpad_layout=self.bert_config.unpad, pin_memory=self.device.type == "cuda",
        )
        self._flops_per_token = flops_per_token(non_embedding, self.bert_config.num_hidden_layers,
                                                self.bert_config.hidden_size, float(manifest["seq_len"]))
        # MFU needs the device's peak: configured, else the spec sheet's bf16 figure for a known GPU
        # running in 16-bit (on CPU, or a GPU we do not know, MFU is not reported).
        self._peak_tflops = cfg.log.peak_tflops
        if self._peak_tflops is None and self.device.type == "cuda" and cfg.precision.dtype != "fp32":
            self._peak_tflops = spec_peak_tflops(torch.cuda.get_device_name(self.device))
        self.metrics = MetricsWriter(
            self.run_dir, enabled=self.rank == 0, tensorboard=cfg.log.tensorboard,
            progress_bar=cfg.log.progress_bar, start_step=self.step, total_steps=cfg.schedule.total_steps,
        )
        log.info("pre-training %s (%.1fM parameters) on %d %s process(es), ZeRO-%d, %s, global batch %d = %d x %d x %d, "
                 "%d train samples, from step %d", cfg.model.preset, num_params / 1e6, self.world,
                 "GPU" if self.device.type == "cuda" else "CPU", cfg.zero.stage, cfg.precision.dtype,
                 cfg.data.global_batch_size, cfg.data.micro_batch_size, self.grad_accum, self.world,
                 len(self.train_split), self.step)

    def _resume_meta(self) -> dict[str, Any] | None:
        # Rank 0's view for every rank: on shared storage their caches may disagree, and ranks that chose
        # differently (resume or fresh) would hang in the next collective.
        has_run = on_rank0(lambda: is_run_dir(self.run_dir))
        refuse_others_files(self.run_dir, RUN_FILES, RUN_MARKER, "pretrain", ours=has_run)
        if not self.resume:
            if has_run:  # rank 0's view, so every rank stops here
                raise stopped_together(f"{self.run_dir} already has checkpoints; pass --resume to continue it, "
                                       f"or choose a new --out")
            return None
        if not has_run:
            log.info("--resume: no checkpoint in %s yet; starting from step 0", self.ckpt_dir)
            return None
        # The newest checkpoint whose files match their recorded sha256s and hold tensors only, checked
        # against this run's settings on rank 0: one message, and every rank stops with it.
        meta = on_rank0(self._checked_checkpoint)
        tag = meta["tag"]
        if meta["world_size"] != self.world:
            log.info("checkpoint %s was written by %d process(es); continuing on %d at the same global sample position",
                     tag, meta["world_size"], self.world)
            if self.cfg.zero.stage > 0 or meta.get("zero_stage", 0) > 0:
                # ZeRO partitions depend on the world size: go through DeepSpeed's universal format.
                meta["tag"] = on_rank0(lambda: convert_to_universal(self.ckpt_dir, tag))
        return meta

    def _checked_checkpoint(self) -> dict[str, Any]:
        """The checkpoint to resume from and its meta (its tag included), or a ValueError that says why
        this run cannot continue from it with these settings and this corpus."""
        if remove_unfinished(self.ckpt_dir):  # a save cut short (a full disk, a kill): the space it held is back
            log.info("removed the unfinished save(s) in %s", self.ckpt_dir)
        tag = select_checkpoint(self.ckpt_dir)
        meta = read_meta(self.ckpt_dir, tag)
        mine = to_dict(self.cfg)
        for key in _RESUME_INVARIANTS:
            there, now = _dotted(meta["config"], key), _dotted(mine, key)
            if there != now and isinstance(there, dict) and isinstance(now, dict):  # model.fields: name the field
                key, there, now = next((f"{key}.{k}", there.get(k), now.get(k)) for k in sorted({*there, *now})
                                       if there.get(k) != now.get(k))
            if there != now:
                raise ValueError(f"{key} differs from the checkpoint's ({there!r} there, {now!r} now); resume with "
                                 f"the run's own setting")
        if meta["step"] > self.cfg.schedule.total_steps:  # it finished "at once" and rewrote config.yaml's total
            raise ValueError(f"the run is at step {meta['step']} already; --max-steps {self.cfg.schedule.total_steps} "
                             f"is behind it: pass more steps to continue, or export the run as it is")
        # Allowed (extending a run with --max-steps, lowering the lr after a spike, saving more often), never
        # silently: the lr then follows the new curve; and a RUN/config.yaml edited or cut short since is seen.
        changed = [f"{k} {there!r} there, {now!r} now" for k, (there, now) in differences(meta["config"], mine).items()]
        if changed:
            log.warning("%s: from step %d the run follows its own settings", "; ".join(changed), meta["step"])
        # The corpus's content (shards, vocabulary, masking settings), not its manifest's bytes, which
        # also hold the paths it was built from and to; checkpoints before the content hash have only those.
        same = (meta["corpus_data_sha256"] == self.corpus.data_sha256 if "corpus_data_sha256" in meta
                else meta["manifest_sha256"] == self.corpus.manifest_sha256)
        if not same:
            raise ValueError(f"--data {self.data_dir} is not the corpus this run was trained on "
                             f"({meta.get('corpus', {}).get('path', '?')}: its shards, vocabulary or masking settings "
                             f"differ); pass that corpus, or a byte-identical rebuild of it")
        self._set_aside_newer_than(tag)
        meta["tag"] = tag
        return meta

    def _set_aside_newer_than(self, tag: str) -> None:
        """Checkpoints newer than the one resumed did not verify (`select_checkpoint` skipped them): moved
        out of the checkpoint set, not deleted, so that `checkpoint.keep_last` neither keeps them in place of
        sound ones nor removes what someone may want to inspect."""
        for newer in checkpoint_tags(self.ckpt_dir):
            if tag_step(newer) > tag_step(tag):
                # Never over one set aside before at the same step: that too is kept for whoever inspects it.
                aside, n = self.ckpt_dir / f"damaged-{newer}", 1
                while aside.exists():
                    aside, n = self.ckpt_dir / f"damaged-{newer}.{n}", n + 1
                os.replace(self.ckpt_dir / newer, aside)
                log.warning("checkpoint %s did not verify: moved to %s, which no resume reads and checkpoint.keep_last "
                            "does not count; delete it once you no longer need it", self.ckpt_dir / newer, aside)

    def _load(self, meta: dict[str, Any]) -> None:
        tag = meta["tag"]
        with safe_deepspeed_loads(self.ckpt_dir / tag):
            path, client = self.engine.load_checkpoint(str(self.ckpt_dir), tag=tag, load_optimizer_states=True,
                                                       load_lr_scheduler_states=True)
        if path is None:
            raise ValueError(f"DeepSpeed could not load checkpoint {self.ckpt_dir / tag}")
        state = client["bertpipe"] if client and "bertpipe" in client else meta
        o = self.cfg.optim
        apply_after_load(self.scheduler, o.lr, (o.beta1, o.beta2), o.eps, o.weight_decay)
        self.step, self.position = int(state["step"]), int(state["position"])
        self.nonfinite_total = int(state.get("nonfinite_total", 0))
        if not load_rng(self.ckpt_dir, tag.removesuffix("_universal"), self.rank):
            log.warning("no RNG state for rank %d in %s (world size changed): dropout continues from a fresh stream",
                        self.rank, tag)
        log.info("resumed from %s: step %d, %d samples consumed", tag, self.step, self.position)

    # ---- training ----------------------------------------------------------------------------
    def _on_signal(self, signum: int, _frame: Any) -> None:
        self._stop_signal = signum

    def _stopped(self) -> int:
        """Stopped early, checkpoint saved: 128 + the signal's number, as a shell reports it (143 on a rank that
        stopped because another got it). Not 0: a Kubernetes Job whose ranks exit 0 counts as Succeeded."""
        code = 128 + int(self._stop_signal or signal.SIGTERM)
        log.info("stopped by signal at step %d; checkpoint saved, continue with --resume (exit %d)", self.step, code)
        return code

    def _forward(self, batch: dict[str, torch.Tensor], layout: Any = None) -> tuple[torch.Tensor, torch.Tensor, Any]:
        """Loss, [mlm_correct, mlm_total, nsp_correct, nsp_total] and the model's outputs for one micro-batch."""
        from model import pretraining_loss

        out = self.engine(batch["input_ids"], batch["token_type_ids"], batch["attention_mask"],
                          batch["masked_lm_positions"], layout=layout)
        return *pretraining_loss(out.mlm_logits, out.nsp_logits, batch["masked_lm_ids"], batch["next_sentence_label"]), out

    def _micro_step(self, batch: dict[str, Any], stats: torch.Tensor, nonfinite: torch.Tensor) -> None:
        """Forward and backward of one loader batch; its statistics go into `stats` and a 1 into
        `nonfinite` if its loss is not finite. All on the device: no host sync (a test counts them)."""
        batch, layout = to_device(batch, self.device)
        loss, counts, _ = self._forward(batch, layout)
        nonfinite.add_(~torch.isfinite(loss))
        self.engine.backward(loss)
        stats[0] += loss.detach().double()
        stats[1] += 1
        stats[2:6] += counts
        stats[6] += batch["attention_mask"].sum()

    def run_step(self, batches: Any) -> tuple[list[float], list[torch.Tensor], float, bool]:
        """One optimizer step from the loader iterator `batches`: the micro-steps, the step's one host
        sync, then the update (none if a loss was not finite). Returns the summed statistics (see
        below), this rank's sample ids, the update's lr and whether it was applied. `train()` runs it,
        and `bench/pretrain_gpu.py` times it."""
        # [loss_sum, micro_batches, mlm_correct, mlm_total, nsp_correct, nsp_total, tokens, stop],
        # then one non-finite flag per micro-batch of the step.
        stats = torch.zeros(8 + self.grad_accum, dtype=torch.float64, device=self.device)
        sample_ids: list[torch.Tensor] = []
        for micro in range(self.grad_accum):
            batch, self.position = next(batches)
            sample_ids.append(batch["sample_index"])
            self._micro_step(batch, stats, stats[8 + micro])
            if micro + 1 < self.grad_accum:
                self.engine.step()  # inside the accumulation: DeepSpeed counts the micro-step
        assert self.engine.is_gradient_accumulation_boundary(), "micro-steps out of step with DeepSpeed's"
        # The lr this update uses: engine.step() advances the schedule at the boundary.
        lr = float(self.engine.get_lr()[0])
        stats[7] = 1.0 if self._stop_signal is not None else 0.0
        # The step's one host sync: every rank's statistics, stop request and non-finite flags.
        dist.all_reduce(stats)  # also agrees on stopping: every rank saves at the same step
        host = stats.tolist()
        if any(host[8:]):
            self.nonfinite_total += self.skipper.skip(self.engine, host[8:], sample_ids, self.step + 1,
                                                      self.nonfinite_total)
            return host, sample_ids, lr, False
        self.skipper.in_a_row = 0
        self.engine.step()
        if not self.engine.was_step_applied():  # an fp16 overflow: DeepSpeed lowered the loss scale and
            return host, sample_ids, lr, False  # skipped the update and the lr step; so does our count
        self.step += 1
        return host, sample_ids, lr, True

    def train(self) -> int:
        cfg = self.cfg
        previous = {s: signal.signal(s, self._on_signal) for s in STOP_SIGNALS}
        self.engine.train()
        batches = iter(self.loader)
        last_saved = self.step
        t_last, ema_step_time = time.monotonic(), None
        try:
            while self.step < cfg.schedule.total_steps:
                host, sample_ids, lr, applied = self.run_step(batches)
                if not applied:  # a non-finite loss: the next step retries with the next global batch
                    if host[7] > 0:
                        if last_saved != self.step:
                            self.save()
                        return self._stopped()
                    continue
                ids = self._gather_ids(sample_ids) if cfg.log.sample_ids else None
                now = time.monotonic()
                step_time, t_last = now - t_last, now
                ema_step_time = step_time if ema_step_time is None else 0.9 * ema_step_time + 0.1 * step_time
                record = self._record(torch.tensor(host[:8], dtype=torch.float64), step_time, ema_step_time, ids, lr)
                if (cfg.log.eval_every and self.step % cfg.log.eval_every == 0) or self.step == cfg.schedule.total_steps:
                    record.update(self.evaluate())
                if self.step % cfg.log.log_every == 0 or "eval_mlm_accuracy" in record:
                    self.metrics.write(record)
                stop = host[7] > 0 and self.step < cfg.schedule.total_steps  # at the last step it is done anyway
                if stop or (cfg.checkpoint.save_every and self.step % cfg.checkpoint.save_every == 0):
                    self.save()
                    last_saved = self.step
                if stop:
                    return self._stopped()
                t_last = time.monotonic()  # checkpoint and eval time is not step time
            if last_saved != self.step:
                self.save()
            log.info("finished %d steps; checkpoints in %s", self.step, self.ckpt_dir)
            return 0
        finally:
            for s, handler in previous.items():
                signal.signal(s, handler)
            self.metrics.close()

    def _gather_ids(self, parts: list[torch.Tensor]) -> list[int]:
        """This step's sample ids from every rank, in global stream order (rank-major per micro round)."""
        mine = (torch.stack(parts) if parts else torch.zeros(0, self.cfg.data.micro_batch_size, dtype=torch.long)
                ).to(self.device)
        gathered = [torch.zeros_like(mine) for _ in range(self.world)]
        dist.all_gather(gathered, mine)
        rounds = torch.stack(gathered, dim=1)  # [rounds, world, micro]
        return rounds.reshape(-1).tolist()

    def _record(self, stats: torch.Tensor, step_time: float, ema: float, ids: list[int] | None,
                lr: float) -> dict[str, Any]:
        loss_sum, micro, mlm_ok, mlm_n, nsp_ok, nsp_n, tokens, _ = stats.tolist()
        grad_norm = self.engine.get_global_grad_norm()
        scale = getattr(self.engine.optimizer, "cur_scale", None) if self.cfg.precision.dtype == "fp16" else 1.0
        record: dict[str, Any] = {
            "step": self.step,
            "loss": loss_sum / max(micro, 1),
            "mlm_accuracy": mlm_ok / max(mlm_n, 1),
            "nsp_accuracy": nsp_ok / max(nsp_n, 1),
            "lr": lr,
            "grad_norm": None if grad_norm is None else float(grad_norm),
            "loss_scale": None if scale is None else float(scale),
            "samples": self.position,
            "sequences_per_s": nsp_n / step_time,
            "tokens_per_s": tokens / step_time,
            "step_time_s": step_time,
            "eta_s": ema * (self.cfg.schedule.total_steps - self.step),
            "nonfinite_skipped": self.nonfinite_total,
        }
        if self._peak_tflops:
            record["mfu"] = tokens / step_time * self._flops_per_token / (self._peak_tflops * 1e12 * self.world)
        if ids is not None:
            record["sample_ids"] = ids
        return record

    @torch.no_grad()
    def evaluate(self) -> dict[str, Any]:
        """Held-out MLM accuracy (MLPerf BERT's 72.0% target), NSP accuracy, and MLM accuracy at [MASK] only."""
        from model import mlm_counts_at_mask

        if len(self.heldout) < self.world:
            if self.rank == 0:
                log.info("held-out evaluation skipped: the corpus's heldout split has %d instances", len(self.heldout))
            return {}
        self.engine.eval()
        counts = torch.zeros(6, dtype=torch.float64, device=self.device)
        for batch in heldout_batches(self.heldout, max_samples=self.cfg.log.eval_samples,
                                     micro_batch_size=self.cfg.data.micro_batch_size, rank=self.rank,
                                     world_size=self.world):
            batch = {k: v.to(self.device) for k, v in batch.items()}
            _, c, out = self._forward(batch)
            counts[:4] += c
            counts[4:] += mlm_counts_at_mask(out.mlm_logits, batch["masked_lm_ids"], batch["input_ids"],
                                             batch["masked_lm_positions"], self.mask_id)
        dist.all_reduce(counts)
        self.engine.train()
        ok, n, nsp_ok, nsp_n, at_mask_ok, at_mask_n = counts.tolist()
        return {"eval_mlm_accuracy": ok / max(n, 1), "eval_nsp_accuracy": nsp_ok / max(nsp_n, 1),
                "eval_mlm_accuracy_at_mask": at_mask_ok / max(at_mask_n, 1), "eval_samples": int(nsp_n)}

    def save(self) -> Path:
        meta = {
            "step": self.step,
            "position": self.position,
            "world_size": self.world,
            "nonfinite_total": self.nonfinite_total,
            "manifest_sha256": self.manifest_sha256,
            "corpus_data_sha256": self.corpus.data_sha256,
            "config": to_dict(self.cfg),
            "bert_config": to_dict(self.bert_config),
            "zero_stage": self.cfg.zero.stage,
            "precision": self.cfg.precision.dtype,
            "corpus": {"path": str(self.data_dir), "num_instances": self.manifest.get("num_instances"),
                       "seq_len": self.manifest.get("seq_len"), "lowercase": self.manifest.get("lowercase", True),
                       "vocab_sha256": self.manifest.get("vocab_sha256")},
        }
        return save_checkpoint(self.engine, self.ckpt_dir, self.step, meta, self.vocab_file,
                               self.cfg.checkpoint.keep_last)
