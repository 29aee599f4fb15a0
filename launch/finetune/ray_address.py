"""The Ray cluster a sweep is sent to (`--address`, or RAY_ADDRESS as under `ray job submit`), checked in one
line each before anything is written or started, where Ray itself gave a traceback, retried for minutes, or
attached to the wrong Ray:

- the address is the one `ray.init` will use (RAY_ADDRESS replaces a missing address and `auto`, as in Ray);
- `auto` means the cluster `ray start` recorded on this machine (Ray's bootstrap file, `ray_current_cluster`),
  never what Ray's legacy fallback finds by scanning for any GCS process: that found other sweeps' private
  local Rays, and the sweep then waited for their CPUs, or died with them;
- `--num-cpus` and `--ray-temp-dir` shape only the local Ray: beside an address they would do nothing;
- the cluster must answer on its port (a stopped one made `ray.init` retry for minutes);
- a cluster with no GPU now may be an autoscaling one whose GPU workers come later: trials would not wait
  for them but run on CPUs, so the sweep is told what to take (`--gpus-per-trial`).

Used by `local_ray.ray_session` and `tune_sweep.run_sweep`; kept apart from `local_ray.py`, whose
watchdog runs on the standard library alone.
"""

from __future__ import annotations

import logging
import os
import socket

ADDRESS_ENV = "RAY_ADDRESS"
CLIENT_PORT = 10001  # a ray:// address without a port: Ray client's default
PROBE_S = 10  # how long the cluster's port may take to accept a connection


def effective_address(address: str | None) -> tuple[str | None, str]:
    """(the address `ray.init` connects to, how the user set it, for messages). Ray's own rule: a non-empty
    RAY_ADDRESS replaces a missing address or `auto`; any other given address wins over it."""
    env = os.environ.get(ADDRESS_ENV) or None
    if env and address in (None, "auto"):
        return env, f"RAY_ADDRESS={env}" + (" (which replaces --address auto)" if address else "")
    return address, f"--address {address}"


def _host_port(address: str) -> tuple[str, int] | None:
    """(host, port) of `HOST:PORT` or `ray://HOST[:PORT]`, None for any other form."""
    client = address.startswith("ray://")
    rest = address[len("ray://"):] if client else address
    if "://" in rest or "/" in rest:
        return None
    if rest.startswith("["):  # [IPv6]:PORT
        host, _, tail = rest[1:].partition("]")
        port = tail[1:] if tail.startswith(":") else ""
    else:
        host, sep, port = rest.rpartition(":")
        if not sep:
            host, port = rest, ""
    port = port or (str(CLIENT_PORT) if client else "")
    return (host, int(port)) if host and port.isdigit() else None


def bootstrap_file() -> str:
    """Where `ray start` on this machine records its cluster's address (Ray's `ray_current_cluster`)."""
    from ray._common.utils import get_ray_address_file

    return get_ray_address_file(None)


def check_address(address: str | None, num_cpus: int | None = None, temp_dir: str | None = None) -> None:
    """Refuse (ValueError, one line) what a sweep's Ray settings cannot do, before anything is written or
    started: a form of address Ray cannot use, `auto` with no `ray start` cluster on this machine, and
    flags for the local Ray beside an address. None for `num_cpus` and `temp_dir` is "not given"."""
    address, how = effective_address(address)
    if not address:
        return
    local_only = [flag for flag, value in (("--num-cpus", num_cpus), ("--ray-temp-dir", temp_dir)) if value is not None]
    if local_only:
        also = "unset RAY_ADDRESS" if how.startswith("RAY_ADDRESS") else "drop --address"
        raise ValueError(f"{' and '.join(local_only)} only set{'s' if len(local_only) == 1 else ''} up the local Ray, "
                         f"and {how} runs the sweep on a Ray cluster, where {'it' if len(local_only) == 1 else 'they'} "
                         f"would be ignored; drop {' and '.join(local_only)} (or {also} for a local Ray)")
    if address == "local":  # Ray's word for a new local Ray, which would then have no watchdog (local_ray.py)
        raise ValueError(f"{how}: leave the address out (and unset RAY_ADDRESS) for a local Ray")
    if address == "auto":
        if not _auto_target():
            raise ValueError(f"{how}: no Ray cluster recorded by `ray start` on this machine (no "
                             f"{bootstrap_file()}: one started with --temp-dir, or under another TMPDIR or RAY_TMPDIR, "
                             "records itself elsewhere); start one with `ray start --head`, give the cluster's "
                             "address (HOST:6379, or ray://HOST:10001 from outside it), or leave --address out for a "
                             "local Ray")
    elif "://" not in address.removeprefix("ray://") and _host_port(address) is None:
        raise ValueError(f"{how} is not an address Ray can use; give auto, HOST:PORT (the head's GCS, 6379 by "
                         "default) or ray://HOST:10001")


def _auto_target() -> str | None:
    from ray._private.services import find_bootstrap_address

    return find_bootstrap_address(None)


def connect(address: str | None) -> None:
    """`ray.init` to the cluster at `address` (RAY_ADDRESS as `ray.init` reads it), or a ValueError in one line
    naming the address and where it came from. A cluster that does not answer on its port is refused within
    PROBE_S: `ray.init` retried a stopped GCS for minutes, and a ray:// address for 30 s, then raised. Called
    after `check_address` (`local_ray.ray_session`)."""
    import ray

    address, how = effective_address(address)
    target = _auto_target() if address == "auto" else address
    where = f"the Ray cluster at {target} ({how}" + (f", recorded in {bootstrap_file()} by `ray start`)"
                                                    if address == "auto" else ")")
    if (host_port := _host_port(target)) is not None:
        try:
            socket.create_connection(host_port, timeout=PROBE_S).close()
        except OSError as err:
            why = err.strerror or str(err) or type(err).__name__
            stale = "; it may have stopped without `ray stop`" if address == "auto" else ""
            raise ValueError(f"cannot reach {where}: {why}{stale}; start the cluster, or fix --address "
                             "(or RAY_ADDRESS)") from None
    try:
        ray.init(address=address, logging_level=logging.WARNING)
    except (ConnectionError, TimeoutError, RuntimeError) as err:  # Ray's: refused, timed out, version mismatch
        ray.shutdown()
        first = next((line.strip() for line in str(err).splitlines() if line.strip()), type(err).__name__)
        raise ValueError(f"cannot connect to {where}: {first}; start the cluster, or fix --address "
                         "(or RAY_ADDRESS)") from None


def gpus_per_trial(given: float | None, have: dict[str, float], address: str | None) -> float:
    """`--gpus-per-trial` as given, else 1 where the Ray has a GPU now, else 0 on the local Ray (which cannot
    grow). A cluster without a GPU now is refused: the shipped autoscaling cluster has none until trials ask
    for one (its head has no resources, its GPU workers start at 0), and 0 ran every trial on CPUs there."""
    if given is not None:
        return given
    if have.get("GPU", 0) >= 1:
        return 1
    address, how = effective_address(address)
    if not address:
        return 0
    raise ValueError(f"the Ray cluster ({how}) has no GPU now, and its autoscaler may add GPU workers only once "
                     "trials ask for them; say what each trial takes: --gpus-per-trial 1 (GPU workers) or "
                     "--gpus-per-trial 0 (CPUs)")
