"""A SIGTERM to `bertpipe` alone, passed on to the Beam worker processes it started (`launch.cli`'s handler calls
`stop_children` for the commands in `SIGTERM_REACHES_CHILDREN`).

`kill PID`, `docker stop` and Kubernetes signal the main process only; Ctrl-C reaches the terminal's whole
process group. A child left running can hold the command's exit (and its --out lock) forever.
"""

from __future__ import annotations

import logging
import os
import signal
import threading
import time

# Commands whose child processes a SIGTERM to `bertpipe` alone must stop too. `corpus --direct_num_workers=N`
# runs Beam's SDK workers as children (`/bin/sh -c python -m ...sdk_worker_main`), and Beam's clean-up after
# the interrupt joins the thread waiting on each of them without a timeout: a worker left waiting for work
# that never comes held the exit, and the --out lock, forever (about 1 SIGTERM in 2). Ctrl-C reaches them
# with the terminal's whole group; `kill PID`, `docker stop` and Kubernetes signal the main process alone.
# Not every command: a DataLoader worker dying by a signal is an error its parent raises over the interrupt.
SIGTERM_REACHES_CHILDREN = ("corpus",)
# How long the forwarded SIGTERM has to end them before they are SIGKILLed.
CHILDREN_GRACE_S = 5.0


# What Beam's SubprocessSdkWorkerHandler runs (`/bin/sh -c "python -m ..."`: the shell's command line holds it too).
BEAM_WORKER = b"apache_beam.runners.worker.sdk_worker_main"


def _workers() -> list[int]:
    """This process's descendants that run a Beam worker (parents first), from /proc; [] where there is no
    /proc (not Linux). Only those: a process a wrapper started before it exec'd bertpipe (`sidecar & exec
    bertpipe corpus ...`) is bertpipe's child too, and not bertpipe's to stop."""
    children: dict[int, list[int]] = {}
    try:
        pids = [int(name) for name in os.listdir("/proc") if name.isdigit()]
    except OSError:
        return []
    for pid in pids:
        try:
            with open(f"/proc/{pid}/stat", "rb") as f:
                stat = f.read()
            ppid = int(stat[stat.rindex(b")") + 2:].split()[1])  # after "pid (comm) state"; comm may hold ")"
        except (OSError, ValueError, IndexError):
            continue  # ended meanwhile
        children.setdefault(ppid, []).append(pid)
    found, queue = [], [os.getpid()]
    while queue:
        kids = children.get(queue.pop(0), [])
        found += [pid for pid in kids if _runs_beam_worker(pid)]
        queue += kids
    return found


def _runs_beam_worker(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            return BEAM_WORKER in f.read()
    except OSError:  # ended meanwhile
        return False


def _signal(pids: list[int], sig: int) -> None:
    for pid in pids:
        try:
            os.kill(pid, sig)
        except OSError:  # ended meanwhile
            pass


def stop_children(grace: float = CHILDREN_GRACE_S) -> None:
    """SIGTERM to every Beam worker we started now, parents first (the shell between us and a worker ends with
    it, silently, rather than reporting "Terminated"); for `grace` seconds, to any that starts meanwhile (a
    worker whose start was under way); then SIGKILL to any left. In a daemon thread, never holding the exit."""
    _quiet_after_stop()
    signalled = set(_workers())
    _signal(sorted(signalled), signal.SIGTERM)

    def sweep() -> None:
        deadline = time.monotonic() + grace
        while time.monotonic() < deadline:
            time.sleep(0.2)
            new = [pid for pid in _workers() if pid not in signalled]
            signalled.update(new)
            _signal(new, signal.SIGTERM)
        _signal(_workers(), signal.SIGKILL)

    threading.Thread(target=sweep, name="bertpipe-stop-children", daemon=True).start()


def _thread_error_after_stop(args: threading.ExceptHookArgs) -> None:
    """`threading.excepthook` once a SIGTERM stopped the children: a thread that waited on one (Beam's
    `run_worker`: "Worker subprocess exited with return code -15") ends with an error that is the stop
    itself, logged at debug rather than printed as a traceback beside the command's one line."""
    logging.getLogger(__name__).debug("thread %s ended after SIGTERM: %r", getattr(args.thread, "name", "?"),
                                      args.exc_value)


class _DropBeamTracebacksAfterStop(logging.Filter):
    """Once a SIGTERM stopped the workers, Beam logs their broken connections with a traceback ("Failed to
    read inputs in the data plane", "Error closing worker_handler"): the stop itself, said in one line."""

    def filter(self, record: logging.LogRecord) -> bool:
        return not (record.exc_info and record.name.startswith("apache_beam"))


def _quiet_after_stop() -> None:
    threading.excepthook = _thread_error_after_stop
    for handler in logging.getLogger().handlers:
        if not any(isinstance(f, _DropBeamTracebacksAfterStop) for f in handler.filters):
            handler.addFilter(_DropBeamTracebacksAfterStop())
