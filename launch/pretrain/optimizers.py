"""Optimizers: torch AdamW, and our LAMB, which stays correct when ZeRO partitions its parameters.

LAMB (You et al., 2020) scales each parameter's Adam-style update u by a trust ratio
||w|| / ||u|| computed over the *whole* parameter tensor. Under ZeRO 1/2 (and DeepSpeed's bf16
optimizer) the optimizer never sees parameters: it gets one flat fp32 partition per param group per
rank, a slice of all the group's parameters concatenated, cut at arbitrary offsets. Under ZeRO-3 it
gets one flat buffer per sub-group made of each parameter's local shard. A naive LAMB there computes
one trust ratio for a whole partition (DeepSpeed's maintainers: LAMB "is not expected to play well
with ZeRO").

Ours keeps, for every flat tensor it will be handed, a list of *segments* `(param_index, start,
numel)` saying which element range belongs to which original parameter. Each step computes local
sums of squares of w and u per segment, adds them into a `[2, num_params]` vector, all-reduces that
vector once over the data-parallel group, and applies each parameter's trust ratio to its
segments. Without ZeRO every tensor is its own single segment and nothing is reduced, which is
textbook LAMB: that is what the ZeRO-2 equality test compares against.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any, Iterable, Sequence

import torch
import torch.distributed as dist

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Segment:
    param_index: int  # index of the original parameter (global numbering, same on every rank)
    start: int  # element offset inside the flat tensor
    numel: int


class Lamb(torch.optim.Optimizer):
    """LAMB with decoupled weight decay, bias correction, and ZeRO-aware trust ratios.

    Group options: lr, betas, eps, weight_decay, `layer_adaptation` (False: trust ratio 1, used for
    biases and LayerNorm as in google-research/bert), `max_trust_ratio` (clamp; 10 by default as in
    DeepSpeed's FusedLamb `max_coeff`, None for unbounded).
    """

    def __init__(
        self,
        params: Iterable[Any],
        lr: float = 1e-3,
        betas: tuple[float, float] = (0.9, 0.999),
        eps: float = 1e-6,
        weight_decay: float = 0.01,
        layer_adaptation: bool = True,
        max_trust_ratio: float | None = 10.0,
    ) -> None:
        if lr < 0 or eps < 0 or not (0 <= betas[0] < 1 and 0 <= betas[1] < 1):
            raise ValueError(f"invalid LAMB hyper-parameters lr={lr} betas={betas} eps={eps}")
        defaults = dict(
            lr=lr, betas=betas, eps=eps, weight_decay=weight_decay,
            layer_adaptation=layer_adaptation, max_trust_ratio=max_trust_ratio,
        )
        super().__init__(params, defaults)
        # Unpartitioned default: each tensor is one whole parameter, numbered in group order.
        self._segments: dict[int, tuple[torch.Tensor, list[Segment]]] = {}
        self._num_params = 0
        for group in self.param_groups:
            for p in group["params"]:
                self._segments[id(p)] = (p, [Segment(self._num_params, 0, p.numel())])
                self._num_params += 1
        self._group: dist.ProcessGroup | None = None
        self._partitioned = False

    def set_partitioning(
        self,
        segments: dict[int, tuple[torch.Tensor, list[Segment]]],
        num_params: int,
        process_group: dist.ProcessGroup | None,
    ) -> None:
        """Tell the optimizer how its (flat) tensors map onto the original parameters."""
        self._segments = segments
        self._num_params = num_params
        self._group = process_group
        self._partitioned = True

    @torch.no_grad()
    def step(self, closure=None):  # type: ignore[override]
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        # Pass 1: Adam moments and the raw update u (stored in place of the bias-corrected ratio).
        work: list[tuple[dict, torch.Tensor, torch.Tensor]] = []
        device = None
        for group in self.param_groups:
            beta1, beta2 = group["betas"]
            for p in group["params"]:
                if p.grad is None:
                    continue
                if p.grad.is_sparse:
                    raise RuntimeError("Lamb does not support sparse gradients")
                state = self.state[p]
                if not state:
                    state["step"] = torch.zeros((), dtype=torch.float32)
                    state["exp_avg"] = torch.zeros_like(p, memory_format=torch.preserve_format)
                    state["exp_avg_sq"] = torch.zeros_like(p, memory_format=torch.preserve_format)
                state["step"] += 1
                step = float(state["step"])
                grad = p.grad.to(p.dtype)
                exp_avg, exp_avg_sq = state["exp_avg"], state["exp_avg_sq"]
                exp_avg.mul_(beta1).add_(grad, alpha=1 - beta1)
                exp_avg_sq.mul_(beta2).addcmul_(grad, grad, value=1 - beta2)
                bias1 = 1 - beta1**step
                bias2 = 1 - beta2**step
                update = (exp_avg / bias1) / ((exp_avg_sq / bias2).sqrt_().add_(group["eps"]))
                if group["weight_decay"]:
                    update.add_(p, alpha=group["weight_decay"])
                work.append((group, p, update))
                device = p.device

        # Pass 2: per-parameter squared norms of w and u, reduced across the partitions.
        sq = torch.zeros(2, self._num_params, dtype=torch.float32, device=device or "cpu")
        index: list[int] = []
        w_views: list[torch.Tensor] = []
        u_views: list[torch.Tensor] = []
        for _, p, update in work:
            if id(p) not in self._segments:
                raise RuntimeError("LAMB was handed a tensor it cannot map to a model parameter; with DeepSpeed, "
                                   "call attach_zero_partitioning() after deepspeed.initialize")
            _, segments = self._segments[id(p)]
            flat_p, flat_u = p.reshape(-1), update.reshape(-1)
            for seg in segments:
                index.append(seg.param_index)
                w_views.append(flat_p.narrow(0, seg.start, seg.numel).float())
                u_views.append(flat_u.narrow(0, seg.start, seg.numel).float())
        if index:
            where = torch.tensor(index, device=sq.device)
            sq[0].index_add_(0, where, torch.stack(torch._foreach_norm(w_views)).pow(2))
            sq[1].index_add_(0, where, torch.stack(torch._foreach_norm(u_views)).pow(2))
        if self._partitioned and dist.is_available() and dist.is_initialized():
            # Every rank reaches this call once per step() (DeepSpeed steps each group on every
            # rank), even with no local segments, so the collective always matches up.
            if sq.device.type == "cpu" and dist.get_backend(self._group) == "nccl":
                # zero.offload_optimizer=cpu hands us CPU partitions, but NCCL reduces GPU tensors only.
                on_device = sq.to(torch.device("cuda", torch.cuda.current_device()))
                dist.all_reduce(on_device, op=dist.ReduceOp.SUM, group=self._group)
                sq = on_device.cpu()
            else:
                dist.all_reduce(sq, op=dist.ReduceOp.SUM, group=self._group)
        w_norm, u_norm = sq.sqrt()
        self.last_norms = (w_norm, u_norm)  # per-parameter ||w||, ||u|| of the last step (for diagnostics)

        # Pass 3: apply lr * trust * u segment by segment.
        for group, p, update in work:
            _, segments = self._segments[id(p)]
            flat_p, flat_u = p.view(-1), update.view(-1)
            for seg in segments:  # each segment is one parameter's slice (or all of it)
                trust = 1.0
                if group["layer_adaptation"]:
                    wn, un = w_norm[seg.param_index], u_norm[seg.param_index]
                    trust_t = torch.where((wn > 0) & (un > 0), wn / un, torch.ones_like(wn))
                    if group["max_trust_ratio"] is not None:
                        trust_t = trust_t.clamp(max=group["max_trust_ratio"])
                    trust = trust_t
                flat_p.narrow(0, seg.start, seg.numel).add_(
                    flat_u.narrow(0, seg.start, seg.numel) * trust, alpha=-group["lr"]
                )
        return loss


def param_groups(model: torch.nn.Module, weight_decay: float) -> list[dict[str, Any]]:
    """Weights decay; biases and LayerNorm parameters neither decay nor get a trust ratio."""
    decay, no_decay = [], []
    for name, p in model.named_parameters():
        if not p.requires_grad:
            continue
        (no_decay if p.dim() < 2 or "LayerNorm" in name or "layer_norm" in name or name.endswith("bias") else decay).append(p)
    return [
        {"params": decay, "weight_decay": weight_decay},
        {"params": no_decay, "weight_decay": 0.0, "layer_adaptation": False},
    ]


def build_optimizer(model: torch.nn.Module, name: str, lr: float, betas: tuple[float, float], eps: float,
                    weight_decay: float) -> torch.optim.Optimizer:
    groups = param_groups(model, weight_decay)
    if name == "lamb":
        return Lamb(groups, lr=lr, betas=betas, eps=eps, weight_decay=weight_decay)
    if name == "adamw":
        for g in groups:
            g.pop("layer_adaptation", None)
        return torch.optim.AdamW(groups, lr=lr, betas=betas, eps=eps, weight_decay=weight_decay)
    raise ValueError(f"optim.name must be lamb or adamw, got {name!r}")


def attach_zero_partitioning(lamb: Lamb, engine: Any, params: Sequence[torch.nn.Parameter]) -> None:
    """Map the flat fp32 partitions DeepSpeed gives `lamb` back to the model's parameters.

    `params` must be the model's parameters in the same order on every rank (that order numbers
    them in the norm vector). Stages 1/2 and the bf16 optimizer expose, per parameter, the slice of
    this rank's flat partition that holds it (`param._hp_mapping.hp_fragment`); ZeRO-3 records
    `grad_position[param_id] = (sub_group, offset, numel)` in its flat fp32 buffers. We locate each
    slice inside its flat tensor by storage offset, which checks the mapping rather than trusting it.
    """
    zero_opt = engine.optimizer
    flats: list[torch.Tensor] = []
    local_views: list[tuple[int, torch.Tensor]] = []
    if hasattr(zero_opt, "fp32_partitioned_groups_flat"):  # ZeRO-3
        flats = list(zero_opt.fp32_partitioned_groups_flat)
        for index, p in enumerate(params):
            sub_group, offset, numel = zero_opt.grad_position[zero_opt.get_param_id(p)]
            # The last rank's shard is padded past the parameter's end: those elements are not
            # part of the parameter and must not enter its norm.
            rank = dist.get_rank(group=p.ds_process_group)
            valid = max(0, min(numel, p.ds_numel - rank * p.partition_numel()))
            if valid:
                local_views.append((index, flats[sub_group].narrow(0, offset, valid)))
    else:
        for attr in ("single_partition_of_fp32_groups", "fp32_groups_flat_partition"):
            if hasattr(zero_opt, attr):
                flats = list(getattr(zero_opt, attr))
                break
        if not flats:
            raise RuntimeError(f"cannot map LAMB onto {type(zero_opt).__name__}: no flat fp32 partitions found")
        for index, p in enumerate(params):
            mapping = getattr(p, "_hp_mapping", None)
            if mapping is not None:
                local_views.append((index, mapping.hp_fragment))

    segments: dict[int, tuple[torch.Tensor, list[Segment]]] = {id(f): (f, []) for f in flats}
    for index, view in local_views:
        owner = _owner(flats, view)
        start = (view.data_ptr() - owner.data_ptr()) // owner.element_size()
        segments[id(owner)][1].append(Segment(index, start, view.numel()))
    group = getattr(zero_opt, "dp_process_group", None)
    lamb.set_partitioning(segments, len(params), group)
    log.debug("LAMB mapped %d parameter slices onto %d flat partitions", len(local_views), len(flats))


def _owner(flats: list[torch.Tensor], view: torch.Tensor) -> torch.Tensor:
    ptr = view.data_ptr()
    for flat in flats:
        base = flat.data_ptr()
        if base <= ptr and ptr + view.numel() * view.element_size() <= base + flat.numel() * flat.element_size():
            return flat
    raise RuntimeError("a ZeRO parameter slice lies in none of the optimizer's flat partitions")
