"""What a checkpoint directory is: the one home of that fact, torch-free at import.

A checkpoint argument (`features`, `finetune`, `sweep`, `pretrain`'s `checkpoint.init_from`) may be:
- a Hugging Face directory (`is_hf_dir`): `config.json` and `model.safetensors`, a sharded
  `model.safetensors.index.json` with its shards, or `pytorch_model.bin` (read as tensors only,
  `model.torch_files.load_torch_file`);
- a bertpipe RUN directory (`is_run_dir`; `bertpipe pretrain --out RUN`): `RUN/checkpoints/global_step<N>/`,
  each with `bertpipe.json` (step, config, and the size and sha256 of every other file in the folder),
  and `RUN/checkpoints/latest`.
`launch.export_dirs.resolve_checkpoint(path)` turns either into an HF directory (a run's newest verified
checkpoint exported once, cached in `RUN/export/<tag>/`).

`select_checkpoint(ckpt_dir)` is how `--resume`, `export` and the resolution pick a checkpoint: the
newest whose files match the sizes and sha256s recorded at save, with no unrecorded tensor file (each
one skipped is named, with why, in one log line), whose `.pt` files then hold nothing but tensors, plain values and the few
DeepSpeed classes in `DEEPSPEED_SAFE_GLOBALS` (`launch.pretrain.hf_export`; else it is refused: a file that could run code is
never loaded, and never silently passed over). A missing `latest` is no reason to start again.

Fine-tuning opens a checkpoint through `launch.finetune.checkpoint.open_checkpoint`, which also checks
its vocabulary.
"""
from __future__ import annotations

import hashlib
import json
import logging
import re
from pathlib import Path
from typing import Any

from pipeline.manifest import sha256_file

logger = logging.getLogger(__name__)

WEIGHT_FILES = ("model.safetensors", "model.safetensors.index.json", "pytorch_model.bin")
META = "bertpipe.json"  # our metadata in each checkpoint folder
META_SEAL = "meta_sha256"  # in META: the sha256 of the rest of it, so that an edit or damage there is caught too
RUN_MARKER = ".bertpipe-run"  # in a run directory `pretrain` made: it may rewrite RUN_FILES there
RUN_FILES = ("config.yaml", "ds_config.json", "vocab.txt", "metrics.jsonl", "tensorboard", "checkpoints")
_TAG = re.compile(r"^global_step(\d+)$")


def tag_for(step: int) -> str:
    return f"global_step{step}"


def tag_step(tag: str) -> int | None:
    m = _TAG.match(tag)
    return int(m.group(1)) if m else None


def is_hf_dir(path: Path) -> bool:
    """`config.json` and weights: single or sharded safetensors, or pytorch_model.bin."""
    return (path / "config.json").is_file() and any((path / w).is_file() for w in WEIGHT_FILES)


def checkpoint_tags(ckpt_dir: Path) -> list[str]:
    """The `global_step<N>` folders of RUN/checkpoints, newest first (complete or not)."""
    if not ckpt_dir.is_dir():
        return []
    tags = [p.name for p in ckpt_dir.iterdir() if p.is_dir() and tag_step(p.name) is not None]
    return sorted(tags, key=tag_step, reverse=True)


def is_run_dir(path: Path) -> bool:
    ckpt_dir = path / "checkpoints"
    return (ckpt_dir / "latest").is_file() or bool(checkpoint_tags(ckpt_dir))


def read_latest(ckpt_dir: Path) -> str | None:
    """The tag `checkpoints/latest` names (None without one): a hint; `select_checkpoint` decides."""
    latest = ckpt_dir / "latest"
    try:
        return latest.read_text(encoding="utf-8").strip() if latest.is_file() else None
    except UnicodeDecodeError:  # damaged: only a hint, and the newest verified checkpoint is chosen anyway
        logger.warning("%s is not text (damaged): going by the checkpoints themselves", latest)
        return None


def _meta_digest(meta: dict[str, Any]) -> str:
    body = {k: v for k, v in meta.items() if k != META_SEAL}
    return hashlib.sha256(json.dumps(body, sort_keys=True, separators=(",", ":")).encode("utf-8")).hexdigest()


def sealed(meta: dict[str, Any]) -> dict[str, Any]:
    """`meta` with the sha256 of its own content: the one file of a checkpoint the file records cannot cover."""
    return {**meta, META_SEAL: _meta_digest(meta)}


def read_meta(ckpt_dir: Path, tag: str) -> dict[str, Any]:
    """A checkpoint's metadata, checked against its own sha256 (metadata saved before the seal has none)."""
    path = ckpt_dir / tag / META
    try:
        meta = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise ValueError(f"{path} is missing (the save did not finish)") from None
    except (json.JSONDecodeError, UnicodeDecodeError) as err:
        raise ValueError(f"{path} is not valid JSON ({err}); the checkpoint's metadata is damaged") from None
    if not isinstance(meta, dict) or "step" not in meta:
        raise ValueError(f"{path} is not bertpipe checkpoint metadata (no step)")
    if META_SEAL in meta and meta[META_SEAL] != _meta_digest(meta):
        raise ValueError(f"{path} does not match the sha256 it records of itself ({META_SEAL}): edited or damaged")
    return meta


