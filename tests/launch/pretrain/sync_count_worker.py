"""Worker for test_no_host_sync.py: counts the host syncs of one real trainer micro-step.

Usage: sync_count_worker.py CORPUS OUT. Builds the real Trainer (tiny BERT with unpadding, DeepSpeed
ZeRO-1 over gloo in one process), takes one micro-batch from its loader, and records every call that
makes the host wait for the device (`.item()`, `.tolist()`, `bool()`/`int()`/`float()` of a tensor,
`nonzero`, boolean-mask indexing, ...) while `Trainer._micro_step` runs, through a TorchFunctionMode
that sees every torch call made from Python, in our code and in DeepSpeed's. As a control, the same
model called without the loader's precomputed layout must show its `nonzero`. Prints JSON.
"""

from __future__ import annotations

import json
import sys
import traceback
from pathlib import Path

import torch
from torch.overrides import TorchFunctionMode

from launch.config import load_config
from launch.pretrain.pretrain_config import PretrainConfig
from launch.pretrain.trainer import Trainer

SYNCING = {"item", "tolist", "__bool__", "__int__", "__float__", "__index__", "nonzero", "nonzero_static",
           "masked_select", "numpy", "cpu", "unique", "argwhere", "_local_scalar_dense"}


class SyncCounter(TorchFunctionMode):
    def __init__(self) -> None:
        super().__init__()
        self.calls: list[str] = []

    def __torch_function__(self, func, types, args=(), kwargs=None):
        name = getattr(func, "__name__", str(func))
        bool_index = name in ("__getitem__", "__setitem__") and any(
            isinstance(a, torch.Tensor) and a.dtype == torch.bool
            for a in (args[1] if isinstance(args[1], tuple) else (args[1],)))
        if name in SYNCING or bool_index:
            where = [f"{f.filename.rsplit('/', 2)[-1]}:{f.lineno}" for f in traceback.extract_stack()[-6:-1]]
            self.calls.append(f"{name} at {' <- '.join(reversed(where))}")
        return func(*args, **(kwargs or {}))


def main(corpus: Path, out: Path) -> None:
    cfg = load_config(PretrainConfig, "tiny", ["schedule.total_steps=2", "log.eval_every=0",
                                                "log.tensorboard=false", "data.prefetch=0"])
    cfg.model.fields = {"unpad": True}
    trainer = Trainer(cfg, data_dir=corpus, run_dir=out)
    trainer.setup()
    trainer.engine.train()
    batches = iter(trainer.loader)
    stats = torch.zeros(8 + trainer.grad_accum, dtype=torch.float64, device=trainer.device)
    trainer._micro_step(next(batches)[0], stats, stats[8])  # a first step builds lazy state; count the second
    trainer.engine.step()
    batch = next(batches)[0]
    with SyncCounter() as counter:
        trainer._micro_step(batch, stats, stats[9])
    # Control: the model builds its own layout from the mask when it is not given one.
    plain = {k: v for k, v in batch.items() if k not in ("unpad_indices", "cu_seqlens", "max_seqlen")}
    with SyncCounter() as control:
        trainer._forward({k: v.to(trainer.device) for k, v in plain.items()})
    print(json.dumps({"micro_step": counter.calls, "control": control.calls,
                      "layout_keys": sorted(k for k in batch if k in ("unpad_indices", "cu_seqlens", "max_seqlen")),
                      "loss_sum": stats[0].item()}))


if __name__ == "__main__":
    main(Path(sys.argv[1]), Path(sys.argv[2]))
