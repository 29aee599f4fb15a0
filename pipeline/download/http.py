"""A resumable, verifying HTTP downloader on urllib3.

`fetch(url, dest, ...)` writes to `dest.part` while it downloads and renames to `dest` only after
the file's size and checksums verify, so a reader of the output directory never sees a half-written
or unverified file under its final name (and a file already under that name that does not verify is
someone else's: it is refused, never replaced). Interrupted downloads resume with an HTTP `Range` request
from the byte the partial file reached (guarded by `If-Range` with the server's ETag or
Last-Modified, so a file that changed upstream restarts instead of being spliced). Transient
failures are retried by urllib3's `Retry` (connection errors, timeouts and 429/5xx up to the
response headers, honouring Retry-After, capped exponential backoff with jitter); a transfer cut
mid-body is charged to the same `Retry` budget and resumed, never restarted.
"""

from __future__ import annotations

import contextlib
import errno
import json
import logging
import shutil
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Mapping

import urllib3
from urllib3.exceptions import HTTPError as TransportError, MaxRetryError, ProtocolError
from urllib3.util.retry import Retry

from pipeline.download.checksums import RunningDigest, hash_file
from pipeline.download.publish import only_writer, publish
from pipeline.download.errors import (
    ChecksumMismatchError,
    DiskFullError,
    DownloadError,
    ExistingFileError,
    NetworkError,
    NotFoundError,
)
from pipeline.download.retry import RETRY_STATUS, Cancel, Cancelled, RetryPolicy, describe as _describe

logger = logging.getLogger(__name__)

# Wikimedia asks for a descriptive User-Agent; the default Python-urllib one may be throttled.
USER_AGENT = "bertpipe-download/0.1 (BERT pre-training data pipeline; urllib3)"
CHUNK = 1 << 20
# identity: a transparently gzip-compressed response would break byte offsets for Range.
# maxsize: a connection per parallel download (--jobs) is kept for reuse; with urllib3's default of 1,
# every finished transfer beside another logged "Connection pool is full, discarding connection".
_HTTP = urllib3.PoolManager(maxsize=64, headers={"User-Agent": USER_AGENT, "Accept-Encoding": "identity"})


class ByteProgress:
    """Aggregate progress over all files of a run: a tqdm bar on a terminal, else a log line every 30 s."""

    def __init__(self, total: int | None, enabled: bool, desc: str = "download") -> None:
        self._lock = threading.Lock()
        self.done = 0
        self.total = total
        self._start = self._last_log = time.monotonic()
        self._bar = None
        if enabled:
            from tqdm import tqdm

            self._bar = tqdm(total=total, unit="B", unit_scale=True, unit_divisor=1024, desc=desc)

    def update(self, n: int) -> None:
        with self._lock:
            self.done += n
            if self._bar is not None:
                self._bar.update(n)
            elif time.monotonic() - self._last_log >= 30:
                self._last_log = time.monotonic()
                rate = self.done / max(1e-9, self._last_log - self._start) / 2**20
                of = f" of {self.total / 2**30:.2f} GiB" if self.total else ""
                logger.info("downloaded %.2f GiB%s (%.1f MiB/s)", self.done / 2**30, of, rate)

    def close(self) -> None:
        if self._bar is not None:
            self._bar.close()


@dataclass
class FetchResult:
    path: Path
    url: str
    size: int
    digests: dict[str, str]
    resumed_from: int = 0  # bytes already on disk when this call started (0 = fresh download)
    retries: int = 0
    skipped: bool = False  # the verified file was already there


@dataclass
class _Attempt:
    """Why a request left `dest.part` incomplete (a read error: charged to the `Retry` budget)."""

    error: Exception


def _get(url: str, retry: Retry, policy: RetryPolicy, headers: Mapping[str, str] | None = None):
    """A streaming GET (body not read); urllib3 retries up to the headers, MaxRetryError when spent."""
    return _HTTP.request("GET", url, headers=dict(headers or {}), preload_content=False, retries=retry,
                         timeout=policy.timeout)


