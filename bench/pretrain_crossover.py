"""Where does from-scratch pre-training start to pay on SST-2? (issue 13's demo, measured on a GPU)

The demo pre-trained its tiny model on the bundled ~1M-token corpus at seq 64 for 600 steps on 2 CPU cores
(`--config demo-seq64`, its recipe until 2026-11-27) and then fine-tuned SST-2 from that checkpoint and from
random init; the pre-trained one was behind (docs/RESULTS.md, "The demo"). This script measures how much
pre-training compute the same corpus, vocabulary and fine-tuning settings need before the checkpoint beats
random init (`DEMO_OUT/corpus` below: a seq-64 corpus, built by the corpus command in docs/RESULTS.md):

  1. each `--run NAME:PRESET:OPTIM:LR[:BATCH]` pre-trains with `bertpipe pretrain --config demo-seq64` (its corpus,
     vocabulary and seq 64; the model preset, optimizer, lr and batch as named (default batch `--batch`), dynamic
     masking, constant lr after warm-up so that every checkpoint along the way is a fair stopping
     point), all runs side by side on the one device, until `--steps` or `--budget-s` seconds
     (SIGTERM: the trainer checkpoints and exits 143);
  2. every checkpoint whose step is in `--at` (and the last) is exported and fine-tuned on SST-2 with
     the demo's settings (lr 5e-4, batch 32, 2 epochs, seq 64) for `--seeds` seeds, beside the
     same architecture from random init (`--init random`), `--jobs` fine-tunings at a time;
  3. a table: run, step, samples seen, held-out MLM accuracy at that step, SST-2 dev accuracy mean
     +- population std, and the difference to random init (results.json and results.md in --out).
--out must be new, empty, or an --out of an earlier run of this script (its .bertpipe-crossover).

  python bench/pretrain_crossover.py --corpus DEMO_OUT/corpus --out /tmp/xover     # GPU: the defaults
  python bench/pretrain_crossover.py --corpus C --out O --steps 40 --at 20 --budget-s 120 \
      --run tiny:tiny:lamb:0.02 --batch 32 --seeds 1 --max-train-samples 200          # CPU smoke
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import statistics
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import NamedTuple

REPO = Path(__file__).resolve().parents[1]
GLUE = REPO / "data" / "glue"
# The demo's fine-tuning settings (launch/cli/demo.py's grid), for both inits.
FINETUNE = ["--task", "sst2", "--data-dir", str(GLUE), "--lr", "5e-4", "--batch-size", "32", "--epochs", "2",
            "--max-seq-len", "64", "--precision", "fp32", "--threads", "1"]


class Run(NamedTuple):
    """One `--run NAME:PRESET:OPTIM:LR[:BATCH]`, parsed once."""

    spec: str
    name: str
    preset: str
    optim: str
    lr: str
    batch: int


def parse_run(spec: str, default_batch: int) -> Run:
    name, preset, optim, lr, batch = (spec.split(":") + [str(default_batch)])[:5]
    return Run(spec, name, preset, optim, lr, int(batch))


def bertpipe(*argv: str, log: Path) -> subprocess.Popen:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")]))}
    with open(log, "w") as fh:
        return subprocess.Popen([sys.executable, "-m", "launch.cli", *argv], stdout=fh, stderr=subprocess.STDOUT,
                                env=env, cwd=REPO)


def pretrain_all(args: argparse.Namespace, out: Path) -> dict[str, float]:
    """Start every run, stop what is still going at the budget; returns each run's wall seconds."""
    procs, started = {}, time.monotonic()
    for run in args.run:
        name = run.name
        argv = ["pretrain", "--config", "demo-seq64", "--data", str(args.corpus), "--out", str(out / name), "--nproc", "1",
                "--model.preset", run.preset, "--optim.name", run.optim, "--optim.lr", run.lr, "--max-steps", str(args.steps),
                "--data.global-batch-size", str(run.batch), "--data.micro-batch-size", str(run.batch),
                "--data.dynamic-masking", "true", "--schedule.decay", "constant", "--schedule.warmup-steps",
                str(args.warmup), "--save-every", str(args.save_every), "--checkpoint.keep-last", "1000",
                "--log.eval-every", str(args.save_every), "--log.eval-samples", "2048", "--log.log-every", "50"]
        procs[name] = bertpipe(*argv, log=out / f"{name}.pretrain.log")
    walls, stopped = {}, set()
    while procs:
        for name, proc in list(procs.items()):
            if proc.poll() is not None:
                walls[name] = time.monotonic() - started
                print(f"pretrain {name}: exit {proc.returncode} after {walls[name]:.0f} s", flush=True)
                # 143 = stopped by our SIGTERM, checkpoint saved (128 + the signal): expected, not a failure
                if proc.returncode and not (name in stopped and proc.returncode == 128 + signal.SIGTERM):
                    print(tail(out / f"{name}.pretrain.log"), flush=True)
                del procs[name]
        if procs and time.monotonic() - started > args.budget_s:
            for name, proc in procs.items():
                print(f"pretrain {name}: budget {args.budget_s} s reached, SIGTERM", flush=True)
                proc.send_signal(signal.SIGTERM)
                stopped.add(name)
            args.budget_s = float("inf")  # once
        time.sleep(1)
    return walls