def file_records(folder: Path) -> dict[str, dict[str, Any]]:
    """Size and sha256 of every file under `folder` but the metadata itself, for `bertpipe.json`."""
    return {p.relative_to(folder).as_posix(): {"size": p.stat().st_size, "sha256": sha256_file(p)}
            for p in sorted(folder.rglob("*")) if p.is_file() and p.name != META}


def verify_checkpoint(ckpt_dir: Path, tag: str) -> str | None:
    """Why checkpoint `tag` is incomplete or damaged, or None when every recorded file is intact."""
    try:
        meta = read_meta(ckpt_dir, tag)
    except ValueError as err:
        return str(err)
    folder = ckpt_dir / tag
    try:
        records = [(folder / name, int(r["size"]), str(r["sha256"])) for name, r in meta.get("files", {}).items()]
    except (AttributeError, KeyError, TypeError, ValueError):
        return f"{folder / META} has no valid `files` records (size and sha256 per file)"
    if "files" in meta:  # checkpoints written before the records existed have none
        recorded = {path for path, _, _ in records}
        unrecorded = sorted(p for p in folder.rglob("*") if p.suffix in (".pt", ".safetensors") and p not in recorded)
        if unrecorded or not records:  # a tensor file no record covers would be loaded unverified
            return (f"{unrecorded[0]} is not among the files {META} recorded (added after the save)" if unrecorded
                    else f"{folder / META} records no files")
    for path, size, sha256 in records:
        if not path.is_file():
            return f"{path} is missing"
        if path.stat().st_size != size:
            return f"{path} has {path.stat().st_size} bytes, {META} recorded {size} (cut short or changed)"
        if sha256_file(path) != sha256:
            return f"{path} does not match the sha256 {META} recorded (damaged or changed)"
    return None


def check_tensor_files(folder: Path) -> None:
    """Refuse, naming the file, a `.pt` file under `folder` whose pickle could run code."""
    from launch.pretrain.hf_export import DEEPSPEED_SAFE_GLOBALS
    from model.torch_files import check_torch_file

    for path in sorted(folder.rglob("*.pt")):
        check_torch_file(path, frozenset(DEEPSPEED_SAFE_GLOBALS))


def select_checkpoint(ckpt_dir: Path, tag: str | None = None) -> str:
    """The checkpoint to load: `tag` if given (it must verify), else the newest that verifies."""
    if tag is not None:
        if tag not in checkpoint_tags(ckpt_dir):  # a name, not a path: `../../other/checkpoints/x` was exported as this run's
            raise ValueError(f"no checkpoint {tag!r} in {ckpt_dir}; available: "
                             f"{', '.join(checkpoint_tags(ckpt_dir)) or 'none'}")
        reason = verify_checkpoint(ckpt_dir, tag)
        if reason:
            raise ValueError(f"checkpoint {ckpt_dir / tag} is damaged: {reason}")
    else:
        skipped = []
        for candidate in checkpoint_tags(ckpt_dir):
            reason = verify_checkpoint(ckpt_dir, candidate)
            if reason is None:
                tag = candidate
                break
            logger.warning("checkpoint %s skipped: %s", ckpt_dir / candidate, reason)
            skipped.append(f"{candidate}: {reason}")
        if tag is None:
            raise ValueError(f"no complete checkpoint in {ckpt_dir}" + (f" ({'; '.join(skipped)})" if skipped else "")
                             + "; restore the run directory or start a new run with another --out")
        latest = read_latest(ckpt_dir)
        if latest is None:
            logger.warning("%s is %s: using the newest complete checkpoint, %s", ckpt_dir / "latest",
                           "damaged" if (ckpt_dir / "latest").is_file() else "missing", tag)
        elif latest != tag and not skipped and (tag_step(latest) or -1) < tag_step(tag):
            # saved, but the run stopped before `latest` moved
            logger.info("%s names %s; %s is newer and complete: using it", ckpt_dir / "latest", latest, tag)
        elif latest != tag and not skipped:  # the folder it names is gone (deleted by hand)
            logger.warning("%s names %s, which is not among the checkpoints; using the newest complete one, %s",
                           ckpt_dir / "latest", latest, tag)
    if "files" not in read_meta(ckpt_dir, tag):  # written before bertpipe recorded them
        logger.warning("%s records no file sizes or sha256s: its files are loaded unverified", ckpt_dir / tag / META)
    check_tensor_files(ckpt_dir / tag)  # never a fallback: a file that could run code is someone's doing
    return tag
