"""Atomic, verified, resumable checkpoints in `RUN/checkpoints/`, loaded without running code.

Layout (`launch.checkpoint_dirs` is the one description of it): `checkpoints/<tag>/` is one complete
DeepSpeed checkpoint (tag = `global_step<N>`) plus `bertpipe.json` (our metadata: step, loader
position, world size, config, corpus manifest sha256, and `files`: the size and sha256 of every
other file in the folder), `rng_rank<R>.pt` (each rank's RNG states, as tensors) and `vocab.txt`;
`checkpoints/latest` names the newest.

Atomicity: every rank writes into `checkpoints/.staging-<tag>/<tag>/`; after a barrier, rank 0
hashes the files, writes the metadata, renames the finished folder into place, and only then replaces
`latest` (write to a temp file, fsync, `os.replace`). A crash at any point leaves a complete
checkpoint behind; a stale staging folder is deleted by the next save. The run directory must be on
a filesystem all ranks share (as DeepSpeed's own resume requires).

Loading: every `.pt` file is read as tensors only (`launch.pretrain.hf_export.load_checkpoint_file`
and `safe_deepspeed_loads`), after `launch.checkpoint_dirs.select_checkpoint` has verified the folder;
DeepSpeed's converter to the universal format runs under the same rule.
"""

from __future__ import annotations

import json
import logging
import os
import random
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.distributed as dist
from deepspeed.checkpoint import UNIVERSAL_CHECKPOINT_INFO

from launch.checkpoint_dirs import (  # noqa: F401 (read_meta, read_latest: the names callers know)
    META, check_tensor_files, file_records, read_latest, read_meta, sealed, tag_for, tag_step,
)
from launch.pretrain.hf_export import FORCE_WEIGHTS_ONLY, NO_FORCE_WEIGHTS_ONLY, load_checkpoint_file
from pipeline.atomic_write import write_text_atomic
from pipeline.manifest import sha256_file

log = logging.getLogger(__name__)


def rng_state() -> dict[str, Any]:
    """Every RNG this process draws from, as tensors and plain numbers (loadable with weights_only)."""
    version, mt, gauss = random.getstate()
    name, keys, pos, has_gauss, cached = np.random.get_state()
    assert name == "MT19937", name
    state = {"python_version": version, "python_mt": torch.tensor(mt, dtype=torch.int64), "python_gauss": gauss,
             "numpy_keys": torch.from_numpy(keys.astype(np.int64)), "numpy_pos": int(pos),
             "numpy_has_gauss": int(has_gauss), "numpy_gauss": float(cached), "torch": torch.get_rng_state()}
    if torch.cuda.is_available():
        state["cuda"] = torch.cuda.get_rng_state()
    return state


def set_rng_state(state: dict[str, Any]) -> None:
    random.setstate((state["python_version"], tuple(state["python_mt"].tolist()), state["python_gauss"]))
    np.random.set_state(("MT19937", state["numpy_keys"].numpy().astype(np.uint32), state["numpy_pos"],
                         state["numpy_has_gauss"], state["numpy_gauss"]))
    torch.set_rng_state(state["torch"])
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state(state["cuda"])


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
        # A conversion of an earlier save of this step (a resume fell back past it) describes other weights.
        remove_conversion(ckpt_dir, tag)
        shutil.copyfile(vocab_file, staging / tag / "vocab.txt")
        # Recorded so that a resume or an export can tell a cut-short or damaged file and fall back.
        meta = {**meta, "files": file_records(staging / tag)}
        write_text_atomic(staging / tag / META, json.dumps(sealed(meta), indent=2, sort_keys=True))
        if final.exists():  # re-saving a step (e.g. after a resume): the old copy goes last
            old = ckpt_dir / f".old-{tag}"
            shutil.rmtree(old, ignore_errors=True)
            os.replace(final, old)
            os.replace(staging / tag, final)
            shutil.rmtree(old, ignore_errors=True)
        else:
            os.replace(staging / tag, final)
        write_text_atomic(ckpt_dir / "latest", tag + "\n")
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
    steps = sorted(step for p in ckpt_dir.iterdir()
                   if (step := tag_step(p.name)) is not None and (p / META).is_file() and step <= current)
    for step in steps[:-keep_last]:
        shutil.rmtree(ckpt_dir / tag_for(step), ignore_errors=True)
        remove_conversion(ckpt_dir, tag_for(step))
    remove_unfinished(ckpt_dir)


