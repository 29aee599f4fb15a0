"""Worker for test_skipped_update.py: a real trainer step whose update DeepSpeed skips.

Usage: overflow_worker.py CORPUS OUT. Builds the real Trainer (tiny BERT, DeepSpeed ZeRO-1 over gloo
in one process, fp32) and runs three steps; in the second a gradient hook turns one weight's
gradient infinite while the loss stays finite: what an fp16 loss-scale overflow looks like to the
engine, which then skips the update and the lr step (ZeRO checks the gradient norm in fp32 as
well). Prints JSON.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import torch

from launch.config import load_config
from launch.pretrain.pretrain_config import PretrainConfig
from launch.pretrain.trainer import Trainer


def main(corpus: Path, out: Path) -> None:
    cfg = load_config(PretrainConfig, "tiny", ["schedule.total_steps=6", "schedule.warmup_ratio=0.5",
                                                "log.eval_every=0", "log.tensorboard=false", "data.prefetch=0"])
    trainer = Trainer(cfg, data_dir=corpus, run_dir=out)
    trainer.setup()
    trainer.engine.train()
    poison = [False]
    weight = trainer.engine.module.bert.encoder.layers[0].ffn.down.weight
    weight.register_hook(lambda g: g * float("inf") if poison[0] else g)
    batches = iter(trainer.loader)
    applied, lrs, changed = [], [], []
    for i in range(3):
        poison[0] = i == 1
        before = weight.detach().clone()
        _, _, lr, ok = trainer.run_step(batches)
        applied.append(ok)
        lrs.append(lr)
        changed.append(not torch.equal(before, weight.detach()))
    print(json.dumps({"applied": applied, "lrs": lrs, "weights_changed": changed, "step": trainer.step,
                      "engine_skipped": trainer.engine.skipped_steps, "position": trainer.position}))


if __name__ == "__main__":
    main(Path(sys.argv[1]), Path(sys.argv[2]))
