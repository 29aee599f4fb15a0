"""An export directory: a run's checkpoint as a Hugging Face folder that bertpipe wrote, and read back verified.

`resolve_checkpoint(path)` is what everything that takes a checkpoint calls (`features`, `finetune`,
`sweep`, `pretrain`'s `checkpoint.init_from`): an HF directory is used as it is (one that bertpipe exported
only while its files are as written: `export_damage`), a RUN directory (`launch.checkpoint_dirs`) as the
export of its newest verified checkpoint, made once and cached in `RUN/export/<tag>/` (DeepSpeed is imported
only then). `export_run` is `bertpipe export`: built beside `--out`, then renamed into place whole (into a
folder that exists, moved in file by file, the folder left as it is), with a marker (`bertpipe_export.json`),
placed last, that names the run, the checkpoint and every file's size and sha256.
"""

from __future__ import annotations

import contextlib
import errno
import json
import logging
import os
import re
import stat
import time
from pathlib import Path
from typing import Any

from launch.checkpoint_dirs import (META, WEIGHT_FILES, checkpoint_tags, file_records, is_hf_dir, is_run_dir, read_meta,
                                    select_checkpoint, tag_step)
from pipeline.manifest import sha256_file

logger = logging.getLogger(__name__)

EXPORT_MARKER = "bertpipe_export.json"  # in an export: proves bertpipe wrote it, from which run, which files


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


MODEL_CARD = "README.md"  # an export's model card: the user's to edit; loading never reads it


def export_damage(path: Path) -> str | None:
    """Why the export bertpipe wrote at `path` is not as written: a file that loading reads is missing, or its
    size or sha256 differs from what the marker records. None where it is intact, or holds no marker with
    records (nothing of ours to check: a model from elsewhere, or one whose marker the user removed)."""
    recorded = _export_record(path).get("file_records")
    if not isinstance(recorded, dict):
        return None
    for name, record in sorted(recorded.items()):
        file = path / name
        if name == MODEL_CARD:
            continue
        if not file.is_file():
            return f"{file} is missing"
        size = file.stat().st_size
        if not isinstance(record, dict) or record.get("size") != size or record.get("sha256") != sha256_file(file):
            return f"{file} is not the file bertpipe exported (its size or sha256 differs from {EXPORT_MARKER}'s record)"
    return None


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
        damage = export_damage(path)  # what we wrote is what we read back
        if damage:
            raise ValueError(f"{damage}: export the run again (`bertpipe export RUN --out {path}`), or, if you changed "
                             f"it on purpose, delete {path / EXPORT_MARKER} to use the folder as your own")
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
                        if os.path.lexists(out) and not out.is_dir():
                            raise ValueError(f"{out} is not a directory (nor an export of {path}); move it aside "
                                             f"and rerun")
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
    if out.is_symlink() and not out.exists():  # renamed over, the link would be replaced; written through, fails
        raise ValueError(f"--out {out} is a link to {os.readlink(out)}, which does not exist; create that directory "
                         f"or name another --out")
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
    with _while_it_exists(ckpt_dir, tag):
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
        with _while_it_exists(ckpt_dir, tag):
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


@contextlib.contextmanager
def _while_it_exists(ckpt_dir: Path, tag: str):
    """Reading checkpoint `tag`: where it is gone by the time a read fails, a run still training there pruned it
    (it keeps only its newest `checkpoint.keep_last`). That is said, not "the save did not finish" or a
    FileNotFoundError's traceback."""
    try:
        yield
    except (OSError, ValueError):
        if (ckpt_dir / tag).is_dir() and (ckpt_dir / tag / META).is_file():
            raise
        raise ValueError(f"checkpoint {ckpt_dir / tag} was removed while it was exported (a `bertpipe pretrain` still "
                         "writing the run keeps only its newest checkpoint.keep_last); export again") from None


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
    safetensors its file 0600, which would keep an export from the other users of a shared machine (a
    setgid bit the folder took from its parent stays, as it would on a folder `mkdir` made)."""
    umask = os.umask(0)
    os.umask(umask)
    folder.chmod(0o777 & ~umask | folder.stat().st_mode & stat.S_ISGID)
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
    """Move the finished export `tmp` to `out`: a new `out` is `tmp` renamed whole (a concurrent reader never
    sees half a model); into an `out` that exists (a folder of the user's, empty or not, a link to one, a
    mount point) the files are moved one by one, the marker last, and the folder (its inode, mode, owner and
    group) and a link to it stay as they are. Of what was there, only the files an earlier export's marker
    lists, as it recorded them (size and sha256), are removed."""
    if not os.path.lexists(out):
        try:
            os.replace(tmp, out)
            return
        except OSError:  # another process placed its export first: replace its files below
            if not out.is_dir():
                raise
    _as_folder_gives(tmp, out)
    ours = export_files(out)
    new = sorted(p.name for p in tmp.iterdir())
    foreign = [n for n in new if (out / n).exists() and n not in ours]  # `--overwrite`: named, not silent
    if foreign:
        logger.warning("%s: replacing %d file(s) bertpipe did not write, or that were changed since, with the "
                       "export's: %s", out, len(foreign), ", ".join(foreign))
    # config.json last but the marker: a reader sees no model folder (`is_hf_dir`) before its other files are in.
    for name in sorted((n for n in new if n != EXPORT_MARKER), key=lambda n: (n == "config.json", n)):
        _move_file(tmp / name, out / name)
    _check_whole(out, tmp / EXPORT_MARKER)  # only a whole export is marked as one
    _move_file(tmp / EXPORT_MARKER, out / EXPORT_MARKER)
    for name in ours - set(new):  # an earlier export's file this one does not write, unchanged since
        if (out / name).is_file():
            (out / name).unlink()
    kept = sorted(p.name for p in out.iterdir() if p.name not in new)
    if kept:
        logger.warning("%s also holds %d file(s) bertpipe did not write, left as they are: %s", out, len(kept),
                       ", ".join(kept[:5]))


def export_files(out: Path) -> set[str]:
    """The files in `out` that an earlier export's marker lists, each as the export wrote it (its recorded size
    and sha256; a file changed since is the user's), the marker among them: what bertpipe may replace or delete."""
    record = _export_record(out)
    previous, recorded = record.get("files", []), record.get("file_records")

    def as_written(name: str) -> bool:
        path = out / name
        if name == EXPORT_MARKER or not isinstance(recorded, dict):  # markers before the records: the name
            return True
        return name in recorded and path.is_file() and recorded[name] == {"size": path.stat().st_size,
                                                                          "sha256": sha256_file(path)}

    if not isinstance(previous, list):
        return set()
    return {n for n in previous if isinstance(n, str) and "/" not in n and as_written(n)}


def _as_folder_gives(tmp: Path, out: Path) -> None:
    """The group a file written into `out` would have had: that of `out` where it is setgid (a shared folder),
    not that of the folder beside it the export was built in. Where the user may not give it, left as it is."""
    folder = out.stat()
    if folder.st_mode & stat.S_ISGID:
        for path in tmp.iterdir():
            with contextlib.suppress(OSError):
                os.chown(path, -1, folder.st_gid)


def _check_whole(out: Path, marker: Path) -> None:
    """Every file the export's marker records is in `out`, of its recorded size, before the marker is placed."""
    for name, record in json.loads(marker.read_text(encoding="utf-8"))["file_records"].items():
        if not (out / name).is_file() or (out / name).stat().st_size != record["size"]:
            raise ValueError(f"{out / name} changed while the export was moved into {out} (another process "
                             f"writes there?); the export is not marked complete: export again")
