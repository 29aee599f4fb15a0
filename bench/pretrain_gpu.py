"""BERT-Large pre-training on one GPU: our trainer's own step vs transformers.BertForPreTraining, same DeepSpeed config.

Ours is `launch.pretrain.trainer.Trainer` itself, built from the `bert-large-phase1|2` preset and
stepped through `Trainer.run_step`: its loader (prefetch thread, CPU-side unpadding, pinned batches),
its fused blocks (`model.compile`), its loss, its one host sync per step, and the preset's ZeRO stage
and gradient accumulation (`--accumulation` lowers it for a quicker run). transformers
(`attn_implementation="sdpa"`, labels over all positions as its API takes them) gets the same
generated DeepSpeed config, the same optimizer and a loop of the same shape over the same loader.

Fairness: both engines live side by side and are timed in interleaved rounds (the order alternates),
`--repeats` rounds of `--steps` optimizer steps after `--warmup` untimed ones; each figure is the
median over rounds with its spread (min-max). Model FLOPs per token = 6 N + 12 L H S (N = non-
embedding parameters), the trainer's formula, over real (non-padding) tokens; both models are
credited the same FLOPs. Also reported: MFU against the bf16 dense spec peak and against a large
bf16 matmul measured in this run, peak memory per runner (reset before each of its rounds, max over
them; both engines stay resident, so the rows differ by their step's working memory; a runner that runs
out of memory is reported as such and the other goes on), the padding fraction of the batches, dynamo graphs and
recompiles. After each phase's table (so a time limit hit later still leaves the rows): a forward /
backward / optimizer split of one step (each phase synchronised, so its sum exceeds the free-running
step), and, from the profiler over one micro-batch's forward and backward, the attention kernels that
ran and the top kernels by GPU time.

  .venv/bin/python bench/pretrain_gpu.py --prepare --corpus-dir .bench/large   # CPU: the corpora, with Beam
  python bench/pretrain_gpu.py --corpus-dir .bench/large --accumulation 4      # GPU: phases 128 and 512
  .venv/bin/python bench/pretrain_gpu.py --cpu-smoke           # CPU check: tiny model, few steps
"""

from __future__ import annotations

import argparse
import logging
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

import torch

from launch.config import load_config
from launch.pretrain.optimizers import Lamb, attach_zero_partitioning, build_optimizer
from launch.pretrain.pretrain_config import PretrainConfig
from launch.pretrain.schedule import build_scheduler
from launch.pretrain.training_log import flops_per_token, spec_peak_tflops

REPO = Path(__file__).resolve().parents[1]
DATA = REPO / "data"
ATTENTION_KERNEL = ("flash", "fmha", "attention", "attn", "sdpa", "cutlass")

log = logging.getLogger("bench.pretrain_gpu")


def build_corpus(out: Path, seq_len: int) -> Path:
    """The bundled books + Wikipedia dump through `bertpipe corpus` (phase settings of the paper)."""
    from launch import cli

    if (out / "manifest.json").is_file():
        return out
    max_pred = 20 if seq_len <= 128 else 80
    argv = ["corpus", "--input", *map(str, sorted((DATA / "books").glob("*.txt"))),
            *map(str, sorted((DATA / "wiki").glob("*.bz2"))), "--vocab", str(DATA / "vocab" / "bert-base-uncased-vocab.txt"),
            "--out", str(out), "--seq-len", str(seq_len), "--max-predictions", str(max_pred), "--dupe-factor", "2",
            "--seed", "1234", "--num-shards", "2"]
    if cli.main(argv) != 0:
        raise SystemExit(f"bertpipe corpus failed for seq {seq_len}")
    return out


