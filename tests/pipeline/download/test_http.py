"""The resumable downloader against a local mirror: verify, resume from the byte reached, detect corruption."""

from __future__ import annotations

import hashlib
import time
from pathlib import Path

import pytest

from pipeline.download.checksums import parse_checksum_list
from pipeline.download.errors import ChecksumMismatchError, DiskFullError, DownloadError, NetworkError, NotFoundError
import threading

from pipeline.download.http import ByteProgress, Cancelled, RetryPolicy, fetch, part_path

FAST = RetryPolicy(max_retries=3, backoff_s=0.01, timeout_s=10)
PATH = "/enwiki/20260101/enwiki-20260101-pages-articles-multistream.xml.bz2"


def _published(mirror, path: str = PATH) -> tuple[int, dict[str, str]]:
    data = mirror.files[path]
    return len(data), {"sha1": hashlib.sha1(data).hexdigest()}


def test_full_download_verifies_and_takes_its_final_name(mirror, tmp_path: Path) -> None:
    size, sums = _published(mirror)
    dest = tmp_path / "dump.xml.bz2"
    progress = ByteProgress(size, enabled=True)  # the tqdm bar, as on a terminal
    result = fetch(mirror.url + PATH, dest, expected_size=size, checksums=sums, policy=FAST, progress=progress)
    progress.close()
    assert progress.done == size
    assert dest.read_bytes() == mirror.files[PATH]
    assert result.digests["sha1"] == sums["sha1"] and result.digests["sha256"] == hashlib.sha256(mirror.files[PATH]).hexdigest()
    assert not part_path(dest).exists() and sorted(p.name for p in tmp_path.iterdir()) == ["dump.xml.bz2"]
    assert [r.range for r in mirror.requests_for(PATH)] == [None]
    # A second run finds the verified file and fetches nothing.
    again = fetch(mirror.url + PATH, dest, expected_size=size, checksums=sums, policy=FAST)
    assert again.skipped and len(mirror.requests_for(PATH)) == 1


def test_connection_cut_midway_resumes_from_the_byte_reached(mirror, tmp_path: Path) -> None:
    size, sums = _published(mirror)
    cut = 700_001
    mirror.cut_after[PATH] = cut
    dest = tmp_path / "dump.xml.bz2"
    progress = ByteProgress(size, enabled=False)
    result = fetch(mirror.url + PATH, dest, expected_size=size, checksums=sums, policy=FAST, progress=progress)
    assert progress.done == size  # the bytes before the cut are counted once
    assert dest.read_bytes() == mirror.files[PATH]
    ranges = [r.range for r in mirror.requests_for(PATH)]
    assert ranges == [None, f"bytes={cut}-"], ranges
    assert mirror.requests_for(PATH)[1].status == 206 and mirror.requests_for(PATH)[1].if_range  # ETag-guarded
    assert result.retries == 1


def test_interrupted_run_leaves_a_part_file_that_the_next_run_resumes(mirror, tmp_path: Path) -> None:
    size, sums = _published(mirror)
    cut = 123_457
    mirror.cut_after[PATH] = cut
    dest = tmp_path / "dump.xml.bz2"
    with pytest.raises(NetworkError, match=f"resume from byte {cut}"):
        fetch(mirror.url + PATH, dest, expected_size=size, checksums=sums, policy=RetryPolicy(max_retries=0, timeout_s=10))
    assert not dest.exists() and part_path(dest).stat().st_size == cut
    result = fetch(mirror.url + PATH, dest, expected_size=size, checksums=sums, policy=FAST)
    assert result.resumed_from == cut and dest.read_bytes() == mirror.files[PATH]
    assert mirror.requests_for(PATH)[-1].range == f"bytes={cut}-"


def test_an_error_page_sent_as_200_keeps_the_part_file(mirror, tmp_path: Path) -> None:
    # The partial file was deleted before the answer was checked: hours of a 20 GB dump lost to one page.
    size, sums = _published(mirror)
    cut = 300_001
    mirror.cut_after[PATH] = cut
    dest = tmp_path / "dump.xml.bz2"
    no_retry = RetryPolicy(max_retries=0, timeout_s=10)
    with pytest.raises(NetworkError):
        fetch(mirror.url + PATH, dest, expected_size=size, checksums=sums, policy=no_retry)
    mirror.html_instead.add(PATH)
    with pytest.raises(DownloadError, match="answered with an HTML page, not the file"):
        fetch(mirror.url + PATH, dest, expected_size=size, checksums=sums, policy=no_retry)
    assert part_path(dest).stat().st_size == cut
    # A whole-file answer of the wrong size (a mirror mid-sync) keeps it too.
    mirror.html_instead.clear()
    mirror.files[PATH] += b"more"
    with pytest.raises(DownloadError, match=f"is {size + 4} bytes but the dump's status file lists {size}"):
        fetch(mirror.url + PATH, dest, expected_size=size, checksums=sums, policy=no_retry)
    assert part_path(dest).stat().st_size == cut


