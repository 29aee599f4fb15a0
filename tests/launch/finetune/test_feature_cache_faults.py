"""The feature cache's faults: a full disk names the cache file and leaves none of our temp files, a read-only
--feature-cache is one line (and still serves what it holds), a killed writer's temp files of any layer are
swept, and waiting for another trial's lock says so. Real: tmpfs mounts (the `tmpfs` fixture), a read-only
remount (a read-only chmod folder where not root), a second writer holding the lock.
"""

from __future__ import annotations

import logging
import os
import subprocess
import threading

import pytest
import torch

from launch.errors import WriteDidNotFit
from launch.finetune.examples import DataError
from launch.finetune.feature_cache import FeatureCache, SplitKey
from pipeline.atomic_write import write_bytes_atomic

KEY = SplitKey("ckpt", "data", "conll2003", "train", 32, "cpu-fp32")


def layer(tokens: int, hidden: int, k: int = 0) -> torch.Tensor:
    return torch.full((tokens, hidden), float(k + 1))


def our_temp_files(root) -> list[str]:
    return sorted(p.name for p in root.rglob("*") if p.name.endswith(".tmp"))


def test_a_full_disk_while_writing_a_layer_names_the_cache_file_and_leaves_no_temp_file(tmpfs):
    # safetensors' error says "os error 28" and no file: the CLI named --out (which may not even exist).
    disk = tmpfs(64 * 1024)
    cache = FeatureCache(disk)
    with pytest.raises(WriteDidNotFit) as caught:
        cache.layers(KEY, [0], 100, 512, lambda missing: {k: layer(100, 512, k) for k in missing})  # 100 KB
    folder = disk / KEY.digest
    assert str(caught.value).startswith(f"no space left on device while writing {folder / 'layer-0.safetensors'};")
    assert our_temp_files(disk) == [] and not (folder / "layer-0.safetensors").exists()
    tmpfs.resize(disk, 1 << 20)  # freed: the same call works
    out = FeatureCache(disk).layers(KEY, [0], 100, 512, lambda missing: {k: layer(100, 512, k) for k in missing})
    assert torch.equal(out[:, 0], layer(100, 512).half()) and our_temp_files(disk) == []


def test_a_full_disk_while_writing_a_layers_record_names_the_record_and_leaves_no_temp_file(tmpfs):
    disk = tmpfs(256 * 1024)

    def compute_then_fill_the_disk(missing):
        # Leave one page: the layer (2.6 KB) fits, its record (the next file) does not.
        st = os.statvfs(disk)
        (disk / "filler").write_bytes(b"x" * (st.f_bavail * st.f_frsize - st.f_frsize))
        return {k: layer(20, 64, k) for k in missing}

    with pytest.raises(WriteDidNotFit) as caught:
        FeatureCache(disk).layers(KEY, [0], 20, 64, compute_then_fill_the_disk)
    folder = disk / KEY.digest
    assert str(caught.value).startswith(f"no space left on device while writing {folder / 'layer-0.json'};")
    assert our_temp_files(disk) == []  # `.layer-0.json.<pid>.tmp` was left, 0 bytes, and never swept
    assert not (folder / "layer-0.safetensors").exists()  # a layer without its record does not exist


def test_an_atomic_write_whose_rename_fails_removes_its_temp_file(tmp_path):
    target = tmp_path / "record.json"
    target.mkdir()
    (target / "inside").write_text("x")  # a non-empty folder cannot be replaced by a file
    with pytest.raises(OSError):
        write_bytes_atomic(target, b"{}")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["record.json"]