def measured_matmul_tflops(device: torch.device, dtype: torch.dtype, n: int) -> float:
    a, b = torch.randn(n, n, device=device, dtype=dtype), torch.randn(n, n, device=device, dtype=dtype)
    for _ in range(3):
        a @ b
    _sync(device)
    reps = 20 if device.type == "cuda" else 2
    t0 = time.perf_counter()
    for _ in range(reps):
        a @ b
    _sync(device)
    return 2 * n**3 * reps / (time.perf_counter() - t0) / 1e12


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


class Ours:
    """The trainer itself; one `step()` = `Trainer.run_step` (loader included)."""

    label = "ours"

    def __init__(self, cfg: PretrainConfig, corpus: Path, run_dir: Path) -> None:
        from launch.pretrain.trainer import Trainer

        self.trainer = Trainer(cfg, data_dir=corpus, run_dir=run_dir)
        self.trainer.setup()
        self.trainer.engine.train()
        self.engine, self.accum = self.trainer.engine, self.trainer.grad_accum
        self.batches = iter(self.trainer.loader)
        self.real_tokens = self.padded_tokens = 0

    def step(self) -> None:
        host, *_ = self.trainer.run_step(self.batches)
        self.real_tokens += host[6]

    def _loss(self, batch: dict) -> torch.Tensor:
        from launch.pretrain.fast_step import to_device

        moved, layout = to_device(batch, self.engine.device)
        loss, _, _ = self.trainer._forward(moved, layout)
        return loss

    def phases(self) -> tuple[float, float, float]:
        return timed_phases(self.engine, self.batches, self.accum, self._loss)


class Transformers:
    """transformers.BertForPreTraining under the same DeepSpeed config, optimizer and loader."""

    label = "transformers"

    def __init__(self, ours: Ours, init_dir: Path) -> None:
        import deepspeed
        import transformers

        from pipeline.loader import PretrainLoader

        tr = ours.trainer
        model = transformers.BertForPreTraining.from_pretrained(str(init_dir), attn_implementation="sdpa")
        if tr.cfg.model.activation_checkpointing:  # ours recomputes each layer's forward: so does the peer
            model.gradient_checkpointing_enable()
        o, params = tr.cfg.optim, [p for p in model.parameters() if p.requires_grad]
        optimizer = build_optimizer(model, o.name, o.lr, (o.beta1, o.beta2), o.eps, o.weight_decay)
        self.engine, *_ = deepspeed.initialize(model=model, optimizer=optimizer, config=tr.ds_config,
                                               lr_scheduler=lambda opt: build_scheduler(opt, tr.cfg.schedule))
        if isinstance(optimizer, Lamb) and self.engine.optimizer is not optimizer:
            attach_zero_partitioning(optimizer, self.engine, params)
        self.engine.train()
        self.accum, self.device = tr.grad_accum, tr.device
        loader = PretrainLoader(tr.train_split, seed=tr.cfg.data.seed, micro_batch_size=tr.cfg.data.micro_batch_size,
                                global_batch_size=tr.cfg.data.global_batch_size, prefetch=tr.cfg.data.prefetch,
                                pin_memory=tr.device.type == "cuda")
        self.batches = iter(loader)
        self.real_tokens = self.padded_tokens = 0

    def _loss(self, batch: dict) -> torch.Tensor:
        b = {k: v.to(self.device, non_blocking=True) for k, v in batch.items() if isinstance(v, torch.Tensor)}
        labels = torch.full_like(b["input_ids"], -100)  # transformers takes labels over all positions
        labels.scatter_(1, b["masked_lm_positions"], b["masked_lm_ids"])
        labels[:, 0] = -100  # padded predictions point at position 0 ([CLS]) with label -100
        return self.engine(input_ids=b["input_ids"], token_type_ids=b["token_type_ids"], attention_mask=b["attention_mask"],
                           labels=labels, next_sentence_label=b["next_sentence_label"]).loss

    def step(self) -> None:
        for _ in range(self.accum):
            batch, _ = next(self.batches)
            self.real_tokens += int(batch["attention_mask"].sum())
            self.engine.backward(self._loss(batch))
            self.engine.step()
        _ = float(self.engine.get_lr()[0])

    def phases(self) -> tuple[float, float, float]:
        return timed_phases(self.engine, self.batches, self.accum, self._loss)