def test_cancel_stops_a_transfer_and_keeps_the_part_file(mirror, tmp_path: Path) -> None:
    cancel = threading.Event()

    class CancelAfterFirstChunk(ByteProgress):
        def update(self, n: int) -> None:
            super().update(n)
            cancel.set()  # what Ctrl-C in the main thread does

    dest = tmp_path / "dump.xml.bz2"
    with pytest.raises(Cancelled):
        fetch(mirror.url + PATH, dest, policy=FAST, progress=CancelAfterFirstChunk(None, enabled=False), cancel=cancel)
    assert not dest.exists() and 0 < part_path(dest).stat().st_size < len(mirror.files[PATH])


def test_cancel_wakes_a_read_stalled_on_a_silent_connection(mirror, tmp_path: Path) -> None:
    # Ctrl-C used to wait for the read timeout (--timeout, 60 s by default) when the server went quiet.
    from pipeline.download.retry import Cancel

    mirror.stall_after[PATH] = 300_000
    cancel, outcome = Cancel(), {}
    dest = tmp_path / "dump.xml.bz2"

    def download() -> None:
        try:
            fetch(mirror.url + PATH, dest, policy=RetryPolicy(max_retries=3, backoff_s=0.01, timeout_s=30), cancel=cancel)
        except Cancelled as err:
            outcome["cancelled"] = err

    worker = threading.Thread(target=download)
    worker.start()
    deadline = time.monotonic() + 10
    while not (part_path(dest).exists() and part_path(dest).stat().st_size == 300_000) and time.monotonic() < deadline:
        time.sleep(0.02)
    assert part_path(dest).stat().st_size == 300_000  # stalled there, blocked in a read
    started = time.monotonic()
    cancel.set()
    worker.join(10)
    assert not worker.is_alive() and "cancelled" in outcome
    assert time.monotonic() - started < 5  # not the 30 s read timeout
    assert not dest.exists() and part_path(dest).stat().st_size == 300_000  # kept for a resume


def test_parallel_downloads_keep_their_connections_without_pool_warnings(caplog) -> None:
    # A keep-alive (HTTP/1.1) server, as real mirrors are: urllib3's default pool of one connection per
    # host discarded the others with a warning each time two transfers overlapped.
    from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

    from pipeline.download.http import get_bytes

    class KeepAlive(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def log_message(self, *args) -> None:
            pass

        def do_GET(self) -> None:  # noqa: N802
            body = b"x" * 1000
            self.send_response(200)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

    server = ThreadingHTTPServer(("127.0.0.1", 0), KeepAlive)
    server.daemon_threads = True
    threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True).start()
    url = f"http://127.0.0.1:{server.server_address[1]}/small"
    try:
        with caplog.at_level("WARNING", logger="urllib3"):
            workers = [threading.Thread(target=lambda: [get_bytes(url, FAST) for _ in range(20)]) for _ in range(4)]
            for w in workers:
                w.start()
            for w in workers:
                w.join(60)
    finally:
        server.shutdown()
        server.server_close()
    assert not [r for r in caplog.records if "pool is full" in r.getMessage()]


def test_changed_file_upstream_restarts_instead_of_splicing(mirror, tmp_path: Path) -> None:
    dest = tmp_path / "dump.xml.bz2"
    mirror.cut_after[PATH] = 50_000
    with pytest.raises(NetworkError):
        fetch(mirror.url + PATH, dest, policy=RetryPolicy(max_retries=0, timeout_s=10))
    mirror.files[PATH] = b"new contents " * 10_000  # the mirror replaced the file: ETag changes
    fetch(mirror.url + PATH, dest, policy=FAST)
    assert dest.read_bytes() == mirror.files[PATH]
    last = mirror.requests_for(PATH)[-1]
    assert last.range == "bytes=50000-" and last.status == 200  # If-Range failed -> whole file


def test_a_corrupted_byte_is_caught_and_the_part_file_kept_unused(mirror, tmp_path: Path) -> None:
    size, sums = _published(mirror)
    mirror.corrupt_at[PATH] = 1_000_000
    dest = tmp_path / "dump.xml.bz2"
    with pytest.raises(ChecksumMismatchError, match="sha1 checksum mismatch") as err:
        fetch(mirror.url + PATH, dest, expected_size=size, checksums=sums, policy=FAST)
    assert "delete it and rerun" in str(err.value)
    assert not dest.exists() and part_path(dest).stat().st_size == size