def get_bytes(url: str, policy: RetryPolicy, not_found_hint: str = "") -> bytes:
    """A small file (status JSON, checksum list, catalogue) into memory, with the same retries."""
    retry = policy.retry()
    while True:
        try:
            resp = _get(url, retry, policy)
            try:
                if resp.status in (404, 410):
                    raise NotFoundError(url, not_found_hint)
                if resp.status >= 400:
                    raise _status_error(url, resp, policy)
                return resp.read()  # urllib3 refuses a body shorter than Content-Length
            finally:
                resp.close()  # never hand a connection with unread bytes back to the pool
        except (ProtocolError, TransportError) as err:
            if isinstance(err, MaxRetryError):
                raise _gave_up(url, err.reason) from None
            try:
                retry = retry.increment("GET", url, error=err)
            except MaxRetryError:
                raise _gave_up(url, err) from None
            retry.sleep()


def _status_error(url: str, resp, policy: RetryPolicy) -> DownloadError:
    if resp.status in RETRY_STATUS:  # still failing once the retries were spent
        return NetworkError(f"{url} still answered HTTP {resp.status} {resp.reason} after {policy.max_retries} "
                            "retries; check the network or the --mirror URL and rerun")
    return DownloadError(f"{url} answered HTTP {resp.status} {resp.reason}")


def _gave_up(url: str, err: BaseException | None) -> NetworkError:
    return NetworkError(f"could not fetch {url} (last error: {_describe(err)}); "
                        "check the network or the --mirror URL and rerun")


def part_path(dest: Path) -> Path:
    return dest.with_name(dest.name + ".part")


def _meta_path(dest: Path) -> Path:
    # `.part.json`: ignored by the corpus reader (both suffixes are on its skip list).
    return dest.with_name(dest.name + ".part.json")


def ensure_free_space(directory: Path, needed_bytes: int, what: str) -> None:
    """Refuse up front when `directory`'s filesystem cannot hold `needed_bytes` more (+1% slack)."""
    directory.mkdir(parents=True, exist_ok=True)
    free = shutil.disk_usage(directory).free
    if needed_bytes * 1.01 > free:
        raise DiskFullError(
            f"{what} needs {needed_bytes / 2**30:.2f} GiB more but {directory} has only "
            f"{free / 2**30:.2f} GiB free; free some space or pass an --out directory on a larger disk "
            "(finished files and .part files already there are kept and reused)"
        )


def _disk_full(dest: Path, err: OSError) -> DiskFullError:
    part = part_path(dest)
    have = part.stat().st_size if part.exists() else 0
    return DiskFullError(
        f"the disk filled up while writing {part} ({err.strerror}); free some space and rerun the same "
        f"command: it resumes from byte {have}"
    )