@pytest.fixture
def read_only_cache(request, tmp_path):
    """(folder, freeze): a cache folder and what makes it read-only (a remount as root, a chmod elsewhere)."""
    if os.getuid() == 0:  # root writes through a chmod
        disk = request.getfixturevalue("tmpfs")(1 << 20)
        return disk, lambda: subprocess.run(["mount", "-o", "remount,ro", str(disk)], check=True)
    folder = tmp_path / "cache"
    folder.mkdir()

    def freeze() -> None:
        for path in [*folder.rglob("*"), folder]:
            path.chmod(0o555 if path.is_dir() else 0o444)
        request.addfinalizer(lambda: [p.chmod(0o755) for p in [folder, *folder.rglob("*")] if p.is_dir()])

    return folder, freeze


def test_a_read_only_cache_serves_what_it_holds_and_says_in_one_line_what_it_lacks(read_only_cache):
    folder, freeze = read_only_cache
    FeatureCache(folder).layers(KEY, [0], 10, 8, lambda missing: {k: layer(10, 8, k) for k in missing})
    freeze()
    cache = FeatureCache(folder)
    out = cache.layers(KEY, [0], 10, 8, lambda missing: pytest.fail(f"encoder run for {missing}"))
    assert torch.equal(out[:, 0], layer(10, 8).half()) and cache.stats.hits == 1

    with pytest.raises(DataError) as caught:  # the lock's open: a 34-line OSError traceback
        cache.layers(KEY, [0, 1, 2], 10, 8, lambda missing: {k: layer(10, 8, k) for k in missing})
    message = str(caught.value)
    assert message.startswith(f"--feature-cache {folder} is not writable (") and "\n" not in message
    assert message.endswith(") and layers 1, 2 of conll2003/train are not cached there; pass a writable --feature-cache")

    dev = SplitKey("ckpt", "data", "conll2003", "dev", 32, "cpu-fp32")
    with pytest.raises(DataError, match=r"and layer 0 of conll2003/dev is not cached there; pass a writable"):
        cache.layers(dev, [0], 10, 8, lambda missing: {k: layer(10, 8, k) for k in missing})  # its folder's mkdir


def test_a_killed_writers_temp_files_of_every_layer_are_swept_and_a_live_ones_kept(tmp_path):
    dead = subprocess.Popen(["true"])
    dead.wait()
    alive = subprocess.Popen(["sleep", "60"])
    try:
        folder = tmp_path / KEY.digest
        folder.mkdir()
        stale = [f".layer-3.json.{dead.pid}.tmp", f".layer-5.safetensors.{dead.pid}.tmp"]
        live = f".layer-4.safetensors.{alive.pid}.tmp"
        for name in [*stale, live]:
            (folder / name).write_bytes(b"")
        FeatureCache(tmp_path).layers(KEY, [0], 10, 8, lambda missing: {k: layer(10, 8, k) for k in missing})
        assert our_temp_files(tmp_path) == [live]
    finally:
        alive.kill()
        alive.wait()


def test_waiting_for_another_trials_lock_says_whom_it_waits_for(tmp_path, caplog):
    caplog.set_level(logging.INFO, logger="launch.finetune.feature_cache")
    computing, release = threading.Event(), threading.Event()

    def slow_compute(missing):  # the other trial, holding the lock while its encoder runs
        computing.set()
        release.wait(10)
        return {k: layer(10, 8, k) for k in missing}

    other = threading.Thread(target=FeatureCache(tmp_path).layers, args=(KEY, [0], 10, 8, slow_compute))
    other.start()
    try:
        assert computing.wait(10)
        threading.Timer(0.5, release.set).start()
        cache = FeatureCache(tmp_path)
        out = cache.layers(KEY, [0], 10, 8, lambda missing: pytest.fail(f"computed twice: {missing}"))
    finally:
        release.set()
        other.join(10)
    assert torch.equal(out[:, 0], layer(10, 8).half()) and cache.stats.hits == 1
    lock = tmp_path / KEY.digest / ".lock"
    waits = [r.getMessage() for r in caplog.records if str(lock) in r.getMessage()]
    assert len(waits) == 1 and f"held by pid {os.getpid()}" in waits[0] and "layers [0] of conll2003/train" in waits[0]
