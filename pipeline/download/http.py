"""A resumable, verifying HTTP downloader on the standard library (urllib).

`fetch(url, dest, ...)` writes to `dest.part` while it downloads and renames to `dest` only after
the file's size and checksums verify, so a reader of the output directory never sees a half-written
or unverified file under its final name. Interrupted downloads resume with an HTTP `Range` request
from the byte the partial file reached (guarded by `If-Range` with the server's ETag or
Last-Modified, so a file that changed upstream restarts instead of being spliced). Transient
failures (connection drops, timeouts, 429/5xx) are retried with capped exponential backoff and
jitter; every retry resumes rather than restarts.
"""

from __future__ import annotations

import errno
import hashlib
import http.client
import json
import logging
import os
import random
import shutil
import threading
import time
import urllib.error
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path
from typing import Mapping

from pipeline.download.checksums import hash_file
from pipeline.download.errors import (
    ChecksumMismatchError,
    DiskFullError,
    DownloadError,
    NetworkError,
    NotFoundError,
)

logger = logging.getLogger(__name__)

# Wikimedia asks for a descriptive User-Agent; the default Python-urllib one may be throttled.
USER_AGENT = "bertpipe-download/0.1 (BERT pre-training data pipeline; Python urllib)"
CHUNK = 1 << 20
RETRY_STATUS = frozenset({408, 425, 429, 500, 502, 503, 504})
# What urllib/http.client raise when a connection drops, resets or stalls mid-transfer.
TRANSIENT = (urllib.error.URLError, http.client.HTTPException, ConnectionError, TimeoutError)


@dataclass(frozen=True)
class RetryPolicy:
    """How hard to try: `max_retries` retries after the first attempt, backoff doubling from `backoff_s`."""

    max_retries: int = 5
    backoff_s: float = 1.0
    max_backoff_s: float = 60.0
    timeout_s: float = 60.0

    def delay(self, retry: int, retry_after: float | None = None) -> float:
        if retry_after is not None:
            return min(retry_after, self.max_backoff_s)
        # Full jitter keeps parallel workers that failed together from retrying in lockstep.
        return random.uniform(0.5, 1.0) * min(self.max_backoff_s, self.backoff_s * 2 ** (retry - 1))


class Cancelled(Exception):
    """Raised in download threads once `cancel` is set (Ctrl-C in the main thread)."""


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
    retry_after: float | None = None
    reason: str = ""
    extra: dict = field(default_factory=dict)


class _RunningDigest:
    """Digests of `dest.part` kept up to date as bytes are written, so a finished download needs no
    second pass over a multi-GB file; re-synced from disk when the part file and the digests differ
    (a resume from an earlier run, or a restart)."""

    def __init__(self, algorithms: tuple[str, ...]) -> None:
        self.algorithms = algorithms
        self.reset()

    def reset(self) -> None:
        self.hashers = {name: hashlib.new(name) for name in self.algorithms}
        self.n = 0

    def update(self, block: bytes) -> None:
        for h in self.hashers.values():
            h.update(block)
        self.n += len(block)

    def sync(self, part: Path) -> None:
        size = part.stat().st_size if part.exists() else 0
        if size == self.n:
            return
        self.reset()
        if size:
            with open(part, "rb") as f:
                while block := f.read(CHUNK):
                    self.update(block)

    def hexdigests(self) -> dict[str, str]:
        return {name: h.hexdigest() for name, h in self.hashers.items()}


def _request(url: str, headers: Mapping[str, str] | None = None) -> urllib.request.Request:
    # identity: a transparently gzip-compressed response would break byte offsets for Range.
    base = {"User-Agent": USER_AGENT, "Accept-Encoding": "identity"}
    return urllib.request.Request(url, headers={**base, **(headers or {})})


def get_bytes(url: str, policy: RetryPolicy, not_found_hint: str = "") -> bytes:
    """A small file (status JSON, checksum list, catalogue) into memory, with the same retries."""
    for retry in range(policy.max_retries + 1):
        try:
            with urllib.request.urlopen(_request(url), timeout=policy.timeout_s) as resp:
                data = resp.read()
                length = resp.headers.get("Content-Length")
                if length is not None and len(data) != int(length):
                    raise http.client.IncompleteRead(data, int(length) - len(data))
                return data
        except urllib.error.HTTPError as err:
            if err.code in (404, 410):
                raise NotFoundError(url, not_found_hint) from None
            if err.code not in RETRY_STATUS:
                raise DownloadError(f"{url} answered HTTP {err.code} {err.reason}") from None
            reason, retry_after = f"HTTP {err.code}", _retry_after(err.headers)
        except TRANSIENT as err:
            reason, retry_after = _describe(err), None
        if retry == policy.max_retries:
            raise NetworkError(
                f"could not fetch {url} after {retry + 1} attempts (last error: {reason}); "
                "check the network or the --mirror URL and rerun"
            )
        wait = policy.delay(retry + 1, retry_after)
        logger.warning("fetching %s failed (%s); retry %d/%d in %.1fs", url, reason, retry + 1, policy.max_retries, wait)
        time.sleep(wait)
    raise AssertionError("unreachable")


