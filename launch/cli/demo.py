"""Run the whole pipeline on the real data bundled in the repo, on CPU, in minutes.

Steps (each is the real subcommand, called in-process with the same flags a user would type):
  1. corpus    Wikipedia dump sample + two Austen novels -> sharded Arrow corpus, then `corpus inspect`
  2. pretrain  the tiny BERT config, 2 local DeepSpeed processes (gloo), a few hundred steps
  3. export    the run -> a Hugging Face model directory; the loss curve -> loss.png
  4. sweep     a 2-trial Ray Tune grid fine-tuning the demo checkpoint on bundled SST-2, results table

Everything lands under --out (default demo_out/). Re-running reuses finished steps unless --fresh.
"""

from __future__ import annotations

import argparse
import shutil
import time
from pathlib import Path

from launch.cli import main as cli_main
from launch.errors import CliError
from launch.log import get_logger, setup_logging

log = get_logger(__name__)

REPO = Path(__file__).resolve().parents[2]
DATA = REPO / "data"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--out", type=Path, default=Path("demo_out"), help="output folder (default: demo_out)")
    parser.add_argument("--steps", type=int, default=300, help="pre-training steps (default: 300)")
    parser.add_argument("--nproc", type=int, default=2, help="local DeepSpeed processes (default: 2)")
    parser.add_argument("--skip-sweep", action="store_true", help="stop after export (no Ray sweep)")
    parser.add_argument("--fresh", action="store_true", help="delete --out first instead of reusing finished steps")


# What the demo writes into --out: `--fresh` deletes these and nothing else, and only where the marker
# proves an earlier demo wrote them.
MARKER = ".bertpipe-demo"
WRITTEN = ("corpus", "run", "hf_model", "sweep", "loss.png", "demo_grid.yaml", MARKER)


def _clear_previous_demo(out: Path) -> None:
    if not (out / MARKER).is_file():
        if any(out.iterdir()):
            raise CliError(f"--out {out} is not empty and was not written by `bertpipe demo` (no {MARKER}); "
                           "--fresh deletes only a demo's own output: choose another --out")
        return
    for name in WRITTEN:
        path = out / name
        if path.is_dir() and not path.is_symlink():
            shutil.rmtree(path)
        elif path.exists() or path.is_symlink():
            path.unlink()


def _step(name: str, argv: list[str]) -> None:
    log.info("demo: bertpipe %s", " ".join(argv))
    started = time.monotonic()
    rc = cli_main(argv)
    if rc != 0:
        raise CliError(f"demo step {name!r} failed (exit code {rc}); see the messages above")
    log.info("demo: %s done in %.0f s", name, time.monotonic() - started)


def run(args: argparse.Namespace) -> int:
    setup_logging()
    if not DATA.is_dir():
        raise CliError(f"bundled data not found at {DATA}; run the demo from a checkout of the repository")
    out: Path = args.out
    corpus, run_dir, hf_dir, sweep_dir = out / "corpus", out / "run", out / "hf_model", out / "sweep"
    if args.fresh and out.exists():
        _clear_previous_demo(out)
    out.mkdir(parents=True, exist_ok=True)
    (out / MARKER).write_text("a `bertpipe demo` output folder; `demo --fresh` may delete what it wrote here\n")

    if not (corpus / "manifest.json").is_file():
        _step("corpus", [
            "corpus", "--input", str(DATA / "wiki"), str(DATA / "books"),
            "--vocab", str(DATA / "vocab" / "bert-base-uncased-vocab.txt"),
            "--out", str(corpus), "--seq-len", "128", "--dupe-factor", "2", "--seed", "12345",
            "--num-shards", "4", "--heldout-fraction", "0.05",
        ])
    _step("corpus inspect", ["corpus", "inspect", str(corpus), "--examples", "2"])

    if not (hf_dir / "config.json").is_file():
        _step("pretrain", [
            "pretrain", "--config", "tiny", "--data", str(corpus), "--out", str(run_dir),
            "--nproc", str(args.nproc), "--max-steps", str(args.steps), "--save-every", "100",
        ] + (["--resume"] if (run_dir / "checkpoints").is_dir() else []))
        _step("export", ["export", str(run_dir), "--out", str(hf_dir)])
    from launch.plots import plot_loss

    png = plot_loss(run_dir, out / "loss.png")
    log.info("demo: loss curve written to %s", png)

    if not args.skip_sweep:
        # The paper's grid (lr 2e-5..5e-5) suits BERT-Base/Large; a 2-layer model needs larger steps.
        grid = out / "demo_grid.yaml"
        grid.write_text("lr: [1.0e-3, 3.0e-4]\nbatch_size: [32]\nepochs: [2]\n", encoding="utf-8")
        from launch.finetune.tune_sweep import holds_sweep

        # --resume keeps the trials a previous demo finished (all of them: Ray is not even started).
        _step("sweep", [
            "sweep", "--tasks", "sst2", "--checkpoint", str(hf_dir), "--data-dir", str(DATA / "glue"),
            "--out", str(sweep_dir), "--grid", str(grid), "--max-seq-len", "64",
        ] + (["--resume"] if holds_sweep(sweep_dir) else []))
        table = sweep_dir / "results.md"
        if table.is_file():
            print(table.read_text(encoding="utf-8"))
    print(f"\nDemo finished. Everything is under {out}/: corpus/, run/, hf_model/, loss.png, sweep/")
    return 0