def fetch(
    url: str,
    dest: Path,
    *,
    expected_size: int | None = None,
    checksums: Mapping[str, str] | None = None,
    policy: RetryPolicy = RetryPolicy(),
    progress: ByteProgress | None = None,
    extra_digests: tuple[str, ...] = ("sha256",),
    cancel: threading.Event | None = None,
) -> FetchResult:
    """Download `url` to `dest` (via `dest.part`), resuming, retrying and verifying.

    `checksums` maps algorithm -> expected hex digest (e.g. the dump's published sha1). The digests
    of `extra_digests` are computed too and returned for the manifest. On a checksum mismatch the
    partial file stays as `dest.part` (never renamed to `dest`) and `ChecksumMismatchError` says
    how to fetch it afresh. Setting `cancel` (from another thread) stops the transfer within one
    chunk with `Cancelled`, keeping the partial file for a later resume.
    """
    checksums = {k: v.lower() for k, v in (checksums or {}).items()}
    algorithms = tuple(sorted(set(checksums) | set(extra_digests)))
    dest.parent.mkdir(parents=True, exist_ok=True)
    part, meta = part_path(dest), _meta_path(dest)
    with only_writer(dest):
        if dest.exists() and checksums:
            digests = hash_file(dest, algorithms)
            if all(digests[a] == checksums[a] for a in checksums):
                logger.info("%s already downloaded and verified", dest.name)
                if progress is not None:
                    progress.update(dest.stat().st_size)
                return FetchResult(dest, url, dest.stat().st_size, digests, skipped=True)
            # fetch() only renames a verified download to `dest`, so this file is someone else's (a copy
            # fetched by hand, cut short) or was damaged since: not ours to replace.
            named = ", ".join(a for a in checksums if digests[a] != checksums[a])
            raise ExistingFileError(
                f"{dest} is already there but does not match its published {named} checksum, so it is not a "
                "verified copy bertpipe wrote; move it aside (or delete it) and rerun to download it"
            )

        resumed_from = part.stat().st_size if part.exists() else 0
        if resumed_from and progress is not None:
            progress.update(resumed_from)
        digest = RunningDigest(algorithms)
        retry = policy.retry(cancel)
        while True:
            try:
                outcome = _attempt(url, dest, expected_size, policy, retry, progress, cancel, digest)
                if outcome is None:
                    break
                if cancel is not None and cancel.is_set():
                    raise Cancelled(url)  # the read was cut by `Cancel.set`, not by the network
                # urllib3 retries up to the response headers; a body cut short is resumed here, on the same budget.
                retry = retry.increment("GET", url, error=outcome.error)
            except MaxRetryError as err:
                have = part.stat().st_size if part.exists() else 0
                resume = (f"{part.name} ({have} bytes) is kept: rerun the same command to resume from byte {have}"
                          if have else "nothing was received; rerun the same command when the network is back")
                raise NetworkError(
                    f"gave up on {url} after {policy.max_retries} retr{'y' if policy.max_retries == 1 else 'ies'} "
                    f"(last error: {_describe(err.reason)}); {resume}"
                ) from None
            except OSError as err:
                if err.errno in (errno.ENOSPC, errno.EDQUOT):
                    raise _disk_full(dest, err) from None
                raise
            retry.sleep()

        size = part.stat().st_size
        if expected_size is not None and size != expected_size:
            raise ChecksumMismatchError(
                f"{part} has {size} bytes but the mirror lists {expected_size}; it was kept but not used: "
                f"delete it and rerun to download {dest.name} afresh"
            )
        digest.sync(part)
        digests = digest.hexdigests()
        for algorithm, want in checksums.items():
            if digests[algorithm] != want:
                raise ChecksumMismatchError(
                    f"{dest.name}: {algorithm} checksum mismatch (published {want}, downloaded {digests[algorithm]}); "
                    f"the file was kept as {part} but will not be used: delete it and rerun to download it afresh, "
                    "or try another --mirror"
                )
        publish(part, dest)
        meta.unlink(missing_ok=True)
        return FetchResult(dest, url, size, digests, resumed_from=resumed_from, retries=retry.retries)