def timed_phases(engine, batches, accum: int, loss_of) -> tuple[float, float, float]:
    """(forward, backward) per micro-batch and the optimizer step, each synchronised; one global batch
    of either runner (`loss_of(batch)` is its forward, device copy included)."""
    t = _Phases(engine.device)
    for _ in range(accum):
        batch, _ = next(batches)
        with t("fwd"):
            loss = loss_of(batch)
        with t("bwd"):
            engine.backward(loss)
        with t("opt"):
            engine.step()
    return t.per(accum)


class _Phases:
    def __init__(self, device: torch.device) -> None:
        self.device, self.total = device, {"fwd": 0.0, "bwd": 0.0, "opt": 0.0}

    def __call__(self, name: str):
        outer = self

        class _Timer:
            def __enter__(self):
                _sync(outer.device)
                self.t0 = time.perf_counter()

            def __exit__(self, *exc):
                _sync(outer.device)
                outer.total[name] += time.perf_counter() - self.t0

        return _Timer()

    def per(self, accum: int) -> tuple[float, float, float]:
        # engine.step() inside the accumulation does no update: the step's optimizer time is the sum.
        return self.total["fwd"] / accum, self.total["bwd"] / accum, self.total["opt"]


def profile(runner, device: torch.device) -> tuple[list[str], list[tuple[str, float]]]:
    """One micro-batch's forward and backward under torch.profiler: attention kernel names, and the top
    kernels by device time. One micro-batch, not a global step: the profiler's bookkeeping over a whole
    BERT-Large step at accumulation 16 took minutes (H200, 2026-11-26). Run after all timing."""
    from torch.profiler import ProfilerActivity, profile as torch_profile

    batch, _ = next(runner.batches)
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if device.type == "cuda" else [])
    with torch_profile(activities=activities) as prof:
        runner.engine.backward(runner._loss(batch))
        _sync(device)
    if device.type == "cuda":
        events = [e for e in prof.key_averages() if e.device_type == torch.autograd.DeviceType.CUDA]
        key = lambda e: e.self_device_time_total  # noqa: E731
    else:  # CPU smoke: operators stand in for kernels
        events = list(prof.key_averages())
        key = lambda e: e.self_cpu_time_total  # noqa: E731
    attention = sorted({e.key for e in events if any(k in e.key.lower() for k in ATTENTION_KERNEL)
                        and not e.key.startswith("autograd::")})
    top = [(e.key, key(e) / 1e3) for e in sorted(events, key=key, reverse=True)[:8]]
    return attention, top


def dynamo_counts() -> tuple[int, int]:
    from torch._dynamo.utils import counters

    return int(counters["stats"].get("unique_graphs", 0)), int(sum(counters["recompiles"].values()))


