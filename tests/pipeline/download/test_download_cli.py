"""`bertpipe download wikipedia|books` end to end against a local mirror in the real layouts."""

from __future__ import annotations

import bz2
import hashlib
import json
from pathlib import Path

import pytest

from launch import cli
from repo_paths import DATA

FAST = ["--retries", "3", "--backoff", "0.01", "--timeout", "10", "--no-progress"]


def _run(argv: list[str], capsys) -> tuple[int, str, str]:
    try:
        rc = cli.main(argv)
    except SystemExit as exit_:
        rc = exit_.code
    out = capsys.readouterr()
    return rc, out.out, out.err


def corpus_inputs(directory: Path) -> list[str]:
    """The files `bertpipe corpus --input DIR` reads, by the corpus stage's documented rule: recursive,
    skipping hidden files, *.json, *.part, *.partial and *.sha1/*.md5 lists."""
    skip = (".json", ".part", ".partial", ".sha1", ".md5")
    return sorted(
        str(p.relative_to(directory)) for p in directory.rglob("*")
        if p.is_file() and not any(part.startswith(".") for part in p.relative_to(directory).parts)
        and not p.name.endswith(skip)
    )


def test_wikipedia_latest_parts_download_verifies_and_records(mirror, dump_names, tmp_path: Path, capsys) -> None:
    out = tmp_path / "raw"
    rc, stdout, err = _run(["download", "wikipedia", "--lang", "en", "--date", "latest", "--out", str(out),
                            "--mirror", mirror.url, "--jobs", "2", *FAST], capsys)
    assert rc == 0, err
    assert f"enwiki {dump_names['date']}: 2 file(s)" in stdout
    # `latest` skipped the newer, unfinished 20260120 dump.
    assert mirror.requests_for("/enwiki/20260120/dumpstatus.json")
    for name in dump_names["parts"]:
        assert (out / name).read_bytes() == mirror.files[f"/enwiki/{dump_names['date']}/{name}"]
    manifest = json.loads((out / "download.json").read_text())
    assert manifest["format"] == "bertpipe-download" and manifest["format_version"] == 1
    source = manifest["sources"][f"wikipedia/enwiki-{dump_names['date']}/parts"]
    assert source["date"] == dump_names["date"] and source["job"] == "articlesdump" and source["layout"] == "parts"
    assert source["checksum_list"].endswith(f"enwiki-{dump_names['date']}-sha1sums.txt")
    for name in dump_names["parts"]:
        entry, data = manifest["files"][name], mirror.files[f"/enwiki/{dump_names['date']}/{name}"]
        assert entry["size"] == len(data) and entry["sha1"] == hashlib.sha1(data).hexdigest()
        assert entry["url"] == f"{mirror.url}/enwiki/{dump_names['date']}/{name}"
    # Every page of the real sample is in exactly one part.
    pages = sum(bz2.decompress((out / n).read_bytes()).count(b"<page>") for n in dump_names["parts"])
    assert pages == bz2.decompress((DATA / "wiki").glob("*.bz2").__next__().read_bytes()).count(b"<page>")
    assert corpus_inputs(out) == sorted(dump_names["parts"])
    # Rerun: nothing is fetched again.
    before = len(mirror.log)
    assert _run(["download", "wikipedia", "--date", dump_names["date"], "--out", str(out), "--mirror", mirror.url, *FAST], capsys)[0] == 0
    fetched_again = [r for r in mirror.log[before:] if r.path.endswith(".bz2")]
    assert fetched_again == []


def test_wikipedia_multistream_layout_skips_the_index(mirror, dump_names, tmp_path: Path, capsys) -> None:
    out = tmp_path / "raw"
    rc, _, err = _run(["download", "wikipedia", "--date", dump_names["date"], "--layout", "multistream",
                       "--out", str(out), "--mirror", mirror.url, *FAST], capsys)
    assert rc == 0, err
    assert corpus_inputs(out) == [dump_names["multistream"]]
    assert not any(r.path.endswith(dump_names["index"]) for r in mirror.log)