def remove_conversion(ckpt_dir: Path, tag: str) -> None:
    """Delete `<tag>_universal` if bertpipe converted it (it holds our record, written before the folder was
    renamed into place); a folder of that name without it (DeepSpeed's `ds_to_universal` run by hand writes
    there too) is someone else's: left, with a line saying so."""
    folder = ckpt_dir / f"{tag}_universal"
    if _our_conversion(folder):
        shutil.rmtree(folder, ignore_errors=True)
    elif folder.is_dir() and not folder.is_symlink():
        log.warning("%s holds no %s: not a conversion of bertpipe's, left as it is", folder, UNIVERSAL_RECORD)


def _our_conversion(folder: Path) -> bool:
    """A folder `convert_to_universal` made: a real folder (not a link) holding our record."""
    return not folder.is_symlink() and folder.is_dir() and (folder / UNIVERSAL_RECORD).is_file()


def remove_unfinished(ckpt_dir: Path) -> int:
    """Delete the folders of saves that never finished (`.staging-<tag>`): never a complete checkpoint, and
    after a full disk they hold the space a resume needs. Returns how many. Not `.old-<tag>`: a crash
    between a re-save's two renames leaves there the only complete copy of that step."""
    stale = list(ckpt_dir.glob(".staging-*"))
    for folder in stale:
        shutil.rmtree(folder, ignore_errors=True)
    return len(stale)


# DeepSpeed's converter, run with every torch.load it makes forced to weights_only and our allow-list.
_SAFE_CONVERTER = (
    "import runpy, sys, torch; from launch.pretrain.hf_export import deepspeed_safe_globals; "
    "torch.serialization.add_safe_globals(list(deepspeed_safe_globals())); "
    "sys.argv[0] = 'ds_to_universal'; runpy.run_module('deepspeed.checkpoint.ds_to_universal', run_name='__main__')"
)


def convert_to_universal(ckpt_dir: Path, tag: str) -> str:
    """Convert checkpoint `tag` to DeepSpeed's universal format (once; on one rank); returns its tag.

    Runs DeepSpeed's own converter in a subprocess so its console output stays out of our log;
    the output folder appears atomically (converted to a temp name, then renamed), with a record of
    the checkpoint it came from (its metadata's sha256) and of its own files (size, sha256). A
    converted folder found in the run is used only when both still hold; else it is converted again.
    """
    universal = f"{tag}_universal"
    stale = _stale_conversion(ckpt_dir, tag, universal) if (ckpt_dir / universal).exists() else None
    if stale:
        folder = ckpt_dir / universal
        # Not a conversion of ours (a file, a link, or a folder without our record: `ds_to_universal` run by
        # hand writes to this name too): never deleted.
        if not _our_conversion(folder):
            raise ValueError(f"{folder} is not a conversion bertpipe made (a file, a link, or a folder without "
                             f"{UNIVERSAL_RECORD}); move it away and resume again")
        log.warning("%s is converted again: %s", folder, stale)
        shutil.rmtree(folder)
    if not (ckpt_dir / universal).is_dir():
        tmp = ckpt_dir / f".staging-{universal}"
        shutil.rmtree(tmp, ignore_errors=True)
        log.info("converting %s to a universal checkpoint (data-parallel size changed)", tag)
        cmd = [sys.executable, "-c", _SAFE_CONVERTER, "--input_folder", str(ckpt_dir / tag),
               "--output_folder", str(tmp), "--num_extract_workers", "1", "--num_merge_workers", "1"]
        env = {k: v for k, v in os.environ.items() if k != NO_FORCE_WEIGHTS_ONLY} | {FORCE_WEIGHTS_ONLY: "1"}
        done = subprocess.run(cmd, capture_output=True, text=True, env=env)
        if done.returncode != 0:
            _converter_failed(done, ckpt_dir / tag, tmp)
        try:
            for name in (META, "vocab.txt"):
                shutil.copyfile(ckpt_dir / tag / name, tmp / name)
            record = {"source_meta_sha256": sha256_file(ckpt_dir / tag / META), "files": file_records(tmp)}
            write_text_atomic(tmp / UNIVERSAL_RECORD, json.dumps(record, indent=2, sort_keys=True))
        except OSError as err:  # the disk filled up after the converter's own files: said, then freed
            _cleared(err, tmp)
            raise
        os.replace(tmp, ckpt_dir / universal)
    check_tensor_files(ckpt_dir / universal)
    return universal