def tail(log: Path, lines: int = 15) -> str:
    return "\n".join("    " + line for line in log.read_text(errors="replace").splitlines()[-lines:])


def heldout_accuracy(run: Path) -> dict[int, float]:
    """step -> held-out MLM accuracy, from the run's metrics log."""
    from launch.pretrain.training_log import read_metrics

    return {int(rec["step"]): rec["eval_mlm_accuracy"] for rec in read_metrics(run) if "eval_mlm_accuracy" in rec}


def saved_steps(run: Path) -> list[int]:
    return sorted(int(p.name.removeprefix("global_step")) for p in (run / "checkpoints").glob("global_step*") if p.is_dir())


def export(name: str, step: int, out: Path) -> Path | None:
    hf = out / f"{name}-hf-{step}"
    if not (hf / "config.json").is_file():
        log = out / f"{name}-{step}.export.log"
        rc = bertpipe("export", str(out / name), "--out", str(hf), "--tag", f"global_step{step}", log=log).wait()
        if rc:
            print(f"{name} step {step}: export failed (exit {rc})\n{tail(log)}", flush=True)
            return None
    return hf


def finetune_jobs(args: argparse.Namespace, out: Path, pool: ThreadPoolExecutor) -> list[tuple[str, int | None, int, Path]]:
    """(run, step or None for random init, seed, HF dir) for each fine-tuning; exports the checkpoints."""
    chosen = []
    for name in (run.name for run in args.run):
        steps = saved_steps(out / name)
        if not steps:
            print(f"{name}: no checkpoint saved; see {name}.pretrain.log", flush=True)
        chosen += [(name, step) for step in sorted({s for s in steps if s in args.at} | {steps[-1]} if steps else set())]
    exported = list(pool.map(lambda ns: export(*ns, out), chosen))
    jobs = []
    for (name, step), hf in zip(chosen, exported):
        if hf is not None:
            jobs += [(name, step, seed, hf) for seed in range(1, args.seeds + 1)]
    for name in dict.fromkeys(name for name, _ in chosen):  # random init: the architecture of the run's last export
        last = [hf for (n, _), hf in zip(chosen, exported) if n == name and hf is not None]
        jobs += [(name, None, seed, last[-1]) for seed in range(1, args.seeds + 1)] if last else []
    return jobs


def finetune(job: tuple[str, int | None, int, Path], out: Path, extra: list[str]) -> float | None:
    name, step, seed, hf = job
    tag = f"{name}-{'random' if step is None else step}-s{seed}"
    argv = ["finetune", *FINETUNE, *extra, "--checkpoint", str(hf), "--out", str(out / "ft" / tag), "--seed", str(seed)]
    argv += ["--init", "random"] if step is None else []
    (out / "ft").mkdir(exist_ok=True)
    rc = bertpipe(*argv, log=out / "ft" / f"{tag}.log").wait()
    metrics = out / "ft" / tag / "metrics.json"
    if rc or not metrics.is_file():
        print(f"finetune {tag}: exit {rc}", flush=True)
        return None
    return json.loads(metrics.read_text())["score"]


def stat(values: list[float]) -> str:
    return f"{100 * statistics.mean(values):.1f} +- {100 * statistics.pstdev(values):.1f}" if values else "-"


