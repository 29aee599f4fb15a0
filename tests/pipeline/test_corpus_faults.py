"""Faults around the corpus job's own files: a job that fails, is stopped or fills the disk leaves --out
recognisably ours (the rerun of the same command clears it); a failed write names its file; a damaged
manifest is said to be one; a --vocab that is no vocabulary file (a pipe, a device, 1 GB, a .bz2) is
refused before any work, without reading it whole."""

from __future__ import annotations

import bz2
import errno
import json
import os
import re
import threading

import pytest
from apache_beam.io.filesystems import FileSystems

from launch import cli
from pipeline.corpus_job import CorpusConfig, run
from repo_paths import BOOKS, VOCAB

SMALL = ["--seq-len", "64", "--dupe-factor", "1", "--progress-seconds", "0"]


@pytest.fixture(scope="module")
def book(tmp_path_factory):
    path = tmp_path_factory.mktemp("text") / "book.txt"
    path.write_text(BOOKS[0].read_text(encoding="utf-8")[20_000:60_000], encoding="utf-8")
    return path


def _argv(book, out, *more: str) -> list[str]:
    return ["corpus", "--input", str(book), "--vocab", str(VOCAB), "--out", str(out), *SMALL, *more]


def _error(argv, capsys, code: int = 2) -> str:
    """The command's one error line (its log lines of the work done before are not part of it)."""
    with pytest.raises(SystemExit) as stop:
        cli.main(argv)
    assert stop.value.code == code
    err = capsys.readouterr().err
    lines = [line for line in err.splitlines() if line.startswith("bertpipe corpus: error:")]
    assert len(lines) == 1 and "Traceback" not in err, err[-3000:]
    return lines[0]


class _FullDisk:
    """A file open for writing on a disk that is full: every write fails as the OS fails it (no file named)."""

    def __init__(self, f) -> None:
        self.f = f

    def write(self, data: bytes) -> int:
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    def close(self) -> None:
        self.f.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def _disk_full_for(monkeypatch, name_part: str) -> None:
    """Writes of files whose path holds `name_part` fail with ENOSPC, in the job's workers too (in-process)."""
    real = FileSystems.create

    def create(path, *args, **kwargs):
        f = real(path, *args, **kwargs)
        return _FullDisk(f) if name_part in path else f

    monkeypatch.setattr(FileSystems, "create", staticmethod(create))


# --- a stopped, failed or disk-full job: the rerun clears its files as ours -------------------------------

def test_a_full_disk_names_the_shard_and_the_rerun_after_freeing_space_finishes(tmpfs, capsys):
    # Without --progress-seconds nothing had made .bertpipe-tmp before the dead letters and the shard: the
    # rerun refused them ("dead_letter, which `bertpipe corpus` did not write"), although the message said
    # "free some space, then run the same command again". And it named a progress file, not the shard.
    disk = tmpfs(300 * 1024)
    out = disk / "corpus"
    argv = _argv(BOOKS[1], out, "--num-shards", "1")  # a whole book: its shard is larger than the disk
    line = _error(argv, capsys, code=1)
    assert re.fullmatch(rf"bertpipe corpus: error: no space left on device while writing "
                        rf"{re.escape(str(out))}/(train|heldout)-\d{{5}}-of-\d{{5}}\.arrow; free some space, "
                        "then run the same command again", line), line
    assert not (out / "manifest.json").exists()
    tmpfs.resize(disk, 64 << 20)
    assert cli.main(argv) == 0
    assert json.loads((out / "manifest.json").read_text())["num_instances"] > 0
    assert not (out / ".bertpipe-tmp").exists()


@pytest.mark.parametrize("failing, path", [("train-", "train-00000-of-00001.arrow"),
                                           ("dead_letter-", "dead_letter/dead_letter-00000-of-00001.jsonl")])
