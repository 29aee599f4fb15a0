"""Frozen-encoder activations on disk: computed once per (checkpoint, data, split, max_seq_len, device and
precision) and layer, then read back by every trial and seed of feature-based fine-tuning (the paper's Table 7).

Layout under the cache root, one folder per split's inputs:

    ROOT/<key>/layer-<k>.safetensors   one fp16 tensor `hidden` [T, H]: the T tokens of every feature
                                       of the split, concatenated in feature order (hidden state k:
                                       0 = embeddings, i = output of encoder layer i)
    ROOT/<key>/layer-<k>.json          what it was computed from, its shape and sha256 (written last:
                                       a layer without its record does not exist)
    ROOT/<key>/.lock                   held while layers are computed, so concurrent trials wait and
                                       then read, instead of running the encoder twice

<key> is a sha256 of the format version, the checkpoint (config.json and every weight file's sha256),
the task, split and max_seq_len, the device type and precision the encoder ran in, and the token ids of the split's features (which pin the data, the
subset, the tokenizer and the windowing). Layers are stored one by one, so the rows of Table 7 that
share layers (last4-weighted and last4-concat; the last four and all layers) compute them once.
fp16 halves the disk; the heads compute in fp32. Files are written under a temporary name and
renamed; on the way back in the sha256, dtype and shape are checked, and a damaged layer is logged and
computed again. Only tensors are stored (safetensors), never pickles.

Shape legend: T tokens of a split, H hidden, K chosen layers.
"""

from __future__ import annotations

import errno
import fcntl
import hashlib
import json
import logging
import os
import time
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Iterator, Sequence

import numpy as np
import torch

from launch.errors import WriteDidNotFit, disk_full_message
from launch.finetune.examples import DataError
from pipeline.atomic_write import write_text_atomic
from pipeline.manifest import sha256_file

logger = logging.getLogger(__name__)

FORMAT = "bertpipe-feature-cache"
VERSION = 1
STORED_DTYPE = torch.float16


def default_cache_dir() -> Path:
    """$XDG_CACHE_HOME/bertpipe/features (~/.cache/bertpipe/features): shared by runs, sweeps and seeds."""
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "bertpipe" / "features"


_CHECKPOINT_DIGESTS: dict[tuple, str] = {}


def checkpoint_digest(hf_dir: Path) -> str:
    """sha256 over config.json and every weight file's sha256 (memoised per process on size and mtime)."""
    files = sorted(p for p in hf_dir.iterdir() if p.name == "config.json" or p.suffix in (".safetensors", ".bin")
                   or p.name.endswith(".index.json"))
    stamp = tuple((p.name, p.stat().st_size, p.stat().st_mtime_ns) for p in files)
    key = (str(hf_dir.resolve()), stamp)
    if key not in _CHECKPOINT_DIGESTS:
        h = hashlib.sha256()
        for p in files:
            h.update(f"{p.name}:{sha256_file(p)}\n".encode())
        _CHECKPOINT_DIGESTS[key] = h.hexdigest()
    return _CHECKPOINT_DIGESTS[key]


def data_digest(feats: Sequence) -> str:
    """sha256 of the features' token ids and segment ids, feature by feature."""
    h = hashlib.sha256()
    for f in feats:
        h.update(np.asarray(f.input_ids, dtype=np.int32).tobytes())
        h.update(np.asarray(f.token_type_ids, dtype=np.int8).tobytes())
        h.update(b"|")
    return h.hexdigest()


@dataclass
class CacheStats:
    hits: int = 0  # layers read from the cache
    misses: int = 0  # layers computed by the encoder
    encoder_batches: int = 0  # forward passes of the encoder run by this process
    seconds: float = 0.0  # spent computing and writing layers
    verify_failures: list[str] = field(default_factory=list)


@dataclass(frozen=True)
class SplitKey:
    """What a split's activations depend on; `digest` names its cache folder."""

    checkpoint: str  # checkpoint_digest
    data: str  # data_digest
    task: str
    split: str
    max_seq_len: int
    compute: str  # where and how the encoder ran ("cpu-fp32", "cuda-fp32", "cuda-bf16"): activations differ
    # in their last bits between them, and a trial must not get other bytes for having found another's cache

    @property
    def digest(self) -> str:
        text = json.dumps({"format": FORMAT, "version": VERSION, **self.__dict__}, sort_keys=True)
        return hashlib.sha256(text.encode()).hexdigest()[:32]


