"""Start N local worker processes of `launch.pretrain` (what `bertpipe pretrain --nproc N` does).

The processes are started and watched by torch's elastic launch API (`torch.distributed.run`'s
`elastic_launch`, standalone c10d rendezvous on this machine): it sets RANK / LOCAL_RANK /
WORLD_SIZE / MASTER_ADDR / MASTER_PORT and, if one worker fails, stops the others. Two things are
ours on top of it:
- SIGTERM, SIGINT and SIGUSR1 are forwarded to every worker, which checkpoints at the next step and exits
  128 + the signal (143, 130, 138); the launcher returns that code. (Left to the elastic agent, a signal shuts the group down with a
  deadline after which it SIGKILLs the workers, and the launcher fails whatever they did.)
- OMP_NUM_THREADS is set (the cores divided among the workers): unset, a CPU run was 5x slower.
"""

from __future__ import annotations

import logging
import os
import signal
import socket
import sys
import uuid
from typing import Sequence

from launch.environ import restoring_environ

log = logging.getLogger(__name__)

# What stops a run with a checkpoint: SIGTERM (preemption), SIGINT (Ctrl-C), SIGUSR1 (what mpirun passes
# on to the ranks without killing the job, as it does on SIGTERM; the MPI manifests' preStop sends it).
STOP_SIGNALS = (signal.SIGTERM, signal.SIGINT, signal.SIGUSR1)


# What a worker killed by a signal it did not ask for usually means (the launcher's one line about it).
KILLED_BY = {
    signal.SIGKILL: "on Linux usually the kernel's out-of-memory killer (`dmesg` names it): give the run more "
                    "memory or a smaller --data.micro-batch-size",
    signal.SIGBUS: "a memory-mapped file shrank under it (a corpus shard rewritten or cut short during the run)",
    signal.SIGSEGV: "a crash in native code",
    signal.SIGABRT: "an abort in native code",
}


# A rank's exit code when a collective failed because another rank stopped: never the cause while the
# rank that stopped is among the failures (its code is the run's), only when that one ran elsewhere.
PEER_STOPPED_EXIT = 4


def cause(failures: Sequence[tuple[int, int]]) -> tuple[int, int]:
    """The (rank, exit code) that ended the run, from the failed workers' in the order the elastic agent
    saw them fail (negative code: killed by that signal). The agent records the workers that failed on
    their own first and those it then stopped after them (SIGTERM, or SIGKILL after the grace), so the
    first is the cause; a SIGTERM is never one, unless every worker got it (then the launcher's own stop,
    or one before the workers' handlers were set). Workers that failed by the same poll are in rank order:
    a rank that lost its peer (PEER_STOPPED_EXIT) may come before the one that was killed."""
    for skip in ((-signal.SIGTERM, PEER_STOPPED_EXIT), (-signal.SIGTERM,)):
        found = next((f for f in failures if f[1] not in skip), None)
        if found is not None:
            return found
    return failures[0]


def exit_code(code: int) -> int:
    """A worker's exit code as the launcher returns it: a signal as the shell reports it, 128 + its number."""
    return 128 - code if code < 0 else code or 1


def report_killed(rank: int, code: int) -> None:
    """One line for a worker killed by a signal: it had no chance to say why, and the others' errors
    (a peer gone from a collective) are about it, not the cause."""
    if code >= 0 or -code in STOP_SIGNALS:
        return  # it exited itself, after saying why, or was stopped as asked
    why = KILLED_BY.get(-code)
    log.error("worker rank %d was killed by %s (exit %d)%s; the run stopped: continue from its last checkpoint with "
              "--resume", rank, signal_name(-code), exit_code(code), f": {why}" if why else "")


def signal_name(signum: int) -> str:
    """SIGKILL for 9; a number without a name as `signal N`."""
    try:
        return signal.Signals(signum).name
    except ValueError:
        return f"signal {signum}"


def free_port() -> int:
    """A TCP port free on the loopback address now (for a lone process's rendezvous)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def launch_local(nproc: int, worker_argv: Sequence[str], grace_s: float = 10.0,
                 program: Sequence[str] = ("-m", "launch.pretrain")) -> int:
    """Run `python *program *worker_argv` in `nproc` processes; 0, or the first failed worker's exit code.

    `grace_s`: after a worker fails, how long the others get to exit before they are killed (they
    are usually blocked in a collective with the dead one, so there is nothing to wait for).
    """
    import psutil
    from torch.distributed.elastic.multiprocessing.errors import ChildFailedError
    from torch.distributed.elastic.multiprocessing import DefaultLogsSpecs
    from torch.distributed.launcher.api import LaunchConfig, elastic_launch

    threads = os.environ.get("OMP_NUM_THREADS") or str(max(1, (os.cpu_count() or 1) // nproc))
    config = LaunchConfig(
        min_nodes=1, max_nodes=1, nproc_per_node=nproc, run_id=f"bertpipe-{uuid.uuid4().hex[:8]}",
        rdzv_backend="c10d", rdzv_endpoint="127.0.0.1:0", max_restarts=0, monitor_interval=0.2,
        start_method="spawn", signals_to_handle="SIGHUP,SIGQUIT", shutdown_timeout=int(grace_s),
        # The workers' output is not redirected, so there are no logs to keep: without this the agent made a
        # /tmp/torchelastic_*/ tree per launch that nothing removed.
        logs_specs=DefaultLogsSpecs(log_dir=os.devnull),
    )
    me = psutil.Process()
    # The agent logs each failure ("failed (exitcode: 1) local_rank: 0 ...") in its own format; the
    # failing worker has already said why in one line, and we return its exit code.
    quiet = [logging.getLogger(name) for name in list(logging.root.manager.loggerDict)
             if name.startswith("torch.distributed.elastic")]
    levels = [lg.level for lg in quiet]
    for lg in quiet:
        lg.setLevel(logging.CRITICAL)

    received: list[int] = []

    def forward(signum: int, _frame) -> None:
        received.append(signum)
        for child in me.children():  # the workers: the agent starts them as our direct children
            try:
                child.send_signal(signum)
            except psutil.NoSuchProcess:
                pass

    previous = {s: signal.signal(s, forward) for s in STOP_SIGNALS}
    log.info("starting %d worker process(es) with %s OpenMP thread(s) each", nproc, threads)
    try:
        # elastic_launch sets TORCHELASTIC_SIGNALS_TO_HANDLE in this process; both are put back afterwards.
        with restoring_environ("OMP_NUM_THREADS", "TORCHELASTIC_SIGNALS_TO_HANDLE"):
            os.environ["OMP_NUM_THREADS"] = threads  # workers inherit the launcher's environment
            elastic_launch(config, entrypoint=sys.executable)(*program, *worker_argv)
        return 0
    except ChildFailedError as err:
        # err.failures keeps the agent's order (the dict it filled as it saw the workers fail).
        rank, code = cause([(rank, f.exitcode) for rank, f in err.failures.items()])
        report_killed(rank, code)
        if code < 0 and -code in received:  # the stop we passed on, outside the workers' handler (set while they train)
            log.error("stopped by %s while the workers started or shut down, outside training: nothing is lost "
                      "beyond the last checkpoint; continue with the same command plus --resume (exit %d)",
                      signal_name(-code), exit_code(code))
        return exit_code(code)
    finally:
        for lg, level in zip(quiet, levels):
            lg.setLevel(level)
        for s, handler in previous.items():
            signal.signal(s, handler)