def bench_phase(args, seq_len: int, device: torch.device, tmp: Path) -> list[dict]:
    from model import save_pretrained

    phase = "bert-large-phase1" if seq_len <= 128 else "bert-large-phase2"
    preset = load_config(PretrainConfig, phase, [])
    micro = args.micro_batch or preset.data.micro_batch_size
    accum = args.accumulation or preset.data.global_batch_size // micro  # one GPU: the preset's accumulation
    overrides = [f"data.micro_batch_size={micro}", f"data.global_batch_size={micro * accum}",
                 f"precision.dtype={args.dtype}", f"optim.name={args.optim}", "schedule.total_steps=1000000",
                 "checkpoint.save_every=0", "log.eval_every=0", "log.tensorboard=false", "log.progress_bar=false",
                 f"model.compile={'true' if args.compile else 'false'}", f"model.preset={args.preset}"]
    if args.zero is not None:
        overrides.append(f"zero.stage={args.zero}")
    if args.activation_checkpointing is not None:
        overrides.append(f"model.activation_checkpointing={str(args.activation_checkpointing).lower()}")
    if args.compile_mode:
        overrides.append(f"model.compile_mode={args.compile_mode}")
    cfg = load_config(PretrainConfig, phase, overrides)
    cfg.model.fields = {**cfg.model.fields, "attention_probs_dropout_prob": args.attention_dropout}
    if args.varlen_dropout is not None:
        cfg.model.fields["varlen_dropout"] = args.varlen_dropout
    corpus = Path(args.corpus) if args.corpus else build_corpus(corpus_root(args, tmp) / f"seq{seq_len}", seq_len)

    torch.manual_seed(0)
    ours = Ours(cfg, corpus, tmp / f"run{seq_len}")
    save_pretrained(ours.engine.module, tmp / f"init{seq_len}")  # the peer starts from the very same weights
    runners = [ours]
    try:
        runners.append(Transformers(ours, tmp / f"init{seq_len}"))
    except torch.OutOfMemoryError:
        log.warning("transformers ran out of memory next to ours at micro-batch %d, seq %d", micro, seq_len)
    def oom(r, where: str) -> None:  # this runner's result is the error; the other goes on
        r.error = f"out of memory ({where})"
        log.warning("%s ran out of memory (%s) at micro-batch %d, seq %d", r.label, where, micro, seq_len)
        if device.type == "cuda":
            torch.cuda.empty_cache()

    for r in runners:
        r.error, r.peak_gib = None, 0.0 if device.type == "cuda" else float("nan")
        try:
            for _ in range(args.warmup):  # compilation, allocator, loader queue
                r.step()
            _sync(device)
        except torch.OutOfMemoryError:
            oom(r, "warm-up")
        r.times, r.real_tokens = [], 0
    graphs0, recompiles0 = dynamo_counts()
    for round_ in range(args.repeats):
        for r in (runners if round_ % 2 == 0 else runners[::-1]):
            if r.error:
                continue
            # Peak per runner: reset before each of its rounds, keep the max over them. Both engines stay
            # resident (weights, gradients, optimizer state), so the rows differ by the step's working memory.
            if device.type == "cuda":
                torch.cuda.reset_peak_memory_stats(device)
            try:
                _sync(device)
                t0 = time.perf_counter()
                for _ in range(args.steps):
                    r.step()
                _sync(device)
            except torch.OutOfMemoryError:
                oom(r, f"timed round {round_ + 1}")
                continue
            r.times.append((time.perf_counter() - t0) / args.steps)
            if device.type == "cuda":
                r.peak_gib = max(r.peak_gib, torch.cuda.max_memory_allocated(device) / 2**30)
    graphs, recompiles = dynamo_counts()

    arch = ours.trainer.bert_config
    non_embedding = sum(p.numel() for n, p in ours.engine.module.named_parameters() if "embeddings" not in n)
    flops_token = flops_per_token(non_embedding, arch.num_hidden_layers, arch.hidden_size, seq_len)
    samples_per_step = micro * accum
    results = []
    for r in runners:
        if r.error:
            results.append(dict(label=r.label, phase=seq_len, micro=micro, accum=accum, error=r.error, peak_gib=r.peak_gib))
            continue
        median, lo, hi = statistics.median(r.times), min(r.times), max(r.times)
        real_per_step = r.real_tokens / (len(r.times) * args.steps)
        results.append(dict(
            label=r.label, phase=seq_len, micro=micro, accum=accum, step_s=median, spread=(hi - lo) / median,
            seq_s=samples_per_step / median, tok_s=real_per_step / median,
            tflops=flops_token * real_per_step / median / 1e12, padding=1 - real_per_step / (samples_per_step * seq_len),
            peak_gib=r.peak_gib, error=None))
    results[0].update(graphs=graphs, recompiles=recompiles - recompiles0, new_graphs=graphs - graphs0)
    return runners, results