class FeatureCache:
    def __init__(self, root: str | Path, stats: CacheStats | None = None) -> None:
        self.root = Path(root)
        self.stats = stats or CacheStats()

    def layers(self, key: SplitKey, wanted: Sequence[int], num_tokens: int, hidden: int,
               compute: Callable[[list[int]], dict[int, torch.Tensor]]) -> torch.Tensor:
        """[T, K, H] fp16 activations of the `wanted` layers; `compute(missing)` runs the encoder for
        the missing ones ({layer: [T, H]}) and is not called when every layer is cached. Each layer is
        copied into the result as it is read, so reading holds one layer beside the result, not all
        of them (Table 7's all-weighted row is 13 layers of the whole training set)."""
        folder = self.root / key.digest
        out = torch.empty((num_tokens, len(wanted), hidden), dtype=STORED_DTYPE)
        filled: set[int] = set()

        def fill(layer: int, tensor_TH: torch.Tensor) -> None:
            for i, k in enumerate(wanted):
                if k == layer:
                    out[:, i] = tensor_TH
            filled.add(layer)

        def read_cached(report: bool) -> None:
            for k in dict.fromkeys(wanted):
                if k not in filled and (t := self._read(folder, k, num_tokens, hidden, report=report)) is not None:
                    fill(k, t)
                    del t  # before the next read, not after it

        # A first look without the lock, quiet: a damaged file is reported once, by the look under the lock.
        read_cached(report=False)
        missing: list[int] = []
        if len(filled) < len(set(wanted)):
            not_cached = sorted(set(wanted) - filled)
            try:
                folder.mkdir(parents=True, exist_ok=True)
                lock_file = open(folder / ".lock", "a+")
            except OSError as err:  # a read-only cache serves what it holds; computing more needs a writable one
                if err.errno not in (errno.EROFS, errno.EACCES, errno.EPERM):
                    raise
                several = len(not_cached) > 1
                raise DataError(
                    f"--feature-cache {self.root} is not writable ({err.strerror}) and "
                    f"{'layers' if several else 'layer'} {', '.join(map(str, not_cached))} of {key.task}/{key.split} "
                    f"{'are' if several else 'is'} not cached there; pass a writable --feature-cache") from None
            with _locked(lock_file, f"layers {not_cached} of {key.task}/{key.split}"):
                _sweep_stale_temps(folder)
                read_cached(report=True)  # another trial may have written them while we waited for the lock
                missing = sorted(set(wanted) - filled)
                if missing:
                    t0, batches = time.perf_counter(), self.stats.encoder_batches
                    computed = compute(missing)
                    for k in missing:
                        tensor_TH = computed.pop(k).to(STORED_DTYPE).contiguous()
                        self._write(folder, k, tensor_TH, key, self.stats.encoder_batches - batches)
                        fill(k, tensor_TH)
                        del tensor_TH
                    self.stats.seconds += time.perf_counter() - t0
                    logger.info("feature cache: computed layers %s of %s/%s (%d tokens) in %.1fs -> %s", missing,
                                key.task, key.split, num_tokens, time.perf_counter() - t0, folder)
        self.stats.misses += len(missing)
        self.stats.hits += len(set(wanted)) - len(missing)
        if not missing:
            logger.info("feature cache: %s/%s layers %s read from %s (encoder not run)", key.task, key.split,
                        list(wanted), folder)
        return out

    # -- one layer file --------------------------------------------------------------------------------------

    def _read(self, folder: Path, layer: int, num_tokens: int, hidden: int, report: bool = True) -> torch.Tensor | None:
        record_file, data_file = folder / f"layer-{layer}.json", folder / f"layer-{layer}.safetensors"
        if not record_file.is_file():
            return None
        from safetensors import SafetensorError
        from safetensors.torch import load_file

        try:
            record = json.loads(record_file.read_text(encoding="utf-8"))
            problem = None
            if not isinstance(record, dict):
                problem = f"{record_file.name} is not a record"
            elif record.get("format") != FORMAT or record.get("version") != VERSION:
                problem = f"format {record.get('format')!r} version {record.get('version')!r}"
            elif record.get("shape") != [num_tokens, hidden]:
                problem = f"shape {record.get('shape')} instead of {[num_tokens, hidden]}"
            elif not data_file.is_file() or sha256_file(data_file) != record.get("sha256"):
                problem = "its sha256 does not match its record"
            if problem is None:
                tensor = load_file(data_file)["hidden"]
                if tensor.dtype != STORED_DTYPE or list(tensor.shape) != [num_tokens, hidden]:
                    problem = f"holds {tensor.dtype} {list(tensor.shape)}"
                else:
                    return tensor
        except (OSError, ValueError, KeyError, SafetensorError) as err:
            problem = f"unreadable ({err})"
        if report:
            self.stats.verify_failures.append(f"{data_file}: {problem}")
            logger.warning("feature cache: %s %s; computing it again", data_file, problem)
        return None

    def _write(self, folder: Path, layer: int, tensor_TH: torch.Tensor, key: SplitKey, encoder_batches: int) -> None:
        from safetensors import SafetensorError
        from safetensors.torch import save_file

        data_file, record_file = folder / f"layer-{layer}.safetensors", folder / f"layer-{layer}.json"
        tmp = folder / f".layer-{layer}.safetensors.{os.getpid()}.tmp"
        writing = data_file
        try:
            save_file({"hidden": tensor_TH}, str(tmp))
            digest = sha256_file(tmp)
            record = {"format": FORMAT, "version": VERSION, "layer": layer, "shape": list(tensor_TH.shape),
                      "dtype": str(STORED_DTYPE).removeprefix("torch."), "sha256": digest,
                      "encoder_batches": encoder_batches, "created": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
                      **key.__dict__}
            # The record goes last: it is what says the layer exists.
            os.replace(tmp, data_file)
            writing = record_file
            write_text_atomic(record_file, json.dumps(record, indent=1) + "\n")
        except BaseException as err:
            # Neither error names the file (safetensors' says "os error 28", a short write's OSError no path),
            # so the CLI blamed --out: asked now, while the partial file still fills the disk.
            message = disk_full_message(err, writing) if isinstance(err, (OSError, SafetensorError)) else None
            _remove(tmp)  # a full disk must not leave a half-written layer behind
            if writing == record_file:
                _remove(data_file)  # a layer without its record does not exist: its space is freed
            if message is None:
                raise
            raise WriteDidNotFit(message) from None