def test_wikipedia_mirror_without_sha1_list_or_status_file(mirror, dump_names, tmp_path: Path, capsys) -> None:
    base = f"/enwiki/{dump_names['date']}/"
    del mirror.files[base + f"enwiki-{dump_names['date']}-sha1sums.txt"]
    out = tmp_path / "md5"
    rc, _, err = _run(["download", "wikipedia", "--date", dump_names["date"], "--out", str(out), "--mirror", mirror.url, *FAST], capsys)
    assert rc == 0, err
    manifest = json.loads((out / "download.json").read_text())
    assert manifest["sources"][f"wikipedia/enwiki-{dump_names['date']}/parts"]["checksum_list"].endswith("md5sums.txt")
    name = dump_names["parts"][0]
    assert manifest["files"][name]["md5"] == hashlib.md5(mirror.files[base + name]).hexdigest()
    # A mirror that carries the files and the md5 list but no dumpstatus.json still works.
    del mirror.files[base + "dumpstatus.json"]
    out = tmp_path / "nostatus"
    rc, _, err = _run(["download", "wikipedia", "--date", dump_names["date"], "--out", str(out), "--mirror", mirror.url, *FAST], capsys)
    assert rc == 0, err
    # Only the numbered parts: the md5 list also names the recombined file with the same pages.
    assert corpus_inputs(out) == sorted(dump_names["parts"])


def test_a_second_layout_of_the_same_wiki_is_warned_about(mirror, dump_names, tmp_path: Path, caplog) -> None:
    from pipeline.download.http import RetryPolicy
    from pipeline.download.wikipedia import download_wikipedia

    policy = RetryPolicy(max_retries=1, backoff_s=0.01, timeout_s=10)
    download_wikipedia(tmp_path, date=dump_names["date"], mirror=mirror.url, layout="parts", policy=policy)
    assert "read the same articles twice" not in caplog.text
    download_wikipedia(tmp_path, date=dump_names["date"], mirror=mirror.url, layout="multistream", policy=policy)
    assert "read the same articles twice" in caplog.text


def test_wikipedia_cut_off_download_resumes_via_the_cli(mirror, dump_names, tmp_path: Path, capsys) -> None:
    name = dump_names["parts"][1]
    path = f"/enwiki/{dump_names['date']}/{name}"
    mirror.cut_after[path] = 200_000
    out = tmp_path / "raw"
    rc, _, err = _run(["download", "wikipedia", "--date", dump_names["date"], "--out", str(out), "--mirror", mirror.url,
                       "--retries", "0", "--no-progress"], capsys)
    # a network failure after the retries: a fault (exit 1, the download Job retries it), not a user error (2)
    assert rc == 1 and f"{name}.part (200000 bytes) is kept: rerun the same command to resume from byte 200000" in err
    assert (out / dump_names["parts"][0]).exists() and not (out / name).exists()  # the other part finished
    rc, _, err = _run(["download", "wikipedia", "--date", dump_names["date"], "--out", str(out), "--mirror", mirror.url, *FAST], capsys)
    assert rc == 0, err
    assert mirror.requests_for(path)[-1].range == "bytes=200000-"
    assert (out / name).read_bytes() == mirror.files[path]


def test_a_download_that_received_nothing_does_not_name_a_file_as_kept(mirror, dump_names, tmp_path: Path, capsys) -> None:
    name = dump_names["parts"][1]
    mirror.cut_after[f"/enwiki/{dump_names['date']}/{name}"] = 0
    rc, _, err = _run(["download", "wikipedia", "--date", dump_names["date"], "--out", str(tmp_path / "raw"),
                       "--mirror", mirror.url, "--retries", "0", "--no-progress"], capsys)
    assert rc == 1 and "nothing was received; rerun the same command when the network is back" in err
    assert "is kept" not in err


def test_wikipedia_corrupted_part_is_refused(mirror, dump_names, tmp_path: Path, capsys) -> None:
    name = dump_names["parts"][0]
    mirror.corrupt_at[f"/enwiki/{dump_names['date']}/{name}"] = 4242
    out = tmp_path / "raw"
    rc, _, err = _run(["download", "wikipedia", "--date", dump_names["date"], "--out", str(out), "--mirror", mirror.url, *FAST], capsys)
    assert rc == 1 and "sha1 checksum mismatch" in err and "Traceback" not in err
    assert not (out / name).exists() and (out / f"{name}.part").exists()
    assert name not in corpus_inputs(out)


