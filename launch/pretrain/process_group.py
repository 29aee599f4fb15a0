"""The process group the ranks share, and how they stop together.

`init_distributed` joins the group the launcher describes (or makes a group of one). A user error that
one rank finds must stop every rank at the same point, or the others wait in their next collective
(under NCCL, for its whole timeout): `on_rank0` runs a check on rank 0 for all, `same_on_every_rank`
runs it on each and compares, and both raise `StoppedTogether` on every rank (`ReportedByRankZero` on
all but rank 0, so the message is printed once) or `RankZeroFailed` for a fault.
"""

from __future__ import annotations

import datetime
import logging
import os
import signal
import socket
import sys
import warnings
from typing import Any, Callable

import torch.distributed as dist

from launch.log import launcher_world_size
from launch.pretrain.launcher import free_port

log = logging.getLogger(__name__)

# Collective timeout (minutes) unless DEEPSPEED_TIMEOUT sets one; see init_distributed.
DIST_TIMEOUT_MINUTES = 60


def init_distributed() -> None:
    """Join the process group the launcher describes (a lone process makes a group of one)."""
    import deepspeed
    from deepspeed.accelerator import get_accelerator

    # torch 2.13 warns on every collective DeepSpeed makes with the older names; once is plenty.
    warnings.filterwarnings("ignore", category=FutureWarning, module=r"torch\.distributed")
    # DeepSpeed's barriers name no device; NCCL's warns that it takes the current one, which the trainer sets.
    warnings.filterwarnings("ignore", message=r"barrier\(\): using the device under current context")
    launched = launcher_world_size() is not None
    if launched:
        end_with_launcher()
    # Under mpirun (Kubeflow TrainJob/MPIJob, `deepspeed --launcher openmpi`) RANK is unset at start-up:
    # DeepSpeed discovers the ranks from MPI itself, so only a truly lone process gets a group of one.
    if "RANK" not in os.environ and not launched:
        os.environ.update(RANK="0", WORLD_SIZE="1", LOCAL_RANK="0", MASTER_ADDR="127.0.0.1",
                          MASTER_PORT=str(free_port()))
    if not dist.is_initialized():
        backend = "nccl" if get_accelerator().device_name() == "cuda" else "gloo"
        if backend == "gloo":
            # On CPU DeepSpeed JIT-compiles a shared-memory all-reduce op as it joins the group, for
            # `inference_all_reduce`, which only its inference engine calls; training's collectives go
            # through gloo. The op cost a minute of C++ build on a fresh machine (and a compiler), 66 MB of
            # /dev/shm a rank that DeepSpeed never unlinked, and, when a run was killed mid-build, a lock
            # on which every later run waited in silence. Marked unavailable, DeepSpeed does without it, and
            # a bertpipe run builds no DeepSpeed op at all (its optimizers are its own, offload included).
            from deepspeed.ops.op_builder.cpu import ShareMemCommBuilder

            deepspeed.ops.__compatible_ops__[ShareMemCommBuilder.NAME] = False
        # The other ranks wait in a collective while rank 0 hashes the corpus (preflight, every launch):
        # tens of GiB over network storage outlast DeepSpeed's 10-minute default, and a restarted job
        # would time out the same way each time. DEEPSPEED_TIMEOUT (minutes) still sets it.
        minutes = int(os.environ.get("DEEPSPEED_TIMEOUT", DIST_TIMEOUT_MINUTES))
        deepspeed.init_distributed(dist_backend=backend, timeout=datetime.timedelta(minutes=minutes))


def end_with_launcher() -> None:
    """Have the kernel kill this worker when the launcher that started it dies (PR_SET_PDEATHSIG; Linux).

    A launcher killed with SIGKILL (`kill -9`, the OOM killer) left its workers training on as orphans:
    they held the GPUs and went on writing the run directory, whose lock `bertpipe pretrain --nproc N`
    holds in the launcher, so a restarted run took the lock over and wrote beside them. Like any kill,
    this loses the steps since the last checkpoint. A launcher that stops normally waits for its
    workers first, so they never see this signal then."""
    if not sys.platform.startswith("linux"):
        return
    import ctypes

    pr_set_pdeathsig = 1
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.prctl(pr_set_pdeathsig, int(signal.SIGKILL), 0, 0, 0) != 0:
        log.warning("could not ask to end with the launcher (prctl: %s): if the launcher is killed, end this "
                    "worker (pid %d) yourself", os.strerror(ctypes.get_errno()), os.getpid())


class StoppedTogether(ValueError):
    """A user error that every rank of the group stops with (`on_rank0`'s): none of them is left inside a
    collective, so each can leave the group before it exits. Rank 0 reports it."""


class ReportedByRankZero(StoppedTogether):
    """The same user error as rank 0's, which reports it: other ranks exit with it quietly."""


def stopped_together(message: str) -> StoppedTogether:
    """The error of a user error that every rank meets at the same point: rank 0 says it, the others stop
    quietly, and all can leave the group."""
    return (StoppedTogether if dist.get_rank() == 0 else ReportedByRankZero)(message)


class RankZeroFailed(dist.DistError):
    """Rank 0 met a fault (not a user error) in `on_rank0`: the other ranks stop with it (exit 4, a lost
    peer's) rather than wait for rank 0 in their next collective, which under NCCL lasts its timeout."""


def on_rank0(fn: Callable[[], Any]) -> Any:
    """`fn()` on rank 0 alone (a check that reads every file, an export or a conversion that must not
    run twice); its result, or its error, reaches every rank, so that all stop together."""
    box = [None, None, None]
    if dist.get_rank() == 0:
        try:
            box[0] = fn()
        except ValueError as err:
            box[1] = str(err)
        except Exception as err:
            box[2] = f"{type(err).__name__}: {err}"
            dist.broadcast_object_list(box, src=0)
            raise  # with its traceback, here
    dist.broadcast_object_list(box, src=0)
    if box[2] is not None:
        raise RankZeroFailed(f"rank 0 failed in a step it took for every rank ({box[2]})")
    if box[1] is not None:
        raise stopped_together(box[1])
    return box[0]


def same_on_every_rank(fn: Callable[[], Any], key: Callable[[Any], Any], where: str, differs: str) -> Any:
    """`fn()` on every rank (opening the corpus each reads, where nodes may hold their own copies): a
    ValueError on any rank, or a `key` of its result unlike rank 0's, stops every rank together with one
    message naming that rank, its host and `where` (what it read); `differs` says what differs and what to do."""
    result, error = None, None
    try:
        result = fn()
    except ValueError as err:
        error = str(err)
    views: list[Any] = [None] * dist.get_world_size()
    dist.all_gather_object(views, (socket.gethostname(), where, error, None if error else key(result)))
    for rank, (host, _, err, _) in enumerate(views):
        if err is not None:
            raise stopped_together(err if rank == 0 else f"rank {rank} on {host}: {err}")
    host0, where0, _, value0 = views[0]
    for rank, (host, where, _, value) in enumerate(views):
        if value != value0:
            raise stopped_together(f"rank {rank} on {host} ({where}) and rank 0 on {host0} ({where0}) {differs}")
    return result