def _remove(path: Path) -> None:
    try:
        path.unlink(missing_ok=True)
    except OSError:
        pass


def _sweep_stale_temps(folder: Path) -> None:
    """Remove the temp files (`.layer-*.<pid>.tmp`, of layers and records) of writers that are gone: called
    holding the folder's lock, so a killed writer's files of every layer go, not only the layer now written."""
    for stale in folder.glob(".layer-*.tmp"):
        pid = stale.name.rsplit(".", 2)[-2]
        if not pid.isdigit() or int(pid) <= 0:
            continue
        if int(pid) != os.getpid():
            try:
                os.kill(int(pid), 0)
                continue  # alive
            except ProcessLookupError:
                pass
            except OSError:
                continue  # alive, another user's
        _remove(stale)


@contextmanager
def _locked(f, what: str) -> Iterator[None]:
    """An exclusive advisory lock on the open file `f` (released by the OS if the holder dies), closed after.
    The holder writes its pid there, so a process that has to wait says whom it waits for."""
    with f:
        try:
            fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            try:
                f.seek(0)
                holder = f.read().strip()
            except OSError:
                holder = ""
            logger.info("feature cache: waiting for %s, held by %s (computing layers there), before reading or "
                        "computing %s", f.name, f"pid {holder}" if holder.isdigit() else "another process", what)
            fcntl.flock(f, fcntl.LOCK_EX)
        try:  # unbuffered: a full disk fails here, not again when `f` is closed
            os.ftruncate(f.fileno(), 0)
            os.write(f.fileno(), f"{os.getpid()}\n".encode())
        except OSError:
            pass  # only a hint for a waiter
        try:
            yield
        finally:
            try:
                os.ftruncate(f.fileno(), 0)
            except OSError:
                pass
            fcntl.flock(f, fcntl.LOCK_UN)