def test_404_and_retried_503(mirror, tmp_path: Path) -> None:
    with pytest.raises(NotFoundError, match="404"):
        fetch(mirror.url + "/enwiki/20990101/nothing.bz2", tmp_path / "x", policy=FAST)
    assert not list(tmp_path.iterdir())
    mirror.fail_status[PATH] = [503, 503]
    fetch(mirror.url + PATH, tmp_path / "y", checksums=_published(mirror)[1], policy=FAST)
    assert [r.status for r in mirror.requests_for(PATH)] == [503, 503, 200]


def test_too_many_requests_is_retried_without_a_retry_after_header() -> None:
    # Rate limiters answer parallel downloads with 429, often with no Retry-After (urllib3 retries a 429
    # only when it has one): a wait and another try, not a failed file. The test mirror always sends one.
    retry = RetryPolicy().retry()
    assert retry.is_retry("GET", 429, has_retry_after=False) and retry.is_retry("GET", 503, has_retry_after=False)
    assert not retry.is_retry("GET", 404, has_retry_after=False)


def test_a_retry_after_header_sets_the_wait(monkeypatch) -> None:
    # A mirror that says how long to back off is believed, not hammered after the 0.01 s backoff.
    from urllib3 import HTTPResponse
    from urllib3.util.retry import RequestHistory

    retry = RetryPolicy(backoff_s=0.01).retry().new(history=(RequestHistory("GET", "u", None, 429, None),))
    slept: list[float] = []
    monkeypatch.setattr(time, "sleep", slept.append)
    retry.sleep(HTTPResponse(body=b"", headers={"Retry-After": "7"}, status=429))
    assert slept == [7.0]


def test_redirects_do_not_spend_the_retry_budget(mirror, tmp_path: Path) -> None:
    # urllib3 counts a redirect against the retry total: with --retries 0 a redirecting mirror failed.
    mirror.redirects.update({"/mirror/a.bz2": "/mirror/b.bz2", "/mirror/b.bz2": PATH})
    no_retries = RetryPolicy(max_retries=0, backoff_s=0.01, timeout_s=10)
    fetch(mirror.url + "/mirror/a.bz2", tmp_path / "a", checksums=_published(mirror)[1], policy=no_retries)
    assert (tmp_path / "a").read_bytes() == mirror.files[PATH]
    # Failures still spend it: one 503 behind the redirects with one retry allowed, then two with one.
    mirror.fail_status[PATH] = [503]
    fetch(mirror.url + "/mirror/a.bz2", tmp_path / "b", checksums=_published(mirror)[1],
          policy=RetryPolicy(max_retries=1, backoff_s=0.01, timeout_s=10))
    mirror.fail_status[PATH] = [503, 503]
    with pytest.raises(NetworkError, match="still answered HTTP 503"):
        fetch(mirror.url + "/mirror/a.bz2", tmp_path / "c", policy=RetryPolicy(max_retries=1, backoff_s=0.01, timeout_s=10))


def test_the_first_retry_waits_the_backoff_and_each_next_twice_as_long() -> None:
    from urllib3.util.retry import RequestHistory

    retry = RetryPolicy(backoff_s=2.0, max_backoff_s=60.0).retry()
    failed, redirected = RequestHistory("GET", "u", None, 503, None), RequestHistory("GET", "u", None, 302, "/v")
    assert retry.get_backoff_time() == 0.0  # no failure yet
    waits = [retry.new(history=(failed,) * n).get_backoff_time() for n in (1, 2, 3, 8)]
    assert 2.0 <= waits[0] <= 4.0 and 4.0 <= waits[1] <= 6.0 and 8.0 <= waits[2] <= 10.0 and waits[3] == 60.0, waits
    # Only the failures since the last redirect count.
    assert 2.0 <= retry.new(history=(failed, failed, redirected, failed)).get_backoff_time() <= 4.0


@pytest.mark.skipif(not Path("/dev/full").exists(), reason="needs Linux /dev/full to produce a real ENOSPC")
def test_disk_full_while_writing_says_what_to_do(mirror, tmp_path: Path) -> None:
    dest = tmp_path / "dump.xml.bz2"
    part_path(dest).symlink_to("/dev/full")  # every write to the partial file fails with ENOSPC
    with pytest.raises(DiskFullError, match="the disk filled up while writing .*free some space and rerun"):
        fetch(mirror.url + PATH, dest, policy=FAST)
    assert not dest.exists()


