"""Start N local worker processes of `launch.pretrain` (what `bertpipe pretrain --nproc N` does).

A small torchrun for one machine: each worker gets RANK / LOCAL_RANK / WORLD_SIZE / MASTER_ADDR /
MASTER_PORT; SIGTERM and SIGINT are forwarded to every worker (they checkpoint and exit 0); if one
worker fails the others are terminated, so a crash never leaves the group hanging in a collective.
"""

from __future__ import annotations

import logging
import os
import signal
import socket
import subprocess
import sys
import time
from typing import Sequence

log = logging.getLogger(__name__)


def free_port() -> int:
    """A TCP port free on the loopback address now (for the local rendezvous)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def launch_local(nproc: int, worker_argv: Sequence[str], grace_s: float = 120.0,
                 program: Sequence[str] = ("-m", "launch.pretrain")) -> int:
    """Run `python *program *worker_argv` in `nproc` processes; the worst exit code wins."""
    port = free_port()
    threads = os.environ.get("OMP_NUM_THREADS") or str(max(1, (os.cpu_count() or 1) // nproc))
    procs: list[subprocess.Popen] = []
    for rank in range(nproc):
        env = dict(os.environ, RANK=str(rank), LOCAL_RANK=str(rank), WORLD_SIZE=str(nproc),
                   LOCAL_WORLD_SIZE=str(nproc), MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port),
                   OMP_NUM_THREADS=threads)
        procs.append(subprocess.Popen([sys.executable, *program, *worker_argv], env=env))
    log.info("started %d worker process(es) (pids %s), rendezvous on port %d", nproc, [p.pid for p in procs], port)

    def forward(signum: int, _frame) -> None:
        for p in procs:
            if p.poll() is None:
                p.send_signal(signum)

    previous = {s: signal.signal(s, forward) for s in (signal.SIGTERM, signal.SIGINT)}
    try:
        while True:
            codes = [p.poll() for p in procs]
            failed = [c for c in codes if c not in (None, 0)]
            if failed:
                _terminate(procs, grace_s=10.0)
                return max(abs(c) for c in failed) or 1
            if all(c == 0 for c in codes):
                return 0
            time.sleep(0.2)
    finally:
        for s, handler in previous.items():
            signal.signal(s, handler)
        _terminate(procs, grace_s=grace_s)


def _terminate(procs: list[subprocess.Popen], grace_s: float) -> None:
    for p in procs:
        if p.poll() is None:
            p.terminate()
    deadline = time.monotonic() + grace_s
    for p in procs:
        try:
            p.wait(timeout=max(0.1, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            p.kill()
            p.wait()