def test_a_failed_write_names_its_file_and_leaves_out_ours_to_the_rerun(tmp_path, book, capsys, monkeypatch,
                                                                        failing, path):
    out = tmp_path / "corpus"
    (tmp_path / "empty.txt").touch()  # a dead letter to write (`empty_file`)
    argv = _argv(book, out, "--num-shards", "1", "--heldout-fraction", "0")
    argv[argv.index(str(book)) + 1:argv.index(str(book)) + 1] = [str(tmp_path / "empty.txt")]
    assert cli.main(argv) == 0  # a finished corpus first: the rerun deletes it, then fails
    _disk_full_for(monkeypatch, failing)
    line = _error(argv, capsys, code=1)
    assert line == (f"bertpipe corpus: error: no space left on device while writing {out / path}; free some space, "
                    "then run the same command again")
    assert (out / path).exists() and not (out / "manifest.json").exists()
    monkeypatch.undo()
    assert cli.main(argv) == 0, capsys.readouterr().err
    assert (out / "manifest.json").is_file() and not (out / ".bertpipe-tmp").exists()


def test_a_job_that_failed_on_an_object_store_leaves_out_ours_to_the_rerun(store, book, monkeypatch):
    # An object store has no folders: only an object under .bertpipe-tmp/ makes the unfinished job's files ours.
    (store / "in").mkdir()
    (store / "in" / "a.txt").write_text(book.read_text(encoding="utf-8"), encoding="utf-8")
    config = dict(inputs=["objstore://in/a.txt"], out="objstore://b/corpus", vocab=str(VOCAB), seq_len=64,
                  dupe_factor=1, num_shards=1, heldout_fraction=0, progress_seconds=0)
    _disk_full_for(monkeypatch, "train-")
    with pytest.raises(Exception, match="No space left on device"):
        run(CorpusConfig(**config))
    assert (store / "b" / "corpus" / "train-00000-of-00001.arrow").exists()
    monkeypatch.undo()
    assert run(CorpusConfig(**config)).manifest["num_instances"] > 0
    assert not [p for p in (store / "b" / "corpus").rglob("*") if ".bertpipe-tmp" in str(p) and p.is_file()]


def test_a_file_named_like_the_temp_folder_does_not_make_a_users_folder_ours(tmp_path, book, capsys):
    out = tmp_path / "mine"
    out.mkdir()
    (out / ".bertpipe-tmp").write_text("a note of mine")
    (out / "vocab.txt").write_text("my words\n")
    line = _error(_argv(book, out), capsys)
    assert "which `bertpipe corpus` did not write" in line
    assert sorted(p.name for p in out.iterdir()) == [".bertpipe-tmp", "vocab.txt"]


# --- a damaged manifest ---------------------------------------------------------------------------------

def test_a_damaged_manifest_is_named_as_such_and_nothing_is_deleted(tmp_path, book, capsys):
    out = tmp_path / "corpus"
    assert cli.main(_argv(book, out)) == 0
    manifest = out / "manifest.json"
    manifest.write_bytes(manifest.read_bytes()[:300])  # cut short: it no longer proves the folder ours
    before = sorted(p.name for p in out.iterdir())
    line = _error(_argv(book, out), capsys)
    assert line.startswith(f"bertpipe corpus: error: --out {out} holds a manifest.json that cannot be read "
                           "(JSONDecodeError: "), line
    assert line.endswith(f"if it is a corpus bertpipe wrote, delete {out} and run the same command again; else "
                         "choose another --out"), line
    assert sorted(p.name for p in out.iterdir()) == before


# --- --vocab that is no vocabulary file -----------------------------------------------------------------

def _refused_before_any_work(book, vocab, tmp_path, capsys) -> str:
    out = tmp_path / "never"
    line = _error(["corpus", "--input", str(book), "--vocab", str(vocab), "--out", str(out)], capsys)
    assert not out.exists()
    return line


def test_a_named_pipe_or_a_device_as_vocab_is_refused_not_read(tmp_path, book, capsys):
    fifo = tmp_path / "vocab.fifo"
    os.mkfifo(fifo)
    stop = threading.Event()

    def writer_comes_and_goes():  # so that a read of the pipe (the bug: blocked forever) ends in this test
        while not stop.wait(0.2):
            try:
                os.close(os.open(fifo, os.O_WRONLY | os.O_NONBLOCK))  # ENXIO while nobody reads
            except OSError:
                continue

    thread = threading.Thread(target=writer_comes_and_goes, daemon=True)
    thread.start()
    try:
        line = _refused_before_any_work(book, fifo, tmp_path, capsys)
    finally:
        stop.set()
        thread.join()
    assert line == (f"bertpipe corpus: error: --vocab {fifo} is not a regular file (a named pipe, socket or device); "
                    "write the vocabulary to a file and pass that")
    # /dev/zero grew until the kernel killed the command; /dev/null (as safe to try on the old code) is a device too
    assert "--vocab /dev/null is not a regular file" in _refused_before_any_work(book, "/dev/null", tmp_path, capsys)


