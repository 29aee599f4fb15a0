"""What a checkpoint directory is: the one home of that fact, torch-free at import.

Everything that takes a checkpoint (`features`, `finetune`, `sweep`, `pretrain`'s
`checkpoint.init_from`, `export`) goes through `resolve_checkpoint(path)`, which accepts:
- a Hugging Face directory: `config.json` and `model.safetensors`, a sharded
  `model.safetensors.index.json` with its shards, or `pytorch_model.bin` (read as tensors only,
  `model.torch_files.load_torch_file`);
- a bertpipe RUN directory (`bertpipe pretrain --out RUN`): `RUN/checkpoints/global_step<N>/`, each
  with `bertpipe.json` (step, config, and the size and sha256 of every other file in the folder),
  and `RUN/checkpoints/latest`. It resolves to the export of its newest verified checkpoint,
  cached in `RUN/export/<tag>/` (DeepSpeed is imported only then).

`select_checkpoint(ckpt_dir)` is how `--resume`, `export` and the resolution pick a checkpoint: the
newest whose files match the sizes and sha256s recorded at save, with no unrecorded tensor file (each
one skipped is named, with why, in one log line), whose `.pt` files then hold nothing but tensors, plain values and the few
DeepSpeed classes in `DEEPSPEED_SAFE_GLOBALS` (`launch.pretrain.hf_export`; else it is refused: a file that could run code is
never loaded, and never silently passed over). A missing `latest` is no reason to start again.

Fine-tuning opens a checkpoint through `launch.finetune.checkpoint.open_checkpoint`, which also checks
its vocabulary.
"""

from __future__ import annotations

import contextlib
import errno
import hashlib
import json
import logging
import os
import re
import time
from pathlib import Path
from typing import Any

from pipeline.manifest import sha256_file

logger = logging.getLogger(__name__)

WEIGHT_FILES = ("model.safetensors", "model.safetensors.index.json", "pytorch_model.bin")
META = "bertpipe.json"  # our metadata in each checkpoint folder
META_SEAL = "meta_sha256"  # in META: the sha256 of the rest of it, so that an edit or damage there is caught too
RUN_MARKER = ".bertpipe-run"  # in a run directory `pretrain` made: it may rewrite RUN_FILES there
RUN_FILES = ("config.yaml", "ds_config.json", "vocab.txt", "metrics.jsonl", "tensorboard", "checkpoints")
EXPORT_MARKER = "bertpipe_export.json"  # in an export: proves bertpipe wrote it, from which run, which files
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


