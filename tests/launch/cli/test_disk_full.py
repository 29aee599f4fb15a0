"""A full disk is one line naming the path, and nothing is lost: real small tmpfs mounts (issue 11).

Each test mounts a tmpfs of a few MB (the `tmpfs` fixture in tests/conftest.py: needs root, as CI and
the dev machines run; elsewhere the tests skip with that reason) so that the command's output cannot fit, checks the one-line message, then
grows the mount (`remount,size=`) and checks that the same command continues.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from built_once import built_once
from repo_paths import DATA, VOCAB

BERTPIPE = Path(sys.executable).with_name("bertpipe")
ENV = dict(os.environ, OMP_NUM_THREADS="1")


def _run(argv: list[str]) -> subprocess.CompletedProcess:
    return subprocess.run([str(BERTPIPE), *argv], capture_output=True, text=True, env=ENV, timeout=600)


def _one_error_line(done: subprocess.CompletedProcess, command: str, path: Path) -> str:
    # Log lines and progress bars of the work done before the disk filled are not part of the error.
    noise = (" INFO ", "[WARNING]", "[INFO]", " WARNING ", "it/s]")
    lines = [line for line in done.stderr.splitlines() if line.strip() and not any(n in line for n in noise)]
    assert len(lines) == 1, done.stderr[-3000:]
    assert "no space left on device while writing" in lines[0] and str(path) in lines[0], lines[0]
    assert "Traceback" not in done.stderr
    return lines[0]


def test_corpus_on_a_full_disk_says_so_and_a_rerun_after_freeing_space_works(tmpfs):
    disk = tmpfs(256 * 1024)
    out = disk / "corpus"
    argv = ["corpus", "--input", str(DATA / "books" / "persuasion.txt"), "--vocab", str(VOCAB), "--out", str(out),
            "--seq-len", "64", "--dupe-factor", "1", "--num-shards", "1"]
    done = _run(argv)
    assert done.returncode == 1
    line = _one_error_line(done, "corpus", disk)
    assert line.startswith("bertpipe corpus: error:")
    assert not (out / "manifest.json").exists()
    tmpfs.resize(disk, 64 * 1024 * 1024)
    assert _run(argv).returncode == 0
    assert json.loads((out / "manifest.json").read_text())["num_instances"] > 0


@pytest.fixture(scope="module")
def reference_run(tmp_path_factory, small_corpus):
    """4 uninterrupted steps on 1 process, a checkpoint at 2 and 4: the losses a resume must give."""
    def build(out: Path) -> None:
        done = _run(["pretrain", "--config", "tiny", "--data", str(small_corpus), "--out", str(out), "--nproc", "1",
                     "--max-steps", "4", "--save-every", "2", "--log.eval-every", "0", "--log.tensorboard", "false"])
        assert done.returncode == 0, done.stderr[-3000:]

    return built_once(tmp_path_factory, "disk_full_reference_run", build)


def _losses(run: Path) -> dict[int, float]:
    records = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines() if line.strip()]
    return {r["step"]: r["loss"] for r in records}


def _du(path: Path) -> int:
    return sum(f.stat().st_size for f in path.rglob("*") if f.is_file())


@pytest.mark.slow
def test_pretrain_on_a_full_disk_keeps_the_last_checkpoint_and_resumes_exactly(tmpfs, reference_run, small_corpus):
    checkpoint_bytes = _du(reference_run / "checkpoints" / "global_step2")
    # Room for the run's small files and one checkpoint, not for the second.
    disk = tmpfs(int(checkpoint_bytes * 1.5) + 2 * 1024 * 1024)
    out = disk / "run"
    argv = ["pretrain", "--config", "tiny", "--data", str(small_corpus), "--out", str(out), "--nproc", "1",
            "--max-steps", "4", "--save-every", "2", "--log.eval-every", "0", "--log.tensorboard", "false"]
    done = _run(argv)
    assert done.returncode != 0
    line = _one_error_line(done, "pretrain", disk)
    assert "--resume" in line
    assert (out / "checkpoints" / "latest").read_text().strip() == "global_step2"
    assert list((out / "checkpoints").glob(".staging-*"))  # the save cut short holds the disk

    tmpfs.resize(disk, 8 * checkpoint_bytes + 16 * 1024 * 1024)
    done = _run([*argv, "--resume"])
    assert done.returncode == 0, done.stderr[-3000:]
    assert "removed the unfinished save(s)" in done.stderr  # first thing: its space is the resume's
    ours, reference = _losses(out), _losses(reference_run)
    assert ours == reference, "after freeing space, --resume must give the uninterrupted run's losses"


def test_export_on_a_full_disk_says_so(tmpfs, reference_run):
    disk = tmpfs(512 * 1024)
    done = _run(["export", str(reference_run), "--out", str(disk / "hf")])
    assert done.returncode != 0
    _one_error_line(done, "export", disk)


def test_export_into_an_empty_mount_point(tmpfs, reference_run):
    """A mount point cannot be renamed over, and the export is built beside --out, on its parent's disk: it
    failed with "Device or resource busy", then "Invalid cross-device link". It is filled file by file."""
    from launch.export_dirs import EXPORT_MARKER, is_export_of

    disk = tmpfs(64 * 1024 * 1024)
    for _ in range(2):  # the second replaces the first's files (its own export)
        done = _run(["export", str(reference_run), "--out", str(disk)])
        assert done.returncode == 0, done.stderr[-3000:]
        assert is_export_of(disk, reference_run) and (disk / "model.safetensors").is_file()
        marker = json.loads((disk / EXPORT_MARKER).read_text())
        assert sorted(p.name for p in disk.iterdir()) == sorted(marker["files"])  # no partial file left
        assert not [p for p in disk.parent.iterdir() if "bertpipe-partial" in p.name]


def test_a_read_only_out_is_one_line_naming_it_not_a_traceback(tmpfs, reference_run, tmp_path):
    # A read-only mount (or a folder the user may not write) failed with Python's traceback; and where the
    # mount had no free blocks (/sys) the message blamed a full disk. Export and features lock their --out
    # with a file beside it (it is renamed into place when whole): that failed with a traceback too.
    disk = tmpfs(1 << 20)
    subprocess.run(["mount", "-o", "remount,ro", str(disk)], check=True)
    texts = tmp_path / "texts.txt"
    texts.write_text("the cat sat on the mat\n", encoding="utf-8")
    runs = {"corpus": ["corpus", "--input", str(DATA / "books" / "persuasion.txt"), "--vocab", str(VOCAB)],
            "finetune": ["finetune", "--task", "sst2", "--data-dir", str(DATA / "glue"), "--checkpoint", "x"],
            "export": ["export", str(reference_run)],
            "features": ["features", "--checkpoint", str(reference_run), "--input", str(texts), "--pool", "mean"]}
    for command, argv in runs.items():
        # Export's --out may be the mount itself: it is filled file by file (its parent is another disk).
        # Features' --out names files (OUT.npy ...), never a directory.
        for out in (disk / "out", disk) if command != "features" else (disk / "out",):
            done = _run([*argv, "--out", str(out)])
            assert done.returncode == 2 and "Traceback" not in done.stderr, done.stderr[-3000:]
            last = done.stderr.strip().splitlines()[-1]
            assert last.startswith(f"bertpipe {command}: error: cannot write --out {out}: Read-only file system: "), last
            assert last.endswith("; choose another --out or make it writable"), last
            if command in ("corpus", "finetune"):
                assert last.split(": ")[-1] == f"{out / '.bertpipe.lock' if out == disk else out}; choose another " \
                                               "--out or make it writable"


def test_a_link_into_a_read_only_folder_is_one_line_naming_the_lock(tmpfs, reference_run, tmp_path):
    # An export's lock is beside the folder its --out leads to (one lock for every spelling of it): through a
    # link, that is where the link leads, which may be read-only where the link's own folder is not.
    disk = tmpfs(1 << 20)
    (disk / "ea").mkdir()
    subprocess.run(["mount", "-o", "remount,ro", str(disk)], check=True)
    link = tmp_path / "ealink"
    link.symlink_to(disk / "ea")
    done = _run(["export", str(reference_run), "--out", str(link)])
    assert done.returncode == 2 and "Traceback" not in done.stderr, done.stderr[-3000:]
    assert done.stderr.strip().splitlines()[-1] == (
        f"bertpipe export: error: cannot write --out {link}: Read-only file system: {disk / '.ea.bertpipe.lock'}; "
        "choose another --out or make it writable")
    assert link.is_symlink() and not [p for p in tmp_path.iterdir() if p.name.startswith(".ealink")]


def test_each_write_limit_is_one_line_naming_the_file_written():
    import errno

    from launch.errors import disk_full_message

    for code, said in ((errno.ENOSPC, "no space left on device"), (errno.EDQUOT, "disk quota exceeded"),
                       (errno.EFBIG, "file too large")):
        # shutil.copyfile names its source first: the message named the input, maybe on another disk.
        err = OSError(code, os.strerror(code), "/checkpoint/vocab.txt", None, "/out/model/vocab.txt")
        assert disk_full_message(err, "/out") == disk_full_message(err, "/elsewhere")
        assert disk_full_message(err, "/out").startswith(f"{said} while writing /out/model/vocab.txt")
    # safetensors (Rust) and Beam pass the C library's words on as text.
    rust = RuntimeError("Error while serializing: I/O error: Disk quota exceeded (os error 122)")
    assert disk_full_message(rust, "/out").startswith("disk quota exceeded while writing /out;")
    beam = RuntimeError("OSError: [Errno 27] File too large [while running 'Shards/WriteShard']")
    assert disk_full_message(beam, "/out").startswith("file too large while writing /out:")
    # torch's stream never says why; with space left it is one line that names what else to check.
    torch_save = RuntimeError("[enforce fail at inline_container.cc:672] . unexpected pos 1075328 vs 1075216")
    assert "with space left on its disk: a quota or a file-size limit" in disk_full_message(torch_save, "/tmp")
    assert disk_full_message(PermissionError(errno.EACCES, "Permission denied", "/out"), "/out") is None
    assert disk_full_message(ValueError("not a write"), "/out") is None


def test_a_write_limit_that_names_no_file_names_the_file_written_last_under_out(tmp_path):
    """Path.write_text and safetensors fail without a filename: the message named only --out."""
    import errno

    from launch.errors import disk_full_message

    (tmp_path / "predictions").mkdir()
    (tmp_path / "config.yaml").write_text("task: sst2\n")
    os.utime(tmp_path / "config.yaml", (1, 1))
    (tmp_path / "predictions" / "dev.tsv").write_text("guid\tprediction\n")  # cut short by the limit
    err = OSError(errno.EFBIG, "File too large")
    assert disk_full_message(err, str(tmp_path)).startswith(
        f"file too large while writing {tmp_path} (the file written last there: {tmp_path / 'predictions' / 'dev.tsv'}):")
    # Nothing there written by this process (an export's partial folder is gone, the earlier export's files are
    # left): the folder alone, not a file of another run.
    os.utime(tmp_path / "predictions" / "dev.tsv", (1, 1))
    assert disk_full_message(err, str(tmp_path)).startswith(f"file too large while writing {tmp_path}: past")


@pytest.mark.parametrize("command", ["export", "pretrain", "corpus"])
def test_a_file_size_limit_is_one_line_not_a_traceback(reference_run, small_corpus, tmp_path, command):
    """`ulimit -f` (or a FAT32 disk's 4 GiB) fails a write with EFBIG, which gave tracebacks."""
    import resource

    limit = 256 * 1024
    argv = {"export": ["export", str(reference_run), "--out", str(tmp_path / "hf")],
            "pretrain": ["pretrain", "--config", "tiny", "--data", str(small_corpus), "--out", str(tmp_path / "run"),
                         "--nproc", "1", "--max-steps", "2", "--save-every", "2", "--log.tensorboard", "false"],
            "corpus": ["corpus", "--input", str(DATA / "books"), "--vocab", str(VOCAB), "--out", str(tmp_path / "c"),
                       "--seq-len", "64", "--dupe-factor", "1", "--num-shards", "1"]}[command]
    done = subprocess.run([str(BERTPIPE), *argv], capture_output=True, text=True, env=ENV, timeout=600,
                          preexec_fn=lambda: resource.setrlimit(resource.RLIMIT_FSIZE, (limit, limit)))
    assert done.returncode == 1 and "Traceback" not in done.stderr, done.stderr[-3000:]
    line = done.stderr.strip().splitlines()[-1]
    assert line.startswith(f"bertpipe {command}: error: "), line
    assert ("file too large while writing" in line or "a quota or a file-size limit (`ulimit -f`)" in line), line


@pytest.mark.parametrize("pool", ["mean", "none"])
def test_features_on_a_full_disk_names_its_output_file(tmpfs, tiny_checkpoint, tmp_path, pool):
    # numpy's short write has no errno, and the partial file was deleted before the disk was asked: a
    # traceback. The Parquet one named the --out stem.
    texts = tmp_path / "texts.txt"
    texts.write_text("".join(line.split("\t")[0] + "\n" for line in
                             (DATA / "glue" / "SST-2" / "train.tsv").read_text().splitlines()[1:3001]))
    disk = tmpfs(256 * 1024)
    done = _run(["features", "--checkpoint", str(tiny_checkpoint), "--input", str(texts), "--out", str(disk / "f"),
                 "--pool", pool, "--device", "cpu"])
    assert done.returncode == 1
    _one_error_line(done, "features", disk / ("f.npy" if pool == "mean" else "f.parquet"))
    assert not [p for p in disk.iterdir() if p.suffix in (".npy", ".parquet", ".partial")]


def test_an_out_that_cannot_be_made_is_one_line_naming_it(tmp_path):
    # A name too long for the file system, or a folder under /proc: Python's traceback, exit 1.
    runs = {"corpus": ["corpus", "--input", str(DATA / "books" / "persuasion.txt"), "--vocab", str(VOCAB)],
            "finetune": ["finetune", "--task", "sst2", "--data-dir", str(DATA / "glue"), "--checkpoint", "x"]}
    for command, argv in runs.items():
        for out, said in ((tmp_path / ("a" * 300), "File name too long"), (Path("/proc/bertpipe/out"),
                                                                             "No such file or directory")):
            done = _run([*argv, "--out", str(out)])
            assert done.returncode == 2 and "Traceback" not in done.stderr, done.stderr[-3000:]
            last = done.stderr.strip().splitlines()[-1]
            assert last.startswith(f"bertpipe {command}: error: cannot create --out {out}: {said}"), last
