"""Generate the DeepSpeed JSON from the typed config: the YAML stays the only source of truth.

The optimizer and LR schedule are ours (passed to `deepspeed.initialize` as objects), so the JSON
carries no `optimizer`/`scheduler` blocks; it carries batch geometry, precision, clipping and ZeRO.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from launch.pretrain.pretrain_config import PretrainConfig
from pipeline.atomic_write import write_text_atomic


def deepspeed_config(cfg: PretrainConfig, *, world_size: int, grad_accum: int) -> dict[str, Any]:
    z = cfg.zero
    zero: dict[str, Any] = {
        "stage": z.stage,
        "overlap_comm": z.overlap_comm,
        "contiguous_gradients": z.contiguous_gradients,
        "reduce_bucket_size": z.reduce_bucket_size,
    }
    if z.stage in (1, 2):
        zero["allgather_bucket_size"] = z.allgather_bucket_size
    if z.stage == 3:
        zero["stage3_prefetch_bucket_size"] = z.stage3_prefetch_bucket_size
        zero["stage3_param_persistence_threshold"] = z.stage3_param_persistence_threshold
        # Export consolidates from the partitioned checkpoint itself; no 16-bit gather on save.
        zero["stage3_gather_16bit_weights_on_model_save"] = False
    if z.offload_optimizer != "none":
        zero["offload_optimizer"] = {"device": z.offload_optimizer, "pin_memory": False}
    if z.offload_param != "none":
        zero["offload_param"] = {"device": z.offload_param, "pin_memory": False}

    p = cfg.precision
    ds: dict[str, Any] = {
        "train_batch_size": cfg.data.global_batch_size,
        "train_micro_batch_size_per_gpu": cfg.data.micro_batch_size,
        "gradient_accumulation_steps": grad_accum,
        "gradient_clipping": cfg.optim.max_grad_norm,
        "zero_optimization": zero,
        # Our LAMB/AdamW are plain torch optimizers over whatever ZeRO hands them (LAMB gathers
        # whole-parameter norms itself); DeepSpeed must not swap in its own CPU optimizer.
        "zero_allow_untested_optimizer": True,
        "zero_force_ds_cpu_optimizer": False,
        "steps_per_print": 10**9,  # our metrics path logs; keep DeepSpeed quiet
        "wall_clock_breakdown": False,
        "bf16": {"enabled": p.dtype == "bf16"},
        "fp16": {"enabled": p.dtype == "fp16"},
    }
    if p.dtype == "bf16":
        # ZeRO 1/2 otherwise accumulates gradients in the parameter dtype: 256 micro-steps of bf16
        # sums (8 mantissa bits) lose the small contributions; fp32 buffers cost 2 bytes/param more.
        ds["data_types"] = {"grad_accum_dtype": "fp32"}
    if p.dtype == "fp16":
        ds["fp16"].update(
            loss_scale=p.loss_scale,
            initial_scale_power=p.initial_scale_power,
            loss_scale_window=p.loss_scale_window,
            min_loss_scale=p.min_loss_scale,
            hysteresis=2,
        )
    return ds


def write_deepspeed_config(ds: dict[str, Any], path: Path) -> None:
    """Write the generated JSON in place of any earlier file or link (never through it)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    write_text_atomic(path, json.dumps(ds, indent=2, sort_keys=True) + "\n")