def _attempt(
    url: str,
    dest: Path,
    expected_size: int | None,
    policy: RetryPolicy,
    retry: Retry,
    progress: ByteProgress | None,
    cancel: threading.Event | None,
    digest: RunningDigest,
) -> _Attempt | None:
    """One request; None when `dest.part` is complete, else the read error to retry on. Fatal errors
    (and `MaxRetryError` once urllib3 has spent the budget) raise."""
    part, meta = part_path(dest), _meta_path(dest)
    offset = part.stat().st_size if part.exists() else 0
    if offset and not meta.exists():
        # No record of ours beside it (written before the first byte): someone else's partial download
        # (a browser's NAME.part), never ours to delete.
        raise ExistingFileError(f"{part} is there and bertpipe did not start it (no {meta.name} beside it); "
                                "move it aside and rerun")
    saved = _read_meta(meta, url) if offset else {}
    if offset and not saved:
        # Bytes of another URL (another mirror, edition or date) or of unknown origin: resuming would
        # splice two files, which nothing catches where no checksum is published (books).
        logger.warning("%s was not started from %s; starting over", part, url)
        _restart(part, progress, offset)
        offset = 0
    if expected_size is not None and offset > expected_size:
        logger.warning("%s is longer than the published size; starting over", part)
        _restart(part, progress, offset)
        offset, saved = 0, {}
    if expected_size is not None and offset == expected_size:
        return None
    headers: dict[str, str] = {}
    if offset:
        headers["Range"] = f"bytes={offset}-"
        validator = saved.get("etag") or saved.get("last_modified")
        if validator:
            headers["If-Range"] = validator
    resp = _get(url, retry, policy, headers)
    try:
        if resp.status == 416 and offset:
            # Range not satisfiable: the partial file already holds the whole resource (or more).
            full = _content_range_total(resp.headers.get("Content-Range", ""))
            if full == offset:
                return None
            _restart(part, progress, offset)
            return _Attempt(ProtocolError("stale partial file (416)"))
        if resp.status in (404, 410):
            raise NotFoundError(url)
        if resp.status >= 400:
            raise _status_error(url, resp, policy)
        length = resp.headers.get("Content-Length")
        if resp.status != 206:
            # Checked before a partial file is given up: an error page sent as 200 must not cost it.
            if resp.headers.get("Content-Type", "").lower().startswith("text/html"):
                raise DownloadError(f"{url} answered with an HTML page, not the file (an error, login or captive "
                                    "portal page); check the --mirror, or try again later")
            if expected_size is not None and length is not None and int(length) != expected_size:
                raise DownloadError(f"{url} is {length} bytes but the dump's status file lists {expected_size}; the "
                                    "mirror may be mid-sync: try again later or use another --mirror")
        if resp.status == 206:
            start = _content_range_start(resp.headers.get("Content-Range", ""))
            if start != offset:
                _restart(part, progress, offset)
                return _Attempt(ProtocolError(f"server resumed at byte {start}, not {offset}"))
            mode = "ab"
        else:
            if offset:
                # 200 to a Range request: the server ignored it or the file changed (If-Range).
                logger.warning("%s: the server sent the whole file; restarting from byte 0", dest.name)
                _restart(part, progress, offset)
                offset = 0
            mode = "wb"
        total = offset + int(length) if length is not None else expected_size
        if expected_size is not None and total is not None and total != expected_size:
            raise DownloadError(
                f"{url} is {total} bytes but the dump's status file lists {expected_size}; the mirror "
                "may be mid-sync: try again later or use another --mirror"
            )
        _write_meta(meta, url, resp.headers, total)
        if mode == "wb":
            digest.reset()
        else:
            digest.sync(part)
        reading = cancel.reading(resp) if isinstance(cancel, Cancel) else contextlib.nullcontext()
        with reading, open(part, mode) as f:
            # read1: what has arrived (<= CHUNK); read() would drop it if the connection died mid-CHUNK.
            while block := resp.read1(CHUNK):
                if cancel is not None and cancel.is_set():
                    raise Cancelled(url)
                f.write(block)
                digest.update(block)
                if progress is not None:
                    progress.update(len(block))
    except (ProtocolError, TransportError) as err:
        if isinstance(err, MaxRetryError):
            raise
        return _Attempt(err)  # cut mid-body: what reached the part file is kept and resumed from
    finally:
        resp.close()  # never hand a connection with unread bytes back to the pool
    have = part.stat().st_size
    if total is not None and have < total:
        return _Attempt(ProtocolError(f"connection closed {total - have} bytes short"))
    return None


def _restart(part: Path, progress: ByteProgress | None, had: int) -> None:
    part.unlink(missing_ok=True)
    if progress is not None:
        progress.update(-had)


def _content_range_start(value: str) -> int | None:
    # "bytes 100-999/1000"
    try:
        return int(value.split()[1].split("-")[0])
    except (IndexError, ValueError):
        return None


def _content_range_total(value: str) -> int | None:
    # "bytes */1000"
    try:
        return int(value.rsplit("/", 1)[1])
    except (IndexError, ValueError):
        return None


def _read_meta(meta: Path, url: str) -> dict:
    try:
        data = json.loads(meta.read_text())
    except (OSError, ValueError):
        return {}
    return data if isinstance(data, dict) and data.get("url") == url else {}


def _write_meta(meta: Path, url: str, headers, total: int | None) -> None:
    data = {"url": url, "etag": headers.get("ETag"), "last_modified": headers.get("Last-Modified"), "size": total}
    meta.write_text(json.dumps(data))
