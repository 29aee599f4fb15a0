"""The pre-training config tree (`bertpipe pretrain --config`), one YAML as the source of truth.

Presets live in `launch/configs/` (tiny, demo, demo-seq64, bert-base, bert-large-phase1, bert-large-phase2). The
DeepSpeed JSON is generated from this tree by `launch/pretrain/deepspeed_config.py`; nothing reads it back.

Batch sizes: `data.global_batch_size` samples make one optimizer step, whatever the world size;
each data-parallel rank runs `data.micro_batch_size` samples per forward, and gradient accumulation
is derived: `global = micro * accumulation * data_parallel_size`. Keeping the global batch fixed is
what lets a run resume at another data-parallel size on the same sample sequence.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass, field
from operator import attrgetter
from typing import Any, Callable, Literal, Optional

from launch.config import coerce_field
from launch.config_flags import flag_of


@dataclass
class ModelSection:
    """preset: a `model.BertConfig` preset (tiny, mini, base, large).
    vocab_size: null = the corpus vocabulary's size; a larger value pads rows (refused if smaller).
    fields: any other `BertConfig` field (e.g. `hidden_dropout_prob`, `attention_impl`, `unpad`).
    activation_checkpointing: recompute each encoder layer in backward (applied from outside the model).
    compile: the fused blocks (`model.compile_fast_paths`: bias+GELU, dropout+add+LayerNorm and the
      MLM head compiled by torch.compile; attention stays on its kernels), applied by the trainer after
      DeepSpeed placed the model; never the whole engine. true, false, or null = auto = off: measured
      on an H200 at BERT-Large seq 128 they gained nothing measurable (docs/PERFORMANCE.md,
      GPU section). Not applied under ZeRO-3.
    compile_mode: torch.compile's mode for those blocks (null = default; e.g. max-autotune-no-cudagraphs).
    """

    preset: str = "base"
    vocab_size: Optional[int] = None
    fields: dict[str, Any] = field(default_factory=dict)
    activation_checkpointing: bool = False
    compile: Optional[bool] = None  # fused blocks via torch.compile: true, false, null = auto (off: no gain measured)
    compile_mode: Optional[str] = None  # torch.compile mode of the fused blocks (null = default)


@dataclass
class DataSection:
    """seed: the loader's shuffle seed (the order is a pure function of (seed, epoch)).
    micro_batch_size: samples per forward per data-parallel rank.
    global_batch_size: samples per optimizer step across all ranks.
    dynamic_masking: re-mask each sample every epoch with `pipeline.masking.mask_tokens`, seeded
      from (seed, epoch, sample id), instead of the corpus's static masks.
    prefetch: batches prepared ahead in a background thread (0 = none).
    """

    seed: int = 1234  # the loader's shuffle seed: the sample order is a pure function of (seed, epoch)
    micro_batch_size: int = 32
    global_batch_size: int = 256
    dynamic_masking: bool = False
    prefetch: int = 4


@dataclass
class OptimSection:
    """name: lamb (ours, correct under ZeRO 1-3) or adamw (torch).
    weight_decay applies to weights, not to biases and LayerNorm parameters; for LAMB those also
    skip layer adaptation (trust ratio 1), as in NVIDIA's LAMB (google-research/bert's Adam has none).
    max_grad_norm: global gradient clipping (0 = off), done by DeepSpeed before the step.
    """

    name: Literal["lamb", "adamw"] = "lamb"
    lr: float = 1e-3  # peak learning rate
    beta1: float = 0.9  # first-moment decay
    beta2: float = 0.999  # second-moment decay
    eps: float = 1e-6  # added to the denominator
    weight_decay: float = 0.01  # on weights only, not on biases and LayerNorm (which LAMB also leaves unadapted)
    max_grad_norm: float = 1.0


@dataclass
class ScheduleSection:
    """Warmup (linear from 0) then decay to `min_lr_ratio * lr` at `total_steps`.
    decay: linear, poly (`power`; NVIDIA's BERT uses 0.5) or constant.
    decay_over: `after_warmup` decays from the peak over the steps after warm-up (Hugging Face's
      schedules); `run` evaluates the decay over the whole run from step 0, so the lr steps down from
      the peak when warm-up ends (google-research/bert's `polynomial_decay` under its warm-up, NVIDIA's
      PolyWarmUpScheduler: what the BERT presets use).
    warmup_steps: null = `warmup_ratio * total_steps`.
    """

    total_steps: int = 1000  # optimizer steps of the run
    warmup_steps: Optional[int] = None
    warmup_ratio: float = 0.01  # warm-up as a share of total_steps when warmup_steps is null
    decay: Literal["linear", "poly", "constant"] = "linear"
    power: float = 1.0  # exponent of the poly decay
    decay_over: Literal["after_warmup", "run"] = "after_warmup"
    min_lr_ratio: float = 0.0  # the lr decays to this share of optim.lr


@dataclass
class ZeroSection:
    """stage: 0 (plain data parallel; fp32 only), 1 (optimizer states), 2 (+ gradients), 3 (+ parameters).
    offload_optimizer: none or cpu.
    offload_param: none or cpu (needs stage 3).
    """

    stage: int = 1
    offload_optimizer: Literal["none", "cpu"] = "none"
    offload_param: Literal["none", "cpu"] = "none"
    overlap_comm: bool = False  # overlap gradient reduction with backward
    contiguous_gradients: bool = True  # copy gradients into one buffer (less fragmentation)
    reduce_bucket_size: int = 50_000_000  # elements per gradient reduction bucket
    allgather_bucket_size: int = 50_000_000  # elements per parameter all-gather bucket
    stage3_prefetch_bucket_size: int = 50_000_000  # ZeRO-3: elements prefetched ahead of use
    stage3_param_persistence_threshold: int = 100_000  # ZeRO-3: parameters smaller than this stay unpartitioned


@dataclass
class PrecisionSection:
    """dtype: fp32, bf16, or fp16 (GPU only; dynamic loss scaling unless `loss_scale` > 0)."""

    dtype: Literal["fp32", "bf16", "fp16"] = "fp32"
    loss_scale: float = 0.0  # fp16: a fixed loss scale; 0 = dynamic
    initial_scale_power: int = 16  # fp16: dynamic scaling starts at 2**this
    loss_scale_window: int = 1000  # fp16: steps without overflow before the scale grows
    min_loss_scale: float = 1.0  # fp16: the dynamic scale never drops below this


@dataclass
class CheckpointSection:
    """save_every: steps between checkpoints (0 = only at the end and on SIGTERM).
    keep_last: checkpoints kept (older ones are deleted after a new one is complete).
    init_from: phase 2: a RUN dir of ours or an HF dir whose weights initialise the model (fresh
      optimizer, schedule and loader).
    """

    save_every: int = 1000
    keep_last: int = 3
    init_from: Optional[str] = None


@dataclass
class LogSection:
    """log_every: steps between metrics lines.
    eval_every: steps between held-out evaluations (0: only after the last step; every run ends with one).
    eval_samples: held-out samples per evaluation.
    tensorboard: write TensorBoard events to RUN/tensorboard/.
    progress_bar: a progress bar on rank 0.
    peak_tflops: per-device peak for the MFU estimate (null = the spec-sheet bf16 peak of a known
      GPU in bf16/fp16; not reported on CPU).
    sample_ids: record each step's global sample ids in metrics.jsonl (for audits and the resume tests).
    max_nonfinite_steps: stop after this many steps in a row with a non-finite loss.
    """

    log_every: int = 1  # steps between metrics lines
    eval_every: int = 500  # steps between held-out evaluations (0: only after the last step)
    eval_samples: int = 2048  # held-out samples per evaluation
    tensorboard: bool = True  # write TensorBoard events to RUN/tensorboard/
    progress_bar: bool = True  # a progress bar on rank 0
    peak_tflops: Optional[float] = None  # per-device peak for MFU (null: the spec-sheet peak of a known GPU)
    sample_ids: bool = False  # record each step's global sample ids in metrics.jsonl (audits, resume tests)
    max_nonfinite_steps: int = 5  # stop after this many steps in a row with a non-finite loss


@dataclass
class PretrainConfig:
    """The whole pre-training run. `seed` seeds model init and dropout (the loader has its own)."""

    seed: int = 42  # seeds model init and dropout (the loader has its own data.seed)
    deterministic: bool = False  # torch's deterministic kernels; on CUDA measured less repeatable than off (docs/pretrain.md)
    model: ModelSection = field(default_factory=ModelSection)
    data: DataSection = field(default_factory=DataSection)
    optim: OptimSection = field(default_factory=OptimSection)
    schedule: ScheduleSection = field(default_factory=ScheduleSection)
    zero: ZeroSection = field(default_factory=ZeroSection)
    precision: PrecisionSection = field(default_factory=PrecisionSection)
    checkpoint: CheckpointSection = field(default_factory=CheckpointSection)
    log: LogSection = field(default_factory=LogSection)


def _count(low: int) -> tuple[Callable[[Any], bool], str]:
    return (lambda v: v >= low), f"at least {low}"


def _real(low: float, high: float = math.inf, *, open_low: bool = False, open_high: bool = False,
          what: str = "") -> tuple[Callable[[Any], bool], str]:
    """A finite number in [low, high] (`open_*`: that end excluded); NaN and infinities never pass."""
    def ok(v: Any) -> bool:
        return math.isfinite(v) and (v > low if open_low else v >= low) and (v < high if open_high else v <= high)
    if high == math.inf:
        shown = f"a finite number {'>' if open_low else '>='} {low:g}"
    else:
        shown = f"in {'(' if open_low else '['}{low:g}, {high:g}{')' if open_high else ']'}"
    return ok, shown + what


def _or_null(check: tuple[Callable[[Any], bool], str]) -> tuple[Callable[[Any], bool], str]:
    return (lambda v: v is None or check[0](v)), f"null or {check[1]}"


_SEED = ((lambda v: 0 <= v < 2**64), "an integer in [0, 2**64)")  # what torch.manual_seed takes

# Every numeric field (but zero.stage, checked below) and the values the code can use.
_RANGES: dict[str, tuple[Callable[[Any], bool], str]] = {
    "seed": _SEED,
    "model.vocab_size": _or_null(_count(1)),
    # torch.compile's own modes: another raised mid-setup, outside the eager fallback
    "model.compile_mode": ((lambda v: v in (None, "default", "reduce-overhead", "max-autotune", "max-autotune-no-cudagraphs")),
                           "null or a torch.compile mode: default, reduce-overhead, max-autotune, max-autotune-no-cudagraphs"),
    "data.seed": _SEED,
    "data.micro_batch_size": _count(1),
    "data.global_batch_size": _count(1),
    "data.prefetch": (lambda v: v >= 0, "0 (no prefetch) or more"),
    "optim.lr": _real(0, open_low=True),
    "optim.beta1": _real(0, 1, open_high=True),
    "optim.beta2": _real(0, 1, open_high=True),
    "optim.eps": _real(0, open_low=True),  # 0 divides by zero for a parameter with no gradient yet
    "optim.weight_decay": _real(0),
    "optim.max_grad_norm": _real(0, what=" (0 = no clipping)"),
    "schedule.total_steps": _count(1),
    "schedule.warmup_steps": (lambda v: v is None or v >= 0, "null (use warmup_ratio) or 0 or more"),
    "schedule.warmup_ratio": _real(0, 1),
    "schedule.power": _real(0, open_low=True),  # a negative power divides by zero at the last step
    "schedule.min_lr_ratio": _real(0, 1),
    "zero.reduce_bucket_size": _count(1),
    "zero.allgather_bucket_size": _count(1),
    "zero.stage3_prefetch_bucket_size": _count(1),
    "zero.stage3_param_persistence_threshold": _count(0),
    "precision.loss_scale": _real(0, what=" (0 = dynamic)"),
    "precision.initial_scale_power": ((lambda v: 0 <= v <= 64), "an integer in [0, 64]"),
    "precision.loss_scale_window": _count(1),
    "precision.min_loss_scale": _real(0, open_low=True),
    "checkpoint.save_every": (lambda v: v >= 0, "0 (only at the end) or more"),
    "checkpoint.keep_last": _count(1),
    "log.log_every": _count(1),
    "log.eval_every": (lambda v: v >= 0, "0 (only after the last step) or more"),
    "log.eval_samples": _count(1),
    "log.peak_tflops": _or_null(_real(0, open_low=True)),
    "log.max_nonfinite_steps": _count(1),
}


def model_fields(model: ModelSection) -> dict[str, Any]:
    """`model.fields` typed as `BertConfig` takes them (`unpad: flase` is refused, not truthy; YAML's
    `"0"` becomes 0.0), or a ValueError naming `model.fields.<name>`."""
    from model.config import BertConfig

    names = [f.name for f in dataclasses.fields(BertConfig)]
    out = {}
    for name, value in model.fields.items():
        key = f"model.fields.{name}"
        if name == "vocab_size":
            raise ValueError(f"{key}: set model.vocab_size (--model.vocab-size) instead")
        if name not in names:
            raise ValueError(f"{key}: not a BertConfig field; valid fields: "
                             f"{', '.join(n for n in names if n != 'vocab_size')}")
        out[name] = coerce_field(BertConfig, name, value, key)
    try:
        BertConfig.preset(model.preset)
    except ValueError as err:
        raise ValueError(f"--model.preset: {err}") from None
    try:  # BertConfig's own checks (dropout in [0, 1), heads dividing hidden_size), named here
        bert = BertConfig.preset(model.preset, **out)
    except ValueError as err:
        raise ValueError(f"model.fields: {err}") from None
    if bert.type_vocab_size < 2:  # an IndexError in the first step: every NSP pair has a segment B
        raise ValueError(f"model.fields type_vocab_size={bert.type_vocab_size}: pre-training's sentence pairs need "
                         "segment ids 0 and 1; leave it at 2")
    return out


def validate(cfg: PretrainConfig, *, world_size: int, device_type: str) -> int:
    """Refuse settings that cannot run here, with the fix in the message; returns grad accumulation.

    Also types `cfg.model.fields` in place (see `model_fields`), as the trainer hands them to BertConfig.
    """
    for key, (ok, wanted) in _RANGES.items():
        value = attrgetter(key)(cfg)
        if not ok(value):
            raise ValueError(f"{flag_of(key)} must be {wanted}, got {value!r}")
    if cfg.log.eval_samples < world_size:
        raise ValueError(f"--log.eval-samples ({cfg.log.eval_samples}) must be at least the data-parallel size "
                         f"({world_size}): each rank evaluates an equal share")
    s = cfg.schedule
    if s.warmup_steps is not None and s.warmup_steps > s.total_steps:
        raise ValueError(f"{flag_of('schedule.warmup_steps')} ({s.warmup_steps}) is more than "
                         f"{flag_of('schedule.total_steps')} ({s.total_steps}): the lr would never reach optim.lr; "
                         "lower the warm-up or raise the total")
    cfg.model.fields = model_fields(cfg.model)
    d = cfg.data
    per_round = d.micro_batch_size * world_size
    if d.global_batch_size % per_round:
        raise ValueError(
            f"data.global_batch_size ({d.global_batch_size}) must be a multiple of "
            f"data.micro_batch_size x data-parallel size ({d.micro_batch_size} x {world_size} = {per_round}); "
            f"change one of them"
        )
    if cfg.zero.stage not in (0, 1, 2, 3):
        raise ValueError(f"zero.stage must be 0, 1, 2 or 3, got {cfg.zero.stage}")
    if cfg.zero.offload_param != "none" and cfg.zero.stage != 3:
        raise ValueError("zero.offload_param needs zero.stage=3; set zero.offload_param=none or zero.stage=3")
    if cfg.precision.dtype != "fp32" and cfg.zero.stage == 0:
        # DeepSpeed's stage-0 16-bit path wraps a client optimizer per tensor and takes a real step
        # with zero gradients at start-up (weight decay, step count); ZeRO-1 costs the same traffic.
        raise ValueError(f"precision.dtype={cfg.precision.dtype} needs zero.stage>=1 (set zero.stage=1)")
    if cfg.precision.dtype == "fp16" and device_type == "cpu":
        raise ValueError("precision.dtype=fp16 is not supported on CPU; use precision.dtype=bf16 or fp32")
    return d.global_batch_size // per_round
