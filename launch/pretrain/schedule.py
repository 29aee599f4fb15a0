"""Learning-rate schedule: linear warmup from 0, then linear / polynomial decay or constant.

A pure function of the step, wrapped as a `LambdaLR` so DeepSpeed steps it once per optimizer step
and saves its state in every checkpoint (a resumed run continues the same curve).
"""

from __future__ import annotations

import functools

import torch

from launch.pretrain.pretrain_config import ScheduleSection


def warmup_steps(s: ScheduleSection) -> int:
    if s.warmup_steps is not None:
        return max(0, s.warmup_steps)
    return int(round(s.warmup_ratio * s.total_steps))


def lr_multiplier(step: int, s: ScheduleSection) -> float:
    """Multiplier of the peak lr at optimizer step `step` (0-based: the lr used by update step+1)."""
    warm = warmup_steps(s)
    if step < warm:
        return (step + 1) / warm
    if s.decay == "constant":
        return 1.0
    if s.decay_over == "run":
        progress = min(1.0, step / max(1, s.total_steps))
    else:
        progress = min(1.0, (step - warm) / max(1, s.total_steps - warm))
    power = 1.0 if s.decay == "linear" else s.power
    return s.min_lr_ratio + (1.0 - s.min_lr_ratio) * (1.0 - progress) ** power


def build_scheduler(optimizer: torch.optim.Optimizer, s: ScheduleSection) -> torch.optim.lr_scheduler.LambdaLR:
    return torch.optim.lr_scheduler.LambdaLR(optimizer, functools.partial(lr_multiplier, s=s))


def apply_after_load(scheduler: torch.optim.lr_scheduler.LambdaLR, lr: float, betas: tuple[float, float], eps: float,
                     weight_decay: float) -> None:
    """Put the run's own optimizer settings back after a checkpoint load, which restores the checkpoint's
    into every parameter group and the schedule's peak lr (and, in ZeRO-3's universal load, the first group's
    into all, with one step counter shared); and the lr of the next update, which the load
    left at the checkpoint's schedule (a run extended with --max-steps made its first update at the old
    curve's end, lr 0). With unchanged settings this writes the values already there, to the bit.
    Groups as `optimizers.param_groups` makes them: [decaying weights, the rest (no decay)]."""
    groups = scheduler.optimizer.param_groups
    scheduler.base_lrs = [lr] * len(groups)
    for index, (group, fn) in enumerate(zip(groups, scheduler.lr_lambdas)):
        group.update(betas=betas, eps=eps, weight_decay=weight_decay if index == 0 else 0.0)
        if "layer_adaptation" in group:  # Lamb's trust ratio, off for biases and LayerNorm (ZeRO-3's universal
            group["layer_adaptation"] = index == 0  # load gave every group the first group's settings)
        group["lr"] = lr * fn(scheduler.last_epoch)
    # ZeRO-3's universal load hands every sub-group one `step` tensor, which each update then advanced once per
    # group (2 a step): the bias corrections went wrong from the resume on. Each gets its own copy.
    seen: set[int] = set()
    for state in scheduler.optimizer.state.values():
        step = state.get("step") if isinstance(state, dict) else None
        if isinstance(step, torch.Tensor):
            if id(step) in seen:
                state["step"] = step.clone()
            seen.add(id(step))