def test_a_file_already_under_a_dump_name_that_does_not_verify_is_left_alone(mirror, dump_names, tmp_path: Path, capsys) -> None:
    """bertpipe names a part only once verified, so a non-verifying file there is not ours to replace."""
    name, out = dump_names["parts"][0], tmp_path / "raw"
    out.mkdir()
    (out / name).write_bytes(b"my own copy, cut short")
    rc, _, err = _run(["download", "wikipedia", "--date", dump_names["date"], "--out", str(out), "--mirror", mirror.url, *FAST], capsys)
    assert rc == 2 and f"{out / name} is already there but does not match its published sha1" in err and "move it aside" in err
    assert (out / name).read_bytes() == b"my own copy, cut short"
    assert not mirror.requests_for(f"/enwiki/{dump_names['date']}/{name}")
    (out / name).unlink()
    assert _run(["download", "wikipedia", "--date", dump_names["date"], "--out", str(out), "--mirror", mirror.url, *FAST], capsys)[0] == 0


def test_a_book_file_bertpipe_did_not_write_is_not_replaced(mirror, tmp_path: Path, capsys) -> None:
    """An unrecorded gutenberg/<id>.txt with other text (the user's copy) is a counted skip; one with
    exactly the fetched text (a killed run's last book) is kept, untouched, and recorded; a recorded
    book edited since is a skip too, without fetching it, and its stale record is dropped."""
    out = tmp_path / "raw"
    (out / "gutenberg").mkdir(parents=True)
    (out / "gutenberg" / "105.txt").write_text("my annotated Persuasion\n", encoding="utf-8")
    (out / "gutenberg" / "121.txt").write_bytes((DATA / "books" / "northangerabbey.txt").read_bytes())
    stamp = (out / "gutenberg" / "121.txt").stat().st_mtime_ns
    rc, stdout, err = _run(["download", "books", "--ids", "105", "121", "--out", str(out), "--mirror", mirror.url, *FAST], capsys)
    assert rc == 0, err
    assert "0 book(s) written, 1 already there, 1 skipped" in stdout
    assert (out / "gutenberg" / "121.txt").stat().st_mtime_ns == stamp
    assert "skipped #105: " in stdout and "already there with other text" in stdout and "move it aside" in stdout
    assert (out / "gutenberg" / "105.txt").read_text(encoding="utf-8") == "my annotated Persuasion\n"
    manifest = json.loads((out / "download.json").read_text())
    assert "gutenberg/105.txt" not in manifest["files"] and "gutenberg/121.txt" in manifest["files"]
    assert not list((out / "gutenberg").glob("*.partial*"))

    # Our recorded 121, edited since: left alone, not fetched again, its record dropped.
    (out / "gutenberg" / "121.txt").write_text("my notes on Northanger Abbey\n", encoding="utf-8")
    before = len(mirror.log)
    rc, stdout, err = _run(["download", "books", "--ids", "121", "--out", str(out), "--mirror", mirror.url, *FAST], capsys)
    assert rc == 0, err
    assert "skipped #121: " in stdout and "has changed since bertpipe wrote it" in stdout and len(mirror.log) == before
    assert (out / "gutenberg" / "121.txt").read_text(encoding="utf-8") == "my notes on Northanger Abbey\n"
    manifest = json.loads((out / "download.json").read_text())
    assert "gutenberg/121.txt" not in manifest["files"] and manifest["sources"]["gutenberg"]["books"] == []


def test_a_raw_book_left_by_a_killed_run_is_named_before_downloading(mirror, tmp_path: Path, capsys) -> None:
    # Killed between the raw download and its clean-up: every rerun downloaded the book again and then
    # skipped it as "appeared while it was being downloaded"
    out = tmp_path / "raw"
    (out / "gutenberg").mkdir(parents=True)
    (out / "gutenberg" / "105.txt.partial").write_bytes(b"raw book text")
    before = len(mirror.log)
    rc, stdout, err = _run(["download", "books", "--ids", "105", "--out", str(out), "--mirror", mirror.url, *FAST], capsys)
    assert rc == 0, err
    assert "skipped #105: " in stdout and "105.txt.partial is left from an interrupted download" in stdout
    assert len(mirror.log) == before and (out / "gutenberg" / "105.txt.partial").read_bytes() == b"raw book text"


