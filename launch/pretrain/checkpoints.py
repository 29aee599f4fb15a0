"""Atomic, resumable checkpoints in `RUN/checkpoints/`.

Layout: `checkpoints/<tag>/` is one complete DeepSpeed checkpoint (tag = `global_step<N>`) plus
`bertpipe.json` (our metadata: step, loader position, world size, config, corpus manifest sha256),
`rng_rank<R>.pt` (each rank's RNG states) and `vocab.txt`; `checkpoints/latest` names the newest.

Atomicity: every rank writes into `checkpoints/.staging-<tag>/<tag>/`; after a barrier, rank 0
writes the metadata, renames the finished folder into place, and only then replaces `latest`
(write to a temp file, fsync, `os.replace`). A crash at any point leaves `latest` naming a complete
checkpoint; a stale staging folder is deleted by the next save. The run directory must be on a
filesystem all ranks share (as DeepSpeed's own resume requires).
"""

from __future__ import annotations

import json
import logging
import os
import random
import re
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.distributed as dist
from deepspeed.checkpoint import UNIVERSAL_CHECKPOINT_INFO

log = logging.getLogger(__name__)

META = "bertpipe.json"
_TAG = re.compile(r"^global_step(\d+)$")


def tag_for(step: int) -> str:
    return f"global_step{step}"


def read_latest(ckpt_dir: Path) -> str | None:
    """The tag `latest` names, if it names a complete checkpoint."""
    latest = ckpt_dir / "latest"
    if not latest.is_file():
        return None
    tag = latest.read_text(encoding="utf-8").strip()
    if not (ckpt_dir / tag / META).is_file():
        raise ValueError(f"{latest} names {tag!r}, which is not a complete checkpoint; delete {latest} "
                         f"to resume from an older one, or start a new run")
    return tag


def read_meta(ckpt_dir: Path, tag: str) -> dict[str, Any]:
    return json.loads((ckpt_dir / tag / META).read_text(encoding="utf-8"))


def rng_state() -> dict[str, Any]:
    state = {"python": random.getstate(), "numpy": np.random.get_state(), "torch": torch.get_rng_state()}
    if torch.cuda.is_available():
        state["cuda"] = torch.cuda.get_rng_state()
    return state


def set_rng_state(state: dict[str, Any]) -> None:
    random.setstate(state["python"])
    np.random.set_state(state["numpy"])
    torch.set_rng_state(state["torch"])
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state(state["cuda"])


def _fsync_write(path: Path, text: str) -> None:
    tmp = path.with_name(path.name + ".tmp")
    with open(tmp, "w", encoding="utf-8") as f:
        f.write(text)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)


def save(engine: Any, ckpt_dir: Path, step: int, meta: dict[str, Any], vocab_file: Path, keep_last: int) -> Path:
    """Write checkpoint `global_step<step>` on every rank; returns its final folder."""
    rank = dist.get_rank()
    tag = tag_for(step)
    staging = ckpt_dir / f".staging-{tag}"
    if rank == 0:
        shutil.rmtree(staging, ignore_errors=True)
        staging.mkdir(parents=True)
    dist.barrier()
    # `universal_checkpoint_info` marks the checkpoint convertible by ds_to_universal (resume at
    # another data-parallel size); our model has no tensor/pipeline parallel layout to describe.
    client_state = {"bertpipe": meta, UNIVERSAL_CHECKPOINT_INFO: {}}
    engine.save_checkpoint(str(staging), tag=tag, client_state=client_state, save_latest=False)
    torch.save(rng_state(), staging / tag / f"rng_rank{rank}.pt")
    dist.barrier()
    final = ckpt_dir / tag
    if rank == 0:
        shutil.copyfile(vocab_file, staging / tag / "vocab.txt")
        _fsync_write(staging / tag / META, json.dumps(meta, indent=2, sort_keys=True))
        if final.exists():  # re-saving a step (e.g. after a resume): the old copy goes last
            old = ckpt_dir / f".old-{tag}"
            shutil.rmtree(old, ignore_errors=True)
            os.replace(final, old)
            os.replace(staging / tag, final)
            shutil.rmtree(old, ignore_errors=True)
        else:
            os.replace(staging / tag, final)
        _fsync_write(ckpt_dir / "latest", tag + "\n")
        shutil.rmtree(staging, ignore_errors=True)
        _prune(ckpt_dir, keep_last, step)
        log.info("checkpoint %s saved", final)
    dist.barrier()
    return final


def _prune(ckpt_dir: Path, keep_last: int, current: int) -> None:
    """Keep the `keep_last` newest checkpoints up to `current`, the one `latest` now names.

    Checkpoints of later steps can exist after a crash between publishing a folder and moving
    `latest`, and the run resumed from an earlier one: they are not "newer" than `current` (a later
    save of that step replaces them), so they must never push `current` out of the kept set.
    """
    steps = sorted(int(m.group(1)) for p in ckpt_dir.iterdir()
                   if (m := _TAG.match(p.name)) and (p / META).is_file() and int(m.group(1)) <= current)
    for step in steps[:-keep_last]:
        shutil.rmtree(ckpt_dir / tag_for(step), ignore_errors=True)
        shutil.rmtree(ckpt_dir / f"{tag_for(step)}_universal", ignore_errors=True)
    for stale in ckpt_dir.glob(".staging-*"):
        shutil.rmtree(stale, ignore_errors=True)


def convert_to_universal(ckpt_dir: Path, tag: str) -> str:
    """Rank 0 converts checkpoint `tag` to DeepSpeed's universal format (once); returns its tag.

    Runs DeepSpeed's own converter in a subprocess so its console output stays out of our log;
    the output folder appears atomically (converted to a temp name, then renamed).
    """
    universal = f"{tag}_universal"
    if dist.get_rank() == 0 and not (ckpt_dir / universal).is_dir():
        tmp = ckpt_dir / f".staging-{universal}"
        shutil.rmtree(tmp, ignore_errors=True)
        log.info("converting %s to a universal checkpoint (data-parallel size changed)", tag)
        cmd = [sys.executable, "-m", "deepspeed.checkpoint.ds_to_universal", "--input_folder", str(ckpt_dir / tag),
               "--output_folder", str(tmp), "--num_extract_workers", "1", "--num_merge_workers", "1"]
        done = subprocess.run(cmd, capture_output=True, text=True)
        if done.returncode != 0:
            raise ValueError(f"converting {ckpt_dir / tag} to a universal checkpoint failed:\n{done.stderr[-2000:]}\n"
                             f"resume with the original number of processes instead")
        for name in (META, "vocab.txt"):
            shutil.copyfile(ckpt_dir / tag / name, tmp / name)
        os.replace(tmp, ckpt_dir / universal)
    dist.barrier()
    return universal


def load_rng(ckpt_dir: Path, tag: str, rank: int) -> bool:
    """Restore this rank's RNG states if the checkpoint has them (same world size); False if not."""
    path = ckpt_dir / tag / f"rng_rank{rank}.pt"
    if not path.is_file():
        return False
    set_rng_state(torch.load(path, weights_only=False))
    return True