MARKER = ".bertpipe-crossover"  # in an --out this script made: later runs may write there again


def claim(out: Path) -> None:
    """Write only into a new or empty --out, or one this script made: its results, logs and run folders
    would otherwise replace a user's files of the same names."""
    if out.is_dir() and any(out.iterdir()) and not (out / MARKER).is_file():
        raise SystemExit(f"pretrain_crossover: --out {out} holds files this script did not write (no {MARKER}); "
                         "choose a new or empty --out")
    out.mkdir(parents=True, exist_ok=True)
    if not (out / MARKER).is_file():
        (out / MARKER).write_text("written by bench/pretrain_crossover.py, which may write here again\n")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--corpus", type=Path, required=True, help="the demo's corpus (bertpipe demo's OUT/corpus)")
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--run", action="append", default=None, metavar="NAME:PRESET:OPTIM:LR[:BATCH]",
                        help="a pre-training run (default: tiny:tiny:lamb:0.02, tiny-adamw:tiny:adamw:1e-3, mini:mini:adamw:5e-4)")
    parser.add_argument("--steps", type=int, default=20000, help="pre-training steps at most")
    parser.add_argument("--budget-s", type=float, default=240.0, help="pre-training wall seconds at most")
    parser.add_argument("--batch", type=int, default=256)
    parser.add_argument("--warmup", type=int, default=300)
    parser.add_argument("--save-every", type=int, default=500)
    parser.add_argument("--at", type=lambda s: {int(x) for x in s.split(",")}, default={500, 1000, 2000, 4000, 8000, 16000},
                        help="checkpoint steps to fine-tune from (the last saved one is always added)")
    parser.add_argument("--seeds", type=int, default=3)
    parser.add_argument("--jobs", type=int, default=12, help="exports / fine-tunings at a time")
    parser.add_argument("--max-train-samples", type=int, default=None)
    args = parser.parse_args()
    args.run = [parse_run(spec, args.batch) for spec in
                args.run or ["tiny:tiny:lamb:0.02", "tiny-adamw:tiny:adamw:1e-3", "mini:mini:adamw:5e-4"]]
    out: Path = args.out
    claim(out)

    walls = pretrain_all(args, out)
    extra = [] if args.max_train_samples is None else ["--max-train-samples", str(args.max_train_samples)]
    started = time.monotonic()
    with ThreadPoolExecutor(args.jobs) as pool:
        jobs = finetune_jobs(args, out, pool)
        scores = list(pool.map(lambda job: finetune(job, out, extra), jobs))
    print(f"{len(jobs)} fine-tunings (and their exports) in {time.monotonic() - started:.0f} s", flush=True)

    by: dict[tuple[str, int | None], list[float]] = {}
    for (name, step, _seed, _hf), score in zip(jobs, scores):
        if score is not None:
            by.setdefault((name, step), []).append(score)
    rows = []
    for run in args.run:
        acc = heldout_accuracy(out / run.name)
        random_init = by.get((run.name, None), [])
        for (name, step), values in sorted(by.items(), key=lambda kv: (kv[0][0], kv[0][1] or 0)):
            if name != run.name or step is None:
                continue
            gain = 100 * (statistics.mean(values) - statistics.mean(random_init)) if random_init else float("nan")
            rows.append({"run": run.spec, "step": step, "samples": step * run.batch, "heldout_mlm": acc.get(step),
                         "sst2": values, "random_init": random_init, "gain_points": gain,
                         "pretrain_wall_s": walls.get(run.name)})
    (out / "results.json").write_text(json.dumps(rows, indent=1) + "\n")
    lines = ["| run (name:preset:optim:lr[:batch]) | step | samples | held-out MLM | SST-2 dev, pre-trained | random init | gain |",
             "|---|---:|---:|---:|---:|---:|---:|"]
    for r in rows:
        mlm = "-" if r["heldout_mlm"] is None else f"{100 * r['heldout_mlm']:.1f}%"
        lines.append(f"| {r['run']} | {r['step']} | {r['samples']} | {mlm} | {stat(r['sst2'])} | {stat(r['random_init'])} "
                     f"| {r['gain_points']:+.1f} |")
    table = "\n".join(lines)
    (out / "results.md").write_text(table + "\n")
    print(table)
    return 0


if __name__ == "__main__":
    sys.exit(main())