def _export_record(path: Path) -> dict[str, Any]:
    """The marker of an export bertpipe wrote at `path` ({} when there is none or it is unreadable)."""
    try:
        record = json.loads((path / EXPORT_MARKER).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return {}
    return record if isinstance(record, dict) else {}


def exported_step(path: Path) -> int | None:
    """The step of the checkpoint bertpipe exported to `path` (None: no export of ours there)."""
    tag = _export_record(path).get("tag")
    return tag_step(tag) if isinstance(tag, str) else None


def is_export_of(path: Path, run_dir: Path) -> bool:
    """Whether `path` holds an export of `run_dir` written by bertpipe (its marker says so)."""
    return _export_record(path).get("run") == str(Path(run_dir).resolve())


def _checkpoint_identity(ckpt_dir: Path, tag: str) -> str | None:
    """sha256 of the checkpoint's `bertpipe.json`, which records the sha256 of each of its files: what
    an export was made from. None when unreadable."""
    try:
        return sha256_file(ckpt_dir / tag / META)
    except OSError:
        return None


def _is_cached_export(path: Path, run_dir: Path, tag: str) -> bool:
    """An export of checkpoint `tag` of `run_dir` as it is now: not of another tag exported under this
    name, nor of a checkpoint since retrained under the same tag (its metadata's sha256 differs)."""
    if not ((path / "config.json").is_file() and (path / "model.safetensors").is_file()):
        return False
    record = _export_record(path)
    identity = _checkpoint_identity(Path(run_dir) / "checkpoints", tag)
    if not (record.get("run") == str(Path(run_dir).resolve()) and record.get("tag") == tag
            and identity is not None and record.get("checkpoint_sha256") == identity):
        return False
    # What we wrote is what we read back: an export changed since (or made before its files were recorded)
    # is made again, not used.
    recorded = record.get("file_records")
    if not isinstance(recorded, dict) or not recorded:
        return False
    now = {name: r for name, r in file_records(path).items() if name != EXPORT_MARKER}
    if now != recorded:
        changed = sorted(n for n in set(now) | set(recorded) if now.get(n) != recorded.get(n))
        logger.warning("%s: %s changed since bertpipe exported it; exporting again", path, ", ".join(changed))
        return False
    return True


def resolve_checkpoint(path: str | Path) -> Path:
    """An HF-format directory for `path`: itself if it is one, else the export of a RUN's newest verified checkpoint."""
    path = Path(path)
    if not path.exists():
        raise ValueError(f"checkpoint {path} does not exist; pass a bertpipe run directory or a Hugging Face model "
                         f"directory")
    if is_hf_dir(path):
        if not any((path / w).is_file() for w in WEIGHT_FILES[:2]):  # pickle weights only: refused up front
            from model.torch_files import check_torch_file

            check_torch_file(path / "pytorch_model.bin")
        return path
    if is_run_dir(path):
        ckpt_dir = path / "checkpoints"
        tags = checkpoint_tags(ckpt_dir)
        if tags and _is_cached_export(path / "export" / tags[0], path, tags[0]):
            return path / "export" / tags[0]  # exported earlier from this very checkpoint: safetensors
        tag = select_checkpoint(ckpt_dir)
        out = path / "export" / tag
        if not _is_cached_export(out, path, tag):
            try:
                with _export_lock(out):  # sweep trials resolve the same run at once: one exports, the others wait
                    if not _is_cached_export(out, path, tag):
                        if out.is_dir() and any(out.iterdir()) and not is_export_of(out, path):
                            raise ValueError(f"{out} holds files that are not an export of {path} (no readable "
                                             f"{EXPORT_MARKER}); move it aside and rerun")
                        export_run(path, out, tag=tag, verified=True)
                        logger.info("exported %s (%s) to %s", path, tag, out)
            except OSError as err:  # a read-only run directory, or RUN/export a file
                raise ValueError(f"cannot write the export of {path} to {out} "
                                 f"({err.strerror or err}); run `bertpipe export {path} --out DIR` with a "
                                 f"writable DIR and pass DIR instead") from None
        return out
    raise ValueError(f"{path} holds no BERT: it is neither a run directory of `bertpipe pretrain` (no checkpoints/) "
                     f"nor a Hugging Face model directory (config.json and one of {', '.join(WEIGHT_FILES)}); "
                     f"pass one of those")


def export_lock_file(out: Path) -> Path:
    """The lock of an export folder: beside it, as the export is renamed into place whole."""
    from pipeline.output_lock import lock_beside

    return lock_beside(out)


@contextlib.contextmanager
def _export_lock(out: Path, poll_s: float = 2.0):
    """Hold `out`'s export lock, waiting (with one line saying so) while another process holds it."""
    from pipeline.output_lock import OutputLock, OutputLocked

    out.parent.mkdir(parents=True, exist_ok=True)
    lock, said = OutputLock(out, "export", lock_file=export_lock_file(out)), False
    while True:
        try:
            lock.acquire()
            break
        except OutputLocked as err:
            if not said:
                logger.info("waiting for the other export of %s to finish: %s", out, err)
                said = True
            time.sleep(poll_s)
    try:
        yield
    finally:
        lock.release()


def check_export_target(run_dir: Path, out: Path, overwrite: bool) -> None:
    """Refuse an export `out` whose files bertpipe did not write: a non-empty directory that holds no
    export of this run (unless `overwrite`); never, even with `overwrite`, the run directory, a folder
    inside it other than `RUN/export/`, one of its parents, the working directory or one of its parents."""
    run, target, cwd = run_dir.resolve(), out.resolve(), Path.cwd().resolve()
    if target == run or target in run.parents:
        raise ValueError(f"--out {out} is the run directory {run_dir} or one of its parents; export into a new "
                         f"directory beside it, e.g. --out {run_dir.parent / (run_dir.name + '-hf')}")
    if target.is_relative_to(run) and not target.is_relative_to(run / "export"):
        raise ValueError(f"--out {out} lies inside the run directory {run_dir}; only {run_dir / 'export'}/ may hold "
                         f"exports there")
    if target == cwd or target in cwd.parents:
        raise ValueError(f"--out {out} is the working directory or one of its parents; name a new directory")
    if out.exists() and not out.is_dir():
        raise ValueError(f"--out {out} is a file; name a directory")
    if out.is_dir() and any(out.iterdir()) and not is_export_of(out, run_dir) and not overwrite:
        raise ValueError(f"--out {out} is not empty and holds no export of {run_dir}; choose a new or empty "
                         f"directory, or add --overwrite to write the export's files into it (those of the same "
                         f"names are replaced; nothing else there is deleted)")


def export_run(run_dir: str | Path, out: str | Path, tag: str | None = None, *, overwrite: bool = False,
               verified: bool = False) -> Path:
    """Export checkpoint `tag` of a RUN (default: its newest verified one) as an HF directory `out`
    (`bertpipe export`); `verified`: the caller has just chosen `tag` with `select_checkpoint`."""
    import shutil
    import tempfile

    run_dir, out = Path(run_dir), Path(out)
    if not is_run_dir(run_dir):
        raise ValueError(f"{run_dir} has no checkpoints; pass a run directory written by `bertpipe pretrain --out`")
    check_export_target(run_dir, out, overwrite)
    ckpt_dir = run_dir / "checkpoints"
    tag = tag if verified else select_checkpoint(ckpt_dir, tag)
    meta = read_meta(ckpt_dir, tag)
    lacking = [k for k in ("config", "bert_config") if not isinstance(meta.get(k), dict)]
    if lacking:
        raise ValueError(f"{ckpt_dir / tag / META} lacks {' and '.join(lacking)} (the run's settings and the "
                         "model's shape); the checkpoint's metadata is damaged")
    from launch.pretrain.hf_export import write_export  # torch and DeepSpeed: only once there is work

    out.parent.mkdir(parents=True, exist_ok=True)
    _remove_stopped_exports(out)
    tmp = Path(tempfile.mkdtemp(prefix=f"{_partial_prefix(out)}{os.getpid()}-", dir=out.parent))
    try:
        write_export(ckpt_dir, tag, meta, tmp, run_dir)
        marker = {"format": "bertpipe-export", "run": str(run_dir.resolve()), "tag": tag,
                  "checkpoint_sha256": _checkpoint_identity(ckpt_dir, tag),
                  "files": sorted(p.name for p in tmp.iterdir()) + [EXPORT_MARKER],
                  "file_records": file_records(tmp)}
        (tmp / EXPORT_MARKER).write_text(json.dumps(marker, indent=2) + "\n", encoding="utf-8")
        _as_umask_allows(tmp)
        _place(tmp, out)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return out


def _partial_prefix(out: Path) -> str:
    """The name an export of `out` builds in, beside it, before the rename: `.OUT.bertpipe-partial-PID-*`."""
    return f".{out.name}.bertpipe-partial-"


def _remove_stopped_exports(out: Path) -> None:
    """An export that was killed left its folder beside `out`, a whole model's size, which no later export
    removed: those of processes no longer running go (under `out`'s lock no other export of it runs)."""
    import glob
    import shutil

    from pipeline.output_lock import pid_alive

    prefix = _partial_prefix(out)
    for path in out.parent.glob(glob.escape(prefix) + "*"):
        # PID-XXXXXXXX exactly, as `export_run`'s mkdtemp names it: nothing else of that prefix is touched.
        made = re.fullmatch(r"(\d+)-[a-z0-9_]{8}", path.name[len(prefix):])
        if made and path.is_dir() and not path.is_symlink() and not pid_alive(int(made.group(1))):
            shutil.rmtree(path, ignore_errors=True)
            logger.info("removed %s, left by an export that was stopped", path)


def _as_umask_allows(folder: Path) -> None:
    """The permissions a plain `mkdir` / `open` would have given: `mkdtemp` makes the folder 0700 and
    safetensors its file 0600, which would keep an export from the other users of a shared machine."""
    umask = os.umask(0)
    os.umask(umask)
    folder.chmod(0o777 & ~umask)
    for path in folder.iterdir():
        if path.is_file():
            path.chmod(0o666 & ~umask)


def _move_file(src: Path, dst: Path) -> None:
    """`os.replace`, also where `dst` is on another file system than `src` (an `--out` that is a mount point:
    the export is built beside it, in its parent): copied beside `dst`, then renamed over it."""
    import shutil

    try:
        os.replace(src, dst)
    except OSError as err:
        if err.errno != errno.EXDEV:
            raise
        part = dst.with_name(f".{dst.name}.bertpipe-partial-{os.getpid()}")
        try:
            shutil.copyfile(src, part)
            os.replace(part, dst)
        finally:
            part.unlink(missing_ok=True)


def _place(tmp: Path, out: Path) -> None:
    """Move the finished export `tmp` to `out`: whole when `out` is new or empty (so a concurrent
    reader never sees half a model), else file by file, the marker last; of what was there, only the
    files an earlier export's marker lists, as it recorded them (size and sha256), are removed."""
    if out.is_dir() and not any(out.iterdir()):
        try:
            out.rmdir()
        except OSError as err:  # a mount point (EBUSY) cannot be replaced: it is filled file by file below
            if err.errno != errno.EBUSY:
                raise
    if not out.exists():
        try:
            os.replace(tmp, out)
            return
        except OSError:  # another process placed its export first: replace its files below
            pass
    record = _export_record(out)
    previous, recorded = record.get("files", []), record.get("file_records")

    def as_written(name: str) -> bool:  # a file the marker names is ours only as the export wrote it
        path = out / name
        if name == EXPORT_MARKER or not isinstance(recorded, dict):  # markers before the records: the name
            return True
        return name in recorded and path.is_file() and recorded[name] == {"size": path.stat().st_size,
                                                                          "sha256": sha256_file(path)}

    ours = {n for n in previous if isinstance(n, str) and "/" not in n and as_written(n)}
    new = sorted(p.name for p in tmp.iterdir())
    foreign = [n for n in new if (out / n).exists() and n not in ours]  # `--overwrite`: named, not silent
    if foreign:
        logger.warning("%s: replacing %d file(s) bertpipe did not write, or that were changed since, with the "
                       "export's: %s", out, len(foreign), ", ".join(foreign))
    for name in [n for n in new if n != EXPORT_MARKER] + [EXPORT_MARKER]:
        _move_file(tmp / name, out / name)
    for name in ours - set(new):  # an earlier export's file this one does not write, unchanged since
        if (out / name).is_file():
            (out / name).unlink()
    kept = sorted(p.name for p in out.iterdir() if p.name not in new)
    if kept:
        logger.warning("%s also holds %d file(s) bertpipe did not write, left as they are: %s", out, len(kept),
                       ", ".join(kept[:5]))