def test_a_vocab_too_large_to_be_one_is_refused_by_its_size(tmp_path, book, capsys):
    # 1 GB was read whole (2.3 GB peak, 1:47) before "lacks [PAD]"; a sparse file just over the cap stands for it.
    huge = tmp_path / "huge.txt"
    with open(huge, "wb") as f:
        f.truncate((64 << 20) + 1)
    assert _refused_before_any_work(book, huge, tmp_path, capsys) == (
        f"bertpipe corpus: error: --vocab {huge} is 67,108,865 bytes, too large for a vocabulary (at most 64 MB; "
        "BERT's vocab.txt is 0.2 MB): pass the vocab.txt itself")


def test_a_vocab_of_unknown_size_is_read_no_further_than_the_cap(tmp_path, book, capsys, monkeypatch):
    from pipeline import corpus_job

    monkeypatch.setattr(corpus_job, "_vocab_size", lambda path: None)  # as a remote file system may say
    monkeypatch.setattr(corpus_job, "VOCAB_MAX_BYTES", 1 << 20)
    # A vocabulary whose size was not told is read (it was refused as "over 1,048,576 bytes" unread) ...
    assert corpus_job._read_vocab_file(str(VOCAB)) == VOCAB.read_text(encoding="utf-8")
    big = tmp_path / "big.txt"
    big.write_bytes(VOCAB.read_bytes() * 5)  # 1.1 MB of real vocabulary lines
    read = []
    real_open = corpus_job.FileSystems.open

    def counting_open(path, *args, **kwargs):
        f = real_open(path, *args, **kwargs)
        real_read = f.read
        f.read = lambda n=-1: read.append(n) or real_read(n)
        return f

    monkeypatch.setattr(corpus_job.FileSystems, "open", staticmethod(counting_open))
    # ... and a file past the cap is refused having read no more than one byte past it.
    assert "is over 1,048,576 bytes, too large for a vocabulary" in _refused_before_any_work(book, big, tmp_path, capsys)
    assert read == [(1 << 20) + 1]


def test_a_compressed_vocab_is_read_by_its_name_and_refused_under_a_plain_one(tmp_path, book, capsys):
    from pipeline import corpus_job

    packed = tmp_path / "vocab.txt.bz2"
    packed.write_bytes(bz2.compress(VOCAB.read_bytes()))
    assert corpus_job._read_vocab_file(str(packed)) == VOCAB.read_text(encoding="utf-8")
    plain = tmp_path / "vocab.txt"
    plain.write_bytes(packed.read_bytes())
    assert _refused_before_any_work(book, plain, tmp_path, capsys) == (
        f"bertpipe corpus: error: vocab {plain} is bzip2-compressed under a name that does not say so; decompress it, "
        "or name it for its compression (vocab.txt.gz)")


def test_a_record_file_that_does_not_fit_names_itself(tmp_path, monkeypatch):
    # The workers' small records (word counts, shard infos) went through a bare write: a full disk there was
    # reported on whichever file in --out was newest.
    import errno

    from apache_beam.io.filesystems import FileSystems

    from pipeline import record_files
    from pipeline.named_writes import WriteFailed

    class Full:
        def write(self, data):
            raise OSError(errno.ENOSPC, "No space left on device")

        def close(self):
            pass

    monkeypatch.setattr(FileSystems, "create", staticmethod(lambda path, *a, **k: Full()))
    fn = record_files._LinesToFile(str(tmp_path), "counts")
    fn.start_bundle()
    with pytest.raises(WriteFailed) as caught:
        fn.process('{"word": 1}')
    assert str(caught.value) == f"[Errno {errno.ENOSPC}] {fn.path}: No space left on device"
    assert fn.path.startswith(str(tmp_path / "counts-"))