def split_and_profile(runner, device: torch.device) -> str:
    """After the timed rounds: the synchronised forward / backward / optimizer split of one global step
    and the profiled micro-batch, as the lines to print (or why they are missing)."""
    if runner.error:
        return ""
    try:
        fwd, bwd, opt = (1e3 * x for x in runner.phases())
        attention, top = profile(runner, device)
    except torch.OutOfMemoryError:
        if device.type == "cuda":
            torch.cuda.empty_cache()
        return f"  {runner.label}: out of memory in the split / profiled step"
    return (f"  {runner.label} split (each phase synchronised): forward {fwd:.1f} ms, backward {bwd:.1f} ms per "
            f"micro-batch, optimizer {opt:.1f} ms per step\n"
            f"  {runner.label} attention kernels: {', '.join(attention) or '(none named)'}\n"
            f"  {runner.label} top kernels (ms, one profiled micro-batch forward + backward): "
            + "; ".join(f"{k[:60]} {ms:.1f}" for k, ms in top))


def corpus_root(args, tmp: Path) -> Path:
    return Path(args.corpus_dir) if args.corpus_dir else tmp


def _preset_or(flag: bool | None) -> str:
    return "(the preset's)" if flag is None else str(flag)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--phases", type=int, nargs="+", default=[128, 512], help="sequence lengths")
    parser.add_argument("--preset", default="large")
    parser.add_argument("--micro-batch", type=int, help="samples per micro-step (default: the preset's)")
    parser.add_argument("--accumulation", type=int, help="micro-steps per optimizer step (default: the preset's on one GPU)")
    parser.add_argument("--steps", type=int, default=3, help="optimizer steps per timed round")
    parser.add_argument("--repeats", type=int, default=3, help="interleaved timed rounds per model")
    parser.add_argument("--warmup", type=int, default=2, help="untimed optimizer steps (compilation, allocator)")
    parser.add_argument("--zero", type=int, choices=(1, 2), help="ZeRO stage (default: the preset's)")
    parser.add_argument("--dtype", choices=("bf16", "fp32"), default="bf16")
    parser.add_argument("--optim", choices=("lamb", "adamw"), default="lamb")
    parser.add_argument("--attention-dropout", type=float, default=0.1, help="both models (the paper's 0.1)")
    parser.add_argument("--varlen-dropout", action=argparse.BooleanOptionalAction,
                        help="ours: varlen flash attention with attention dropout (model.fields.varlen_dropout; "
                             "default: the phase preset's)")
    parser.add_argument("--activation-checkpointing", action=argparse.BooleanOptionalAction,
                        help="both models recompute each layer's forward in the backward (default: the phase "
                             "preset's)")
    parser.add_argument("--compile", action=argparse.BooleanOptionalAction, default=False,
                        help="ours with the fused blocks (model.compile); off as in the trainer: on an H200 they "
                             "gained nothing measurable (docs/PERFORMANCE.md)")
    parser.add_argument("--compile-mode", help="torch.compile mode of the fused blocks (model.compile_mode)")
    parser.add_argument("--corpus", help="an existing corpus directory, used for every phase")
    parser.add_argument("--corpus-dir", help="per-phase corpora DIR/seq128, DIR/seq512, built from the bundled data "
                                             "where missing (default: a temporary directory)")
    parser.add_argument("--prepare", action="store_true",
                        help="only build the --corpus-dir corpora and exit (here, for a GPU machine without Beam)")
    parser.add_argument("--peak-tflops", type=float, help="bf16 dense peak of this GPU (default: from its name)")
    parser.add_argument("--cpu-smoke", action="store_true", help="tiny model on CPU, few steps: checks the script, not speed")
    args = parser.parse_args(argv)
    from launch.log import setup_logging

    setup_logging()
    os.environ.setdefault("TORCH_EXTENSIONS_DIR", str(REPO / ".cache" / "torch_extensions"))
    if args.prepare:
        if not args.corpus_dir:
            parser.error("--prepare needs --corpus-dir")
        for seq_len in args.phases:
            print(build_corpus(Path(args.corpus_dir) / f"seq{seq_len}", seq_len))
        return 0
    if args.cpu_smoke:
        args.preset, args.micro_batch, args.accumulation = "tiny", args.micro_batch or 8, args.accumulation or 2
        args.steps, args.repeats, args.warmup, args.phases = 1, 2, 1, [128]
        args.dtype, args.compile, args.optim = "fp32", False, "adamw"
        device = torch.device("cpu")
    elif not torch.cuda.is_available():
        parser.error("no CUDA device; run on a GPU machine, or pass --cpu-smoke to check the script on CPU")
    else:
        device = torch.device("cuda", 0)
        torch.backends.cuda.matmul.allow_tf32 = True
    name = torch.cuda.get_device_name(device) if device.type == "cuda" else "CPU"
    peak = args.peak_tflops or spec_peak_tflops(name) or float("nan")
    mm = measured_matmul_tflops(device, torch.bfloat16 if args.dtype == "bf16" else torch.float32,
                                8192 if device.type == "cuda" else 512)
    import deepspeed
    import transformers

    transformers.utils.logging.disable_progress_bar()
    print(f"device {name}; torch {torch.__version__}, deepspeed {deepspeed.__version__}, transformers "
          f"{transformers.__version__}; {args.dtype}, optimizer {args.optim}, preset {args.preset}, attention dropout "
          f"{args.attention_dropout}, varlen_dropout {_preset_or(args.varlen_dropout)}, activation checkpointing "
          f"{_preset_or(args.activation_checkpointing)}, compile {args.compile} "
          f"({args.compile_mode or 'default'}); spec peak {peak:.0f} TFLOP/s, measured matmul {mm:.1f} TFLOP/s")
    print(f"{'seq':>4} {'micro':>5} {'acc':>4} {'model':<13} {'seq/s':>8} {'spread':>6} {'tok/s':>9} {'TFLOP/s':>8} "
          f"{'MFU spec':>8} {'MFU mm':>7} {'peak GiB':>8} {'pad':>5} {'vs HF':>6}")
    with tempfile.TemporaryDirectory() as tmp:
        for seq_len in args.phases:
            runners, results = bench_phase(args, seq_len, device, Path(tmp))
            hf = results[-1] if results[-1]["label"] == "transformers" else None
            hf_rate = hf["seq_s"] if hf and not hf["error"] else float("nan")
            for r in results:
                if r["error"]:
                    print(f"{seq_len:>4} {r['micro']:>5} {r['accum']:>4} {r['label']:<13} {r['error']}", flush=True)
                    continue
                print(f"{seq_len:>4} {r['micro']:>5} {r['accum']:>4} {r['label']:<13} {r['seq_s']:>8.1f} "
                      f"{r['spread']:>6.1%} {r['tok_s']:>9.0f} {r['tflops']:>8.2f} {r['tflops'] / peak:>8.1%} "
                      f"{r['tflops'] / mm:>7.1%} {r['peak_gib']:>8.1f} {r['padding']:>5.1%} "
                      f"{r['seq_s'] / hf_rate:>5.2f}x", flush=True)
            if len(results) == 1:
                print("  transformers: could not be built next to ours (out of memory)")
            print("  peak GiB: per runner, reset before each of its timed rounds, max over them; both engines are "
                  "resident throughout, so the rows differ by their step's working memory")
            ours = results[0]
            print(f"  ours: dynamo graphs {ours['graphs']} ({ours['new_graphs']} new while timed), "
                  f"recompiles while timed {ours['recompiles']}", flush=True)
            for r in runners:  # printed as each finishes: the rows above survive a time limit hit here
                print(split_and_profile(r, device), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