def test_parse_checksum_list() -> None:
    sha1 = "a" * 40
    assert parse_checksum_list(f"{sha1}  enwiki-1.bz2\n\n{sha1.upper()} *b.bz2\n", "sha1") == {"enwiki-1.bz2": sha1, "b.bz2": sha1}
    with pytest.raises(ValueError, match="line 1"):
        parse_checksum_list("d41d8cd98f00b204e9800998ecf8427e  x\n", "sha1")
    # A comment heading the list (as some mirrors write) is not a malformed line.
    assert parse_checksum_list(f"# sha1 of the dump\n  # indented\n{sha1}  x.bz2\n", "sha1") == {"x.bz2": sha1}


def test_a_part_file_started_from_another_url_is_not_resumed(mirror, tmp_path: Path) -> None:
    """Books publish no checksum: resuming another edition's bytes would publish a splice of two."""
    dest = tmp_path / "dump.xml.bz2"
    mirror.cut_after[PATH] = 50_000
    with pytest.raises(NetworkError):
        fetch(mirror.url + PATH, dest, policy=RetryPolicy(max_retries=0, timeout_s=10))
    other = PATH.replace("20260101", "20251201")
    mirror.files[other] = b"another dump " * 10_000
    fetch(mirror.url + other, dest, policy=FAST)
    assert dest.read_bytes() == mirror.files[other]
    assert mirror.requests_for(other)[0].range is None  # started over, no Range into someone else's bytes


def test_a_part_file_bertpipe_did_not_start_is_left_alone(mirror, tmp_path: Path) -> None:
    # A browser names its partial downloads NAME.part too: one with no record of ours beside it was deleted
    from pipeline.download.errors import ExistingFileError

    dest = tmp_path / "dump.xml.bz2"
    part_path(dest).write_bytes(b"someone else's half file")
    with pytest.raises(ExistingFileError, match=r"dump.xml.bz2.part is there and bertpipe did not start it"):
        fetch(mirror.url + PATH, dest, policy=FAST)
    assert part_path(dest).read_bytes() == b"someone else's half file" and not dest.exists()


def test_one_download_per_file_and_never_over_a_file_that_appears_meanwhile(mirror, tmp_path: Path) -> None:
    from pipeline.download.errors import DownloadError, ExistingFileError
    from pipeline.download.publish import only_writer

    dest = tmp_path / "dump.xml.bz2"
    with only_writer(dest):  # another process (or thread) downloading the same file
        with pytest.raises(DownloadError, match="is being downloaded into .* by another process"):
            fetch(mirror.url + PATH, dest, policy=FAST)
    assert not part_path(dest).exists()

    class UserWritesDest(ByteProgress):
        def update(self, n: int) -> None:
            super().update(n)
            if not dest.exists():
                dest.write_text("the user's own file")

    with pytest.raises(ExistingFileError, match="appeared while it was being downloaded"):
        fetch(mirror.url + PATH, dest, policy=FAST, progress=UserWritesDest(None, enabled=False))
    assert dest.read_text() == "the user's own file" and part_path(dest).stat().st_size == len(mirror.files[PATH])


def test_a_lock_taken_on_the_file_its_holder_just_removed_is_no_lock(tmp_path: Path, monkeypatch) -> None:
    """B opens the lock file, is descheduled while A finishes and removes it, then C locks a new file
    under the name: B's flock on the removed file succeeded, and B and C both wrote."""
    import fcntl

    from pipeline.download import publish
    from pipeline.download.errors import DownloadError

    real_flock = fcntl.flock

    class SlowForB:
        def __getattr__(self, name):
            return getattr(fcntl, name)

        @staticmethod
        def flock(f, op):
            if threading.current_thread().name == "B" and not getattr(threading.current_thread(), "slept", False):
                threading.current_thread().slept = True
                time.sleep(0.5)  # between open() and flock(), as a scheduler may
            return real_flock(f, op)

    monkeypatch.setattr(publish, "fcntl", SlowForB())
    dest, inside, most, refused = tmp_path / "x.bz2", [0], [0], []

    def writer(hold: float, wait: float = 0.0) -> None:
        time.sleep(wait)
        try:
            with publish.only_writer(dest):
                inside[0] += 1
                most[0] = max(most[0], inside[0])
                time.sleep(hold)
                inside[0] -= 1
        except DownloadError:
            refused.append(threading.current_thread().name)

    threads = [threading.Thread(target=writer, args=args, name=name)
               for name, args in (("A", (0.2,)), ("B", (1.0, 0.05)), ("C", (0.5, 0.4)))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert most[0] == 1 and refused == ["B"]
