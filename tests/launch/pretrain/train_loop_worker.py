"""Worker for test_train_loop.py: the real `Trainer.train()` loop, in one lone process, for several scenarios.

Usage: train_loop_worker.py CORPUS OUT SCENARIOS_JSON. Each scenario builds the real Trainer (tiny BERT,
DeepSpeed ZeRO-1 over gloo in one process, fp32) in OUT/<name> with its config overrides, then runs
`train()` while recording what the loop did: the steps at which it evaluated and saved, and each try of
a step (applied or not, its lr, whether the weights moved). A scenario may
- `poison`: make the loss of these training micro-batches NaN (numbered from 0 over the whole run; one
  process and the tiny preset's batch of 32 in micro-batches of 8 make 4 a try),
- `signal_at`: send this process SIGTERM (or `signal`) just before this try (numbered from 1), as a launcher
  forwards it,
- `resume`: continue the run directory of an earlier scenario (`--resume`).
`{out}` in an override is OUT. Prints one JSON object, by scenario name: what the loop did, or the error
that stopped the scenario.
"""

from __future__ import annotations

import json
import os
import signal
import sys
from pathlib import Path
from typing import Any

import torch

from launch.config import load_config
from launch.pretrain.fast_step import NonFiniteLossError
from launch.pretrain.pretrain_config import PretrainConfig
from launch.pretrain.trainer import Trainer

BASE = ["log.tensorboard=false", "data.prefetch=0", "log.eval_samples=32", "log.progress_bar=false"]


def run(corpus: Path, out: Path, scenario: dict[str, Any]) -> dict[str, Any]:
    cfg = load_config(PretrainConfig, "tiny", BASE + [o.replace("{out}", str(out)) for o in scenario["overrides"]])
    run_dir = out / scenario.get("resume", scenario["name"])
    trainer = Trainer(cfg, data_dir=corpus, run_dir=run_dir, resume="resume" in scenario)
    trainer.setup()
    evals: list[int] = []
    saves: list[int] = []
    tries: list[dict[str, Any]] = []
    poison = set(scenario.get("poison", []))
    micro = [0]

    real_evaluate, real_save, real_forward, real_run_step = (trainer.evaluate, trainer.save, trainer._forward,
                                                             trainer.run_step)

    def evaluate() -> dict[str, Any]:
        evals.append(trainer.step)
        return real_evaluate()

    def save() -> Path:
        saves.append(trainer.step)
        return real_save()

    def forward(batch, layout=None):
        loss, counts, out = real_forward(batch, layout)
        if trainer.engine.module.training:  # a training micro-batch, not the held-out evaluation's
            if micro[0] in poison:
                loss = loss * float("nan")
            micro[0] += 1
        return loss, counts, out

    weight = trainer.engine.module.bert.encoder.layers[0].ffn.down.weight

    def run_step(batches):
        if len(tries) + 1 == scenario.get("signal_at"):
            os.kill(os.getpid(), getattr(signal, scenario.get("signal", "SIGTERM")))  # handled before the next bytecode
        before = weight.detach().clone()
        host, ids, lr, applied = real_run_step(batches)
        tries.append({"applied": applied, "lr": lr, "step": trainer.step, "moved": not torch.equal(before, weight),
                      "finite": bool(torch.isfinite(weight).all())})
        return host, ids, lr, applied

    trainer.evaluate, trainer.save, trainer._forward, trainer.run_step = evaluate, save, forward, run_step
    handlers = {s: signal.getsignal(s) for s in (signal.SIGTERM, signal.SIGINT)}
    start = {"step": trainer.step, "nonfinite_total": trainer.nonfinite_total}
    start_weight = weight.detach().double().sum().item()
    try:
        code: Any = trainer.train()
    except NonFiniteLossError as err:
        code = f"diverged: {err}"
    ckpts = run_dir / "checkpoints"
    latest = ckpts / "latest"
    lines = (run_dir / "metrics.jsonl").read_text().splitlines() if (run_dir / "metrics.jsonl").is_file() else []
    return {
        "code": code, "evals": evals, "saves": saves, "tries": tries, "start": start,
        "weight_sum": [start_weight, weight.detach().double().sum().item()],  # at the start and at the end
        "checkpoints": sorted(p.name for p in ckpts.iterdir()) if ckpts.is_dir() else [],
        "latest": latest.read_text().strip() if latest.is_file() else None,
        "metrics": [json.loads(line) for line in lines if line.strip()],
        "handlers_restored": all(signal.getsignal(s) == h for s, h in handlers.items()),
    }


def main(corpus: Path, out: Path, scenarios: list[dict[str, Any]]) -> None:
    results = {}
    for scenario in scenarios:
        try:
            results[scenario["name"]] = run(corpus, out, scenario)
        except Exception as err:  # the next scenarios still run; the test names this one's error
            results[scenario["name"]] = {"error": f"{type(err).__name__}: {err}"}
    print(json.dumps(results))


if __name__ == "__main__":
    main(Path(sys.argv[1]), Path(sys.argv[2]), json.loads(sys.argv[3]))
