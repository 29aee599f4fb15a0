"""What keeps the trainer's micro-step free of host syncs, and the fused blocks it runs.

- `compile_blocks`: `model.compile_fast_paths` (fused bias+GELU, dropout+add+LayerNorm, MLM head)
  applied by the trainer after DeepSpeed placed the model, never a whole-engine `torch.compile`
  (that broke the graph at the data-dependent shapes of unpadding).
- `to_device`: a loader batch onto the device, asynchronously (the loader pins it on CUDA), plus the
  unpadded layout the loader computed on the CPU, so the model never calls `nonzero`/`.item()`.
- `UpdateSkipper`: a step whose micro-batches produced a non-finite loss is not applied. The check is
  one device-side flag per micro-batch, read once per optimizer step (with the step's statistics),
  instead of an all-reduce and `.item()` before every backward.
"""

from __future__ import annotations

import logging
from typing import Any

import torch

log = logging.getLogger(__name__)


def compile_enabled(setting: bool | None, device_type: str, zero_stage: int) -> bool:
    """`model.compile`: true/false, or null = on where it has been checked (see PretrainConfig)."""
    if setting is None:
        return False  # auto: off; on an H200 the fused blocks gained nothing measurable (docs/PERFORMANCE.md)
    if setting and zero_stage == 3:
        # ZeRO-3 gathers parameters in module hooks, which a compiled block would trace into.
        log.warning("model.compile is not applied under ZeRO-3 (its parameter hooks run inside the blocks); eager")
        return False
    return setting


def compile_blocks(module: torch.nn.Module, mode: str | None) -> int:
    from model import compile_fast_paths

    return compile_fast_paths(module, mode=mode)


def to_device(batch: dict[str, Any], device: torch.device) -> tuple[dict[str, Any], Any]:
    """(tensors on `device`, the precomputed `model.Unpadded` layout or None). Copies are
    `non_blocking`: from pinned memory they overlap compute instead of waiting for it."""
    from model import Unpadded

    moved = {k: v.to(device, non_blocking=True) for k, v in batch.items() if isinstance(v, torch.Tensor)}
    layout = None
    if "unpad_indices" in moved:
        b, l = moved["input_ids"].shape
        layout = Unpadded.precomputed(moved["unpad_indices"], moved["cu_seqlens"], batch["max_seqlen"], b, l)
    return moved, layout


class NonFiniteLossError(RuntimeError):
    """The run diverged: `log.max_nonfinite_steps` steps in a row with a non-finite loss."""


DIVERGED_EXIT = 3  # the exit code of a diverged run, however it was launched (not 2: no flag was wrong)


class UpdateSkipper:
    """Drops the update of a step that produced a non-finite loss, without leaving DeepSpeed's step
    sequence, and counts the steps in a row with one (the run stops at `max_in_a_row`).

    `engine.step()` still runs at the boundary (DeepSpeed's micro-step count, gradient buffers and
    ZeRO bookkeeping stay as they always are), but a step pre-hook on our optimizer removes every
    gradient it is handed, so no parameter and no optimizer state moves (torch optimizers and our
    LAMB skip parameters without a gradient); the lr schedule is put back where it was, so the next
    applied update uses the lr this one would have used.
    """

    def __init__(self, optimizer: torch.optim.Optimizer, scheduler: Any, max_in_a_row: int) -> None:
        self.scheduler = scheduler
        self.max_in_a_row = max_in_a_row
        self.in_a_row = 0
        self.active = False
        optimizer.register_step_pre_hook(self._drop_gradients)

    def _drop_gradients(self, optimizer: torch.optim.Optimizer, _args: Any, _kwargs: Any) -> None:
        if self.active:
            for group in optimizer.param_groups:
                for p in group["params"]:
                    p.grad = None

    def skip(self, engine: Any, flags: list[float], sample_ids: list[torch.Tensor], step: int, total: int) -> int:
        """Step `step` had a non-finite loss in the micro-batches whose flag (summed over ranks) is
        not 0: log each, drop the update; returns how many. Raises NonFiniteLossError at the limit."""
        # Steps, as the setting's name says: counted by micro-batch, one step of a large accumulation could
        # reach the limit alone.
        self.in_a_row += 1
        for i in [i for i, flag in enumerate(flags) if flag]:
            total += 1
            # A dropped update leaves the step count where it was: "try N" tells the retries of one step apart.
            log.warning("non-finite loss at step %d, try %d (micro-batch %d of %d, samples %s...): micro-batch "
                        "skipped, and with it this try's update; the step is retried with the next global batch "
                        "(%d step(s) in a row, %d micro-batch(es) in total)", step, self.in_a_row, i + 1,
                        len(flags), sample_ids[i][:4].tolist(), self.in_a_row, total)
        if self.in_a_row >= self.max_in_a_row:
            raise NonFiniteLossError(
                f"{self.in_a_row} steps in a row with a non-finite loss, at step {step}; lower optim.lr, "
                f"use precision.dtype=bf16 instead of fp16, or resume from an earlier checkpoint")
        state = self.scheduler.state_dict() if self.scheduler is not None else None
        lrs = [g["lr"] for g in self.scheduler.optimizer.param_groups] if state is not None else []
        self.active = True
        try:
            engine.step()
        finally:
            self.active = False
        if state is not None:
            self.scheduler.load_state_dict(state)
            for group, lr in zip(self.scheduler.optimizer.param_groups, lrs):
                group["lr"] = lr
        return sum(1 for f in flags if f)
