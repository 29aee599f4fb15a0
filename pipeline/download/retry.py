"""The retry budget of a download: urllib3's `Retry`, made to log, to stop on Ctrl-C, to wait before
the first retry as `--backoff` says and not to spend the budget on redirects; and `Cancel`, the flag
Ctrl-C sets, which also wakes the transfers blocked in a read."""

from __future__ import annotations

import contextlib
import itertools
import logging
import random
import threading
import time
from dataclasses import dataclass

import urllib3
from urllib3.exceptions import MaxRetryError, ProtocolError
from urllib3.util.retry import Retry

logger = logging.getLogger("pipeline.download.http")  # one logger for the download's network messages

RETRY_STATUS = frozenset({408, 425, 429, 500, 502, 503, 504})


@dataclass(frozen=True)
class RetryPolicy:
    """How hard to try: `max_retries` retries after the first attempt, backoff doubling from `backoff_s`."""

    max_retries: int = 5
    backoff_s: float = 1.0
    max_backoff_s: float = 60.0
    timeout_s: float = 60.0

    def retry(self, cancel: threading.Event | None = None) -> "_Retry":
        """One `Retry` budget for a whole file: urllib3 spends it up to the headers, we on cut bodies."""
        retry = _Retry(
            total=self.max_retries, redirect=10, allowed_methods=frozenset({"GET"}),
            status_forcelist=RETRY_STATUS, raise_on_status=False, respect_retry_after_header=True,
            # Jitter keeps parallel workers that failed together from retrying in lockstep.
            backoff_factor=self.backoff_s, backoff_max=self.max_backoff_s, backoff_jitter=self.backoff_s,
            retry_after_max=self.max_backoff_s,
        )
        retry.cancel = cancel
        return retry

    @property
    def timeout(self) -> urllib3.Timeout:
        return urllib3.Timeout(connect=self.timeout_s, read=self.timeout_s)


class _Retry(Retry):
    """urllib3's `Retry`, logging each retry and sleeping on the `cancel` event (Ctrl-C stops a wait)."""

    cancel: threading.Event | None = None

    def new(self, **kw) -> "_Retry":
        new = super().new(**kw)
        new.cancel = self.cancel
        return new

    @property
    def retries(self) -> int:
        return sum(1 for h in self.history if h.redirect_location is None)

    def increment(self, method=None, url=None, response=None, error=None, _pool=None, _stacktrace=None) -> "_Retry":
        # A redirect is not a failure, but urllib3 takes it from `total` too, so `--retries 0` failed on
        # any mirror that redirects. Only `redirect` (10 hops) bounds redirects here.
        if error is None and response is not None and response.get_redirect_location() and self.total is not None:
            return Retry.increment(self.new(total=self.total + 1), method, url, response, error, _pool, _stacktrace)
        return super().increment(method, url, response, error, _pool, _stacktrace)

    def get_backoff_time(self) -> float:
        """`backoff_factor` before the first retry, doubling per failure in a row, plus jitter, at most
        `backoff_max` (urllib3's own retries the first failure at once, not what `--backoff` promises)."""
        failures = len(list(itertools.takewhile(lambda h: h.redirect_location is None, reversed(self.history))))
        if failures == 0:
            return 0.0
        wait = self.backoff_factor * 2 ** (failures - 1) + random.random() * self.backoff_jitter
        return float(max(0.0, min(self.backoff_max, wait)))

    def sleep(self, response=None) -> None:
        wait = self.get_retry_after(response) if response is not None and self.respect_retry_after_header else None
        wait = self.get_backoff_time() if not wait else wait
        last = self.history[-1] if self.history else None
        reason = (describe(last.error) if last.error else f"HTTP {last.status}") if last else "?"
        logger.warning("%s: %s; retry %d in %.1fs", last.url if last else "", reason, self.retries, wait)
        if self.cancel is not None:
            if self.cancel.wait(wait):
                raise Cancelled(last.url if last else "")
        else:
            time.sleep(wait)


class Cancelled(Exception):
    """Raised in download threads once `cancel` is set (Ctrl-C in the main thread)."""


class Cancel(threading.Event):
    """A cancel flag that, when set, also shuts down the sockets of the responses being read: a worker
    blocked in a read on a stalled connection would otherwise hold Ctrl-C for up to `--timeout`."""

    def __init__(self) -> None:
        super().__init__()
        self._lock = threading.Lock()
        self._reading: set = set()

    def set(self) -> None:
        super().set()
        with self._lock:
            reading = list(self._reading)
        for resp in reading:
            _shutdown(resp)

    @contextlib.contextmanager
    def reading(self, resp):
        """While the body of `resp` is read: a `set()` meanwhile interrupts the read."""
        with self._lock:
            self._reading.add(resp)
        try:
            if self.is_set():
                _shutdown(resp)
            yield
        finally:
            with self._lock:
                self._reading.discard(resp)


def _shutdown(resp) -> None:
    with contextlib.suppress(Exception):  # already closed or handed back: nothing left to wake
        resp.shutdown()


def describe(err: BaseException | None) -> str:
    """One line for a transport error, unwrapped from urllib3's wrappers."""
    if isinstance(err, MaxRetryError):
        err = err.reason
    if isinstance(err, ProtocolError) and err.args and isinstance(err.args[-1], BaseException):
        err = err.args[-1]  # urllib3 wraps the socket or http.client error
    return f"{type(err).__name__}: {err}"