def _retry_after(headers) -> float | None:
    value = headers.get("Retry-After") if headers else None
    try:
        return float(value) if value is not None else None
    except ValueError:  # an HTTP date: fall back to our own backoff
        return None


def _describe(err: BaseException) -> str:
    if isinstance(err, urllib.error.URLError) and not isinstance(err, urllib.error.HTTPError):
        return f"{type(err.reason).__name__}: {err.reason}"
    if isinstance(err, http.client.IncompleteRead):
        return f"connection closed after {len(err.partial)} bytes of the response, {err.expected} short"
    return f"{type(err).__name__}: {err}"


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

    if dest.exists() and checksums:
        digests = hash_file(dest, algorithms)
        if all(digests[a] == checksums[a] for a in checksums):
            logger.info("%s already downloaded and verified", dest.name)
            if progress is not None:
                progress.update(dest.stat().st_size)
            return FetchResult(dest, url, dest.stat().st_size, digests, skipped=True)
        logger.warning("%s exists but does not match its checksum; downloading it again", dest)

    resumed_from = part.stat().st_size if part.exists() else 0
    if resumed_from and progress is not None:
        progress.update(resumed_from)
    digest = _RunningDigest(algorithms)
    retries = 0
    while True:
        try:
            outcome = _attempt(url, dest, expected_size, policy, progress, cancel, digest)
        except OSError as err:
            if err.errno in (errno.ENOSPC, errno.EDQUOT):
                raise _disk_full(dest, err) from None
            raise
        if outcome is None:
            break
        retries += 1
        have = part.stat().st_size if part.exists() else 0
        if retries > policy.max_retries:
            raise NetworkError(
                f"gave up on {url} after {retries} attempt{'s' if retries > 1 else ''} (last error: {outcome.reason}); "
                f"{part.name} ({have} bytes) is kept: rerun the same command to resume from byte {have}"
            )
        wait = policy.delay(retries, outcome.retry_after)
        logger.warning(
            "%s: %s at byte %d; retry %d/%d in %.1fs (resuming)",
            dest.name, outcome.reason, have, retries, policy.max_retries, wait,
        )
        if cancel is not None and cancel.wait(wait):
            raise Cancelled(url)
        if cancel is None:
            time.sleep(wait)

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
    os.replace(part, dest)
    meta.unlink(missing_ok=True)
    return FetchResult(dest, url, size, digests, resumed_from=resumed_from, retries=retries)


def _attempt(
    url: str,
    dest: Path,
    expected_size: int | None,
    policy: RetryPolicy,
    progress: ByteProgress | None,
    cancel: threading.Event | None,
    digest: _RunningDigest,
) -> _Attempt | None:
    """One request; None when `dest.part` is complete, else why to retry. Fatal errors raise."""
    part, meta = part_path(dest), _meta_path(dest)
    offset = part.stat().st_size if part.exists() else 0
    saved = _read_meta(meta, url) if offset else {}
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
    try:
        with urllib.request.urlopen(_request(url, headers), timeout=policy.timeout_s) as resp:
            if resp.status == 206:
                start = _content_range_start(resp.headers.get("Content-Range", ""))
                if start != offset:
                    _restart(part, progress, offset)
                    return _Attempt(reason=f"server resumed at byte {start}, not {offset}")
                mode = "ab"
            else:
                if offset:
                    # 200 to a Range request: the server ignored it or the file changed (If-Range).
                    logger.warning("%s: the server sent the whole file; restarting from byte 0", dest.name)
                    _restart(part, progress, offset)
                    offset = 0
                mode = "wb"
            length = resp.headers.get("Content-Length")
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
            with open(part, mode) as f:
                while block := resp.read(CHUNK):
                    if cancel is not None and cancel.is_set():
                        raise Cancelled(url)
                    f.write(block)
                    digest.update(block)
                    if progress is not None:
                        progress.update(len(block))
    except urllib.error.HTTPError as err:
        if err.code == 416 and offset:
            # Range not satisfiable: the partial file already holds the whole resource (or more).
            full = _content_range_total(err.headers.get("Content-Range", ""))
            if full == offset:
                return None
            _restart(part, progress, offset)
            return _Attempt(reason="stale partial file (416)")
        if err.code in (404, 410):
            raise NotFoundError(url) from None
        if err.code in RETRY_STATUS:
            return _Attempt(retry_after=_retry_after(err.headers), reason=f"HTTP {err.code} {err.reason}")
        raise DownloadError(f"{url} answered HTTP {err.code} {err.reason}") from None
    except TRANSIENT as err:
        return _Attempt(reason=_describe(err))
    have = part.stat().st_size
    if total is not None and have < total:
        return _Attempt(reason=f"connection closed {total - have} bytes short")
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
    return data if data.get("url") == url else {}


def _write_meta(meta: Path, url: str, headers, total: int | None) -> None:
    data = {"url": url, "etag": headers.get("ETag"), "last_modified": headers.get("Last-Modified"), "size": total}
    meta.write_text(json.dumps(data))