def test_a_book_killed_before_it_was_published_is_fetched_by_the_rerun(mirror, tmp_path: Path, capsys,
                                                                       monkeypatch) -> None:
    # Killed after the raw download, before the book was published: `105.txt.partial` was left in gutenberg/,
    # and every rerun skipped the book with exit 0 as "not bertpipe's", so it never arrived.
    from pipeline.download import gutenberg

    out = tmp_path / "raw"
    real_publish = gutenberg.publish

    def killed(part, dest):
        raise KeyboardInterrupt  # the kill, as the stripped book is published

    monkeypatch.setattr(gutenberg, "publish", killed)
    rc, _, _ = _run(["download", "books", "--ids", "105", "--out", str(out), "--mirror", mirror.url, *FAST], capsys)
    assert rc == 130
    left = sorted(p.name for p in (out / "gutenberg" / gutenberg.IN_PROGRESS).iterdir())
    assert left == ["105.txt", "105.txt.partial"]  # the raw download and the stripped text, in our own folder
    monkeypatch.setattr(gutenberg, "publish", real_publish)
    rc, stdout, err = _run(["download", "books", "--ids", "105", "--out", str(out), "--mirror", mirror.url, *FAST], capsys)
    assert rc == 0, err
    assert "1 book(s) written" in stdout, stdout
    assert sorted(p.name for p in (out / "gutenberg").iterdir()) == ["105.txt"]  # the folder removed once empty


def test_a_book_file_that_appears_while_the_book_is_written_is_not_replaced(mirror, tmp_path: Path, capsys,
                                                                            monkeypatch) -> None:
    # The name was free when checked; a file put there before the publish step (another program, the
    # user) used to be replaced by os.replace.
    out = tmp_path / "raw"
    dest = out / "gutenberg" / "105.txt"
    write_bytes = Path.write_bytes

    def write_then_someone_else_takes_the_name(self: Path, data: bytes) -> int:
        written = write_bytes(self, data)
        if self.name == "105.txt.partial" and not dest.exists():
            write_bytes(dest, b"my own copy\n")
        return written

    monkeypatch.setattr(Path, "write_bytes", write_then_someone_else_takes_the_name)
    rc, stdout, err = _run(["download", "books", "--ids", "105", "--out", str(out), "--mirror", mirror.url, *FAST], capsys)
    assert rc == 0, err
    assert "skipped #105: " in stdout and "appeared while ebook #105 was being written" in stdout, stdout
    assert dest.read_bytes() == b"my own copy\n"
    assert "gutenberg/105.txt" not in json.loads((out / "download.json").read_text())["files"]
    assert not list((out / "gutenberg").glob("*.partial*"))


def test_wikipedia_date_not_on_the_mirror_says_what_to_do(mirror, tmp_path: Path, capsys) -> None:
    rc, _, err = _run(["download", "wikipedia", "--date", "20990101", "--out", str(tmp_path), "--mirror", mirror.url, *FAST], capsys)
    assert rc == 2 and "Traceback" not in err
    assert "no enwiki dump dated 20990101" in err and "--date latest" in err
    rc, _, err = _run(["download", "wikipedia", "--date", "20260120", "--out", str(tmp_path), "--mirror", mirror.url, *FAST], capsys)
    assert rc == 2 and "articlesdump: in-progress" in err and "earlier --date" in err
    rc, _, err = _run(["download", "wikipedia", "--date", "2026-01-01", "--out", str(tmp_path), "--mirror", mirror.url, *FAST], capsys)
    assert rc == 2 and "not YYYYMMDD" in err


def test_wikipedia_not_enough_disk_is_refused_up_front(mirror, tmp_path: Path, capsys) -> None:
    rc, _, err = _run(["download", "wikipedia", "--date", "20251201", "--out", str(tmp_path / "raw"), "--mirror", mirror.url, *FAST], capsys)
    assert rc == 1 and "GiB free" in err and "--out directory on a larger disk" in err
    assert not any(r.path.endswith(".bz2") for r in mirror.log)


