"""How a sweep's driver takes SIGTERM while Ray runs (moved out of `local_ray.py`, which uses them in
`ray_session`): as Ctrl-C (`_sigterm_as_interrupt`), with the handler from before `ray.init` put back after
`ray.shutdown` (`_SigtermKept`), and ended by a deadline where Ray blocks it (`_EndIfStuck`)."""

from __future__ import annotations

import os
import signal
import socket
import sys
import threading
from contextlib import contextmanager
from typing import Any, Callable, Iterator


class _SigtermKept:
    """The process's SIGTERM handler before Ray's: `ray.init` sets its own, and `ray.shutdown` leaves SIGTERM at
    the operating system's default (Python still reports Ray's), which killed the process silently after the
    sweep (writing its results, or the rest of `bertpipe demo`). `restore` puts the earlier one back."""

    def __init__(self) -> None:
        self.main = threading.current_thread() is threading.main_thread()
        self.handler = signal.getsignal(signal.SIGTERM) if self.main else None

    def restore(self) -> None:
        if self.main and self.handler is not None:
            signal.signal(signal.SIGTERM, self.handler)


class _EndIfStuck:
    """Ends this process (the command's interrupt line, exit 143) if it has not stopped `seconds` after a SIGTERM.

    A SIGTERM to the whole process group (`timeout`, a terminal's `kill -TERM -PGID`) stops the local Ray's GCS
    too. A driver then blocked in a call to the GCS (Tune polls its resources) neither runs its Python signal
    handler nor returns: Ray ends the process itself 60 s after the GCS went, with exit 1 and a line of its
    own; and one whose handler did run can block the same way in `ray.shutdown`. The signal is seen here by
    the C-level handler's write to `signal.set_wakeup_fd`, which happens even while the main thread is
    blocked; then, after `seconds`, the watchdog is handed the clean-up (`before_exit`) and the process ends."""

    def __init__(self, seconds: float, before_exit: Callable[[], None]):
        self.done = threading.Event()
        # Who ends the process is decided once, under this lock: the deadline (which then prints the line), or
        # the main thread's `close` (whose caller prints it); never both.
        self._decide = threading.Lock()
        self._ending = False
        self.previous = None
        if threading.current_thread() is not threading.main_thread():  # signals reach the main thread only
            return
        self.reader, self.writer = socket.socketpair()
        self.writer.setblocking(False)
        self.previous = signal.set_wakeup_fd(self.writer.fileno(), warn_on_full_buffer=False)
        threading.Thread(target=self._watch, args=(seconds, before_exit), name="bertpipe-sigterm-deadline",
                         daemon=True).start()

    def _watch(self, seconds: float, before_exit: Callable[[], None]) -> None:
        from launch.errors import Terminated, stopped_line

        with self.reader:
            while signal.SIGTERM not in (chunk := self.reader.recv(64)):
                if not chunk:  # closed: the session ended
                    return
            if self.done.wait(seconds):
                return
            with self._decide:
                if self.done.is_set():
                    return
                self._ending = True
            try:
                before_exit()
            finally:
                print(stopped_line(Terminated()), file=sys.stderr, flush=True)
                sys.stdout.flush()  # os._exit skips the interpreter's own flush
                os._exit(Terminated.exit_code)

    def close(self) -> None:
        with self._decide:
            self.done.set()
            ending = self._ending
        if ending:  # the deadline ends the process and prints the line: nothing here may print after it
            threading.Event().wait()
        if self.previous is None:
            return
        mine = signal.set_wakeup_fd(self.previous)
        if mine != self.writer.fileno():  # another wakeup fd replaced ours meanwhile: it stays
            signal.set_wakeup_fd(mine)
        self.writer.close()  # the reader sees EOF


@contextmanager
def _sigterm_as_interrupt() -> Iterator[None]:
    """SIGTERM stops the driver as Ctrl-C does (finished trials kept, one line, exit 143). Ray's own handler,
    set by `ray.init`, printed a stack dump and exited 1, or aborted (134) when the whole group got it."""
    from launch.errors import Terminated

    if threading.current_thread() is not threading.main_thread():
        yield
        return

    received: list[int] = []

    def stop(signum: int, _frame: Any) -> None:
        received.append(signum)
        raise Terminated

    previous = signal.signal(signal.SIGTERM, stop)
    try:
        yield
    except KeyboardInterrupt:
        if received:  # Tune re-raises a plain KeyboardInterrupt of its own
            raise Terminated from None
        raise
    finally:
        signal.signal(signal.SIGTERM, previous)