UNIVERSAL_RECORD = "bertpipe_universal.json"  # in a converted folder: its source and its files


def _cleared(err: BaseException, tmp: Path) -> None:
    """Delete the partial conversion `tmp`; first, if `err` is a write that did not fit there, raise it as
    `WriteDidNotFit` in one line (said while the partial files are there to name and measure)."""
    from launch.errors import WriteDidNotFit, disk_full_message

    full = disk_full_message(err, tmp) if tmp.is_dir() else None
    shutil.rmtree(tmp, ignore_errors=True)
    if full is not None:
        raise WriteDidNotFit(full) from None


def _converter_failed(done: subprocess.CompletedProcess, source: Path, tmp: Path) -> None:
    """Raise the one line for a failed `ds_to_universal` (its stderr is a runpy warning, progress bars and a
    traceback): a write that did not fit in `tmp` is a fault (`WriteDidNotFit`, exit 1: free space and resume
    again), said while its partial files are the evidence and then deleted so that they do not keep the disk
    full; anything else is the converter's own last line, a ValueError."""
    import signal

    lines = [line.strip() for line in done.stderr.replace("\r", "\n").splitlines() if line.strip()]
    # The exception's own line ends its traceback; progress bars ("it/s]") and log lines are not it.
    last = next((line for line in reversed(lines) if "it/s]" not in line and "%|" not in line), None)
    if done.returncode < 0:
        last = f"killed by {signal.Signals(-done.returncode).name}" + (f" after: {last}" if last else "")
    said = RuntimeError(last or "")
    said.__cause__ = RuntimeError("\n" + done.stderr[-4000:])  # looked through for an errno or a word, not quoted
    _cleared(said, tmp)
    raise ValueError(f"converting {source} to a universal checkpoint failed ({last or f'exit {done.returncode}'}); "
                     f"resume with the original number of processes instead")


def _stale_conversion(ckpt_dir: Path, tag: str, universal: str) -> str | None:
    """Why the converted folder `universal` cannot stand for checkpoint `tag` now, or None."""
    folder = ckpt_dir / universal
    try:
        record = json.loads((folder / UNIVERSAL_RECORD).read_text(encoding="utf-8"))
        files = [(folder / name, int(r["size"]), str(r["sha256"])) for name, r in record["files"].items()]
        source = record["source_meta_sha256"]
    except (OSError, ValueError, KeyError, TypeError, AttributeError):
        return f"its {UNIVERSAL_RECORD} is missing or damaged"
    if source != sha256_file(ckpt_dir / tag / META):
        return f"it was converted from an earlier save of {tag}"
    for path, size, sha256 in files:
        if not path.is_file() or path.stat().st_size != size or sha256_file(path) != sha256:
            return f"{path} is missing, cut short or changed since the conversion"
    return None


def load_rng(ckpt_dir: Path, tag: str, rank: int) -> bool:
    """Restore this rank's RNG states if the checkpoint has them (same world size); False if not."""
    path = ckpt_dir / tag / f"rng_rank{rank}.pt"
    if not path.is_file():
        return False
    state = load_checkpoint_file(path)
    if not isinstance(state, dict) or "python_mt" not in state:
        raise ValueError(f"{path} holds no RNG states of this bertpipe version; resume with the version that "
                         f"wrote the run, or start a new run")
    set_rng_state(state)
    return True