def test_books_from_the_mirror_catalogue_are_stripped_exactly(mirror, tmp_path: Path, capsys) -> None:
    out = tmp_path / "raw"
    rc, stdout, err = _run(["download", "books", "--source", "gutenberg", "--out", str(out), "--mirror", mirror.url, *FAST], capsys)
    assert rc == 0, err
    assert "2 book(s) written" in stdout and "1 skipped" in stdout and "skipped #9999999" in stdout
    assert (out / "gutenberg" / "105.txt").read_text(encoding="utf-8") == (DATA / "books" / "persuasion.txt").read_text(encoding="utf-8")
    assert (out / "gutenberg" / "121.txt").read_text(encoding="utf-8") == (DATA / "books" / "northangerabbey.txt").read_text(encoding="utf-8")
    # 121 exists only in the older files/<id>/<id>-0.txt layout; French and audio books were filtered out.
    assert mirror.requests_for("/files/121/121-0.txt") and not mirror.requests_for("/cache/epub/17989/pg17989.txt")
    manifest = json.loads((out / "download.json").read_text())
    entry = manifest["files"]["gutenberg/105.txt"]
    assert entry["raw_size"] == len(mirror.files["/cache/epub/105/pg105.txt"]) and entry["title"] == "Persuasion"
    assert entry["sha256"] == hashlib.sha256((out / "gutenberg" / "105.txt").read_bytes()).hexdigest()
    assert manifest["sources"]["gutenberg"]["skipped"][0]["id"] == 9999999
    assert corpus_inputs(out) == ["gutenberg/105.txt", "gutenberg/121.txt"]
    # Rerun: verified books are not fetched again.
    before = len(mirror.log)
    rc, stdout, _ = _run(["download", "books", "--ids", "105", "121", "--out", str(out), "--mirror", mirror.url, *FAST], capsys)
    assert rc == 0 and "2 already there" in stdout and len(mirror.log) == before


def test_books_from_a_local_catalogue_resume_after_a_cut(mirror, tmp_path: Path, capsys) -> None:
    catalog = tmp_path / "my_books.txt"
    catalog.write_text("# my reading list\n105\n")
    mirror.cut_after["/cache/epub/105/pg105.txt"] = 100_000
    out = tmp_path / "raw"
    rc, _, err = _run(["download", "books", "--catalog", str(catalog), "--out", str(out), "--mirror", mirror.url, *FAST], capsys)
    assert rc == 0, err
    assert [r.range for r in mirror.requests_for("/cache/epub/105/pg105.txt")] == [None, "bytes=100000-"]
    assert (out / "gutenberg" / "105.txt").read_text(encoding="utf-8") == (DATA / "books" / "persuasion.txt").read_text(encoding="utf-8")


def test_bad_arguments_are_clear(tmp_path: Path, capsys) -> None:
    rc, _, err = _run(["download", "books", "--catalog", str(tmp_path / "missing.csv"), "--out", str(tmp_path)], capsys)
    assert rc == 2 and "does not exist" in err
    rc, _, err = _run(["download", "books", "--catalog", str(tmp_path), "--out", str(tmp_path)], capsys)
    assert rc == 2 and f"--catalog {tmp_path} is not a file" in err  # it said "does not exist"
    # A local path or file:// was fetched as a URL, retried as a network fault for a minute, then exit 1.
    for mirror in ("/srv/gutenberg", "file:///srv/gutenberg"):
        rc, _, err = _run(["download", "books", "--ids", "105", "--mirror", mirror, "--out", str(tmp_path)], capsys)
        assert rc == 2 and f"argument --mirror: {mirror!r} is not an http(s) URL with a host" in err
    rc, _, err = _run(["download", "wikipedia", "--lang", "English!", "--out", str(tmp_path)], capsys)
    assert rc == 2 and "language code" in err
    # An --out that cannot be created is a clear error, not a traceback.
    (tmp_path / "afile").write_text("x")
    rc, _, err = _run(["download", "books", "--ids", "105", "--out", str(tmp_path / "afile" / "raw"),
                       "--mirror", "http://127.0.0.1:9", "--no-progress"], capsys)
    assert rc == 2 and "writable directory" in err
    latin1 = tmp_path / "catalog.csv"
    latin1.write_bytes("Text#,Type,Issued,Title,Language\n105,Text,1994-02-01,Persuasion \xe9,en\n".encode("latin-1"))
    rc, _, err = _run(["download", "books", "--catalog", str(latin1), "--out", str(tmp_path / "r")], capsys)
    assert rc == 2 and f"--catalog {latin1} is not UTF-8 text (byte" in err  # was: 'utf-8' codec can't decode ...
    rc, _, err = _run(["download", "books", "--ids", "105", "-5", "--out", str(tmp_path / "r")], capsys)
    assert rc == 2 and "--ids takes ebook numbers (1 or more), got -5" in err


