"""`make bench`: run the ratio benchmarks below in turn; each prints its own ratio against a peer.
(`mlm_context.py`, `finetune_lockstep.py` and `pretrain_crossover.py` are run on their own; see docs/PERFORMANCE.md.)

  .venv/bin/python bench/run_all.py                  # all CPU benchmarks (pretrain_gpu only with CUDA)
  .venv/bin/python bench/run_all.py model_step       # just these

The GPU benchmark (pretrain_gpu.py) runs only where torch sees a CUDA device. Results and the exact
commands are recorded in docs/PERFORMANCE.md.
"""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

BENCH = Path(__file__).resolve().parent
CPU_BENCHMARKS = ["corpus_throughput", "loader_throughput", "model_step", "finetune_batching", "download_throughput",
                  "shard_verify", "finetune_vs_transformers"]
# Arguments under `make bench`: the accuracy comparison runs its minutes-long --quick form there; the
# recorded multi-seed runs (docs/PERFORMANCE.md "Fine-tuning parity") take hours on 2 cores.
ARGS = {"finetune_vs_transformers": ["--quick"],
        # its defaults are both phases at the presets' full accumulation (hours) and corpora built with Beam,
        # which GPU images lack: the ~1-minute seq-128 form on the corpora `--prepare` builds here
        "pretrain_gpu": ["--phases", "128", "--accumulation", "4", "--steps", "2", "--corpus-dir", ".bench/large"]}
GPU_BENCHMARKS = ["pretrain_gpu"]


def main(argv: list[str]) -> int:
    import torch

    names = argv or CPU_BENCHMARKS + (GPU_BENCHMARKS if torch.cuda.is_available() else [])
    unknown = [n for n in names if not (BENCH / f"{n}.py").is_file()]
    if unknown:
        print(f"no such benchmark: {', '.join(unknown)}; have: {', '.join(CPU_BENCHMARKS + GPU_BENCHMARKS)}")
        return 2
    failed = []
    for name in names:
        print(f"\n=== bench/{name}.py ===", flush=True)
        started = time.monotonic()
        rc = subprocess.call([sys.executable, str(BENCH / f"{name}.py"), *ARGS.get(name, [])])
        print(f"=== {name}: exit {rc} in {time.monotonic() - started:.0f} s ===", flush=True)
        if rc != 0:
            failed.append(name)
    if failed:
        print(f"failed: {', '.join(failed)}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