@pytest.mark.parametrize("size_kib", [400, 600])
def test_download_on_a_full_disk_is_one_line_and_resumes_after_freeing_space(mirror, tmpfs, capsys, size_kib) -> None:
    """A real small tmpfs: the books do not fit (a dump's known size is refused before fetching; books
    have no size up front, so they meet the full disk mid-write); the message names the path; after
    growing the mount the same command finishes and the books are exact. At 600 KiB the download fits
    and the stripped text does not: the download was left under its final name, and every rerun
    skipped the book as "not ours to replace"."""
    disk = tmpfs(size_kib * 1024)
    out = disk / "raw"
    argv = ["download", "books", "--ids", "105", "121", "--out", str(out), "--mirror", mirror.url, "--jobs", "1", *FAST]
    rc, _, err = _run(argv, capsys)
    assert rc != 0
    lines = [line for line in err.splitlines() if line.strip() and " INFO " not in line and " WARNING " not in line]
    assert len(lines) == 1 and str(disk) in lines[0], err
    assert "no space left on device while writing" in lines[0] or "the disk filled up while writing" in lines[0], err
    tmpfs.resize(disk, 64 * 1024 * 1024)
    rc, _, err = _run(argv, capsys)
    assert rc == 0 and "skipped #" not in err, err
    assert (out / "gutenberg" / "105.txt").read_text(encoding="utf-8") == (DATA / "books" / "persuasion.txt").read_text(encoding="utf-8")
    assert (out / "gutenberg" / "121.txt").read_text(encoding="utf-8") == (DATA / "books" / "northangerabbey.txt").read_text(encoding="utf-8")


def test_a_download_manifest_of_the_wrong_shape_is_named_not_a_traceback(tmp_path):
    from pipeline.download.manifest import FORMAT, FORMAT_VERSION, MANIFEST_NAME, read_manifest

    path = tmp_path / MANIFEST_NAME
    for content, why in (([], "a JSON list"), ({"format": FORMAT, "format_version": FORMAT_VERSION}, "is damaged"),
                         ({"format": FORMAT, "format_version": FORMAT_VERSION, "sources": [], "files": {}}, "is damaged")):
        path.write_text(json.dumps(content))
        with pytest.raises(ValueError, match=why) as err:
            read_manifest(tmp_path)
        assert str(path) in str(err.value)


def test_a_dumpstatus_of_the_wrong_shape_is_named_not_a_traceback(mirror, dump_names, tmp_path: Path, capsys) -> None:
    base = f"/enwiki/{dump_names['date']}/"
    good = json.loads(mirror.files[base + "dumpstatus.json"])
    part = dump_names["parts"][0]
    breakages = {  # what a broken mirror copy could hold -> the key the message must name
        "jobs.articlesdump is not an object": lambda s: s["jobs"].update(articlesdump="done"),
        "jobs.articlesdump.files is not an object": lambda s: s["jobs"]["articlesdump"].update(files=[part]),
        f"jobs.articlesdump.files.{part}.size is '12'": lambda s: s["jobs"]["articlesdump"]["files"][part].update(size="12"),
        f"jobs.articlesdump.files.{part}.sha1 is 5": lambda s: s["jobs"]["articlesdump"]["files"][part].update(sha1=5),
    }
    for i, (message, breakage) in enumerate(breakages.items()):
        status = json.loads(json.dumps(good))
        breakage(status)
        mirror.files[base + "dumpstatus.json"] = json.dumps(status).encode()
        rc, _, err = _run(["download", "wikipedia", "--date", dump_names["date"], "--out", str(tmp_path / str(i)),
                           "--mirror", mirror.url, *FAST], capsys)
        assert rc == 2 and "Traceback" not in err and message in err and "dumpstatus.json" in err, err
        assert "try another --mirror" in err
    # A job bertpipe does not read is not its business: a broken history job does not stop the download.
    status = json.loads(json.dumps(good))
    status["jobs"]["metahistorybz2dump"] = "broken"
    mirror.files[base + "dumpstatus.json"] = json.dumps(status).encode()
    rc, _, err = _run(["download", "wikipedia", "--date", dump_names["date"], "--out", str(tmp_path / "ok"),
                       "--mirror", mirror.url, *FAST], capsys)
    assert rc == 0, err
