"""The Ray a sweep runs on: a cluster it connects to, or a local Ray that never outlives the sweep.

    with ray_session(address=None, num_cpus=2, temp_dir=None):
        ...  # ray.tune work

A local Ray is started by `ray.init` in this process. Ray ties its own services (GCS, raylet) to this
process with PR_SET_PDEATHSIG, but not what the raylet starts (the dashboard and runtime-env agents,
the workers running trials): killed with SIGKILL, the driver would leave those running and its temp
dir behind. So, before `ray.init`, we start a watchdog (this file run as a script: stdlib only, in its
own session so that neither a Ctrl-C nor a kill of the driver's process group reaches it). While the
driver lives, the watchdog keeps a list of the processes below the driver that were not there before
(pid and start time, every `POLL_S`); every process this Ray starts also inherits a token in its
environment. When the driver ends
(its pipe reaches EOF: a normal stop, an exception, or a SIGKILL nothing can catch; or the watchdog is
re-parented), the watchdog kills those processes and removes the temp dir if bertpipe created it (the
marker file `MARKER` proves it), and the folders above it the sweep created for it, while empty.
Which cluster an address means, and what is refused beside one: `launch.finetune.ray_address`.
"""

from __future__ import annotations

import argparse
import errno
import itertools
import logging
import os
import re
import select
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from contextlib import contextmanager, suppress
from pathlib import Path
from typing import Callable, Iterator

if __name__ != "__main__":  # for ray_session; the watchdog (this file run as a script) uses the standard library alone
    from launch.finetune.ray_sigterm import _EndIfStuck, _SigtermKept, _sigterm_as_interrupt

logger = logging.getLogger(__name__)

OWNER_ENV = "BERTPIPE_RAY_OWNER"
# Ray's metrics export stays off in the local Ray: a sweep on one machine reads no Ray metrics (nor a
# dashboard), and that export once killed a sweep's driver with a SIGSEGV in its OpenTelemetry reader
# thread (`TemporalMetricStorage::buildMetrics`, Ray 2.60) a second after `ray.init`. With both off, no
# Ray process starts the metric recorder or its exporter thread.
NO_METRICS = {"enable_metrics_collection": False, "enable_open_telemetry": False}
MARKER = ".bertpipe-ray-temp"
PARENTS_MADE = "parents created: "  # a marker line: how many folders above the temp dir the sweep created
TRIES = 5  # a new parent shared with sweeps started beside this one may go (their clean-up) as we use it
# Ray puts a socket at TEMP/session_<date>_<time>_<microseconds>_<pid>/sockets/plasma_store, and a Unix socket's
# path has at most 107 bytes (Ray refuses longer ones mid-start, with a traceback): what that leaves TEMP.
_SOCKET_UNDER_TEMP = "/session_2026-01-01_00-00-00_000000_4194304/sockets/plasma_store"
TEMP_DIR_MAX = 107 - len(_SOCKET_UNDER_TEMP)
POLL_S = 0.5  # how often the watchdog looks at the driver's process tree
# After a SIGTERM, how long the driver may take to stop its local Ray before it is ended (`_EndIfStuck`); a clean
# stop took ~10 s where the GCS had already gone, and Ray's own exit comes 60 s after the GCS went.
STOP_WITHIN_S = 20
AUTH_SETUP_LOGGER = "ray._private.authentication.authentication_token_setup"


def _drop_token_auth_enabled_warning(record: logging.LogRecord) -> bool:
    return not str(record.msg).startswith("Token authentication is enabled for this Ray cluster.")


def _stat(pid: int) -> tuple[int, int] | None:
    """(parent pid, start time) of a running process, None when it is gone (or only a zombie)."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            fields = f.read().rsplit(b")", 1)[1].split()
    except OSError:
        return None
    if fields[0] in (b"Z", b"X"):
        # A leader that exited while its other threads run still shows Z: the process lives on.
        try:
            states = [(Path(task.path) / "stat").read_bytes().rsplit(b")", 1)[1].split()[0]
                      for task in os.scandir(f"/proc/{pid}/task") if task.name != str(pid)]
        except OSError:
            states = []
        if not any(state not in (b"Z", b"X") for state in states):
            return None
    return int(fields[1]), int(fields[19])


def descendants(root: int) -> dict[int, int]:
    """Every running process below `root`, as pid -> start time (which tells a reused pid apart)."""
    children: dict[int, list[tuple[int, int]]] = {}
    for entry in os.scandir("/proc"):
        if entry.name.isdigit() and (stat := _stat(int(entry.name))) is not None:
            children.setdefault(stat[0], []).append((int(entry.name), stat[1]))
    found, todo = {}, [root]
    while todo:
        for pid, start in children.get(todo.pop(), []):
            found[pid] = start
            todo.append(pid)
    return found


def new_descendants(driver_pid: int, before: dict[int, int], watchdog_pid: int) -> dict[int, int]:
    """The local Ray's processes: what runs below the driver and was not there `before` the watchdog and
    `ray.init` (a test's own Ray, a notebook's tools are left alone)."""
    return {pid: start for pid, start in descendants(driver_pid).items()
            if before.get(pid) != start and pid != watchdog_pid}


def token_pids(token: str) -> dict[int, int]:
    """Running processes whose environment holds `token`, as pid -> start time. Ray's Python processes
    rewrite their title over the environment block, so this misses some: `new_descendants` covers those."""
    needle = f"{OWNER_ENV}={token}".encode()
    found = {}
    for entry in os.scandir("/proc"):
        if not entry.name.isdigit():
            continue
        try:
            with open(f"/proc/{entry.name}/environ", "rb") as f:
                environ = f.read()
        except OSError:  # gone, or not ours to read
            continue
        if needle in environ.split(b"\0") and (stat := _stat(int(entry.name))) is not None:
            found[int(entry.name)] = stat[1]
    return found


def stop_processes(known: dict[int, int], token: str) -> int:
    """SIGKILL the Ray processes in `known` (pid -> start time) and those carrying `token`; returns how
    many. Their cluster is gone, nothing is left to shut down in order, so no SIGTERM first (Ray's agents
    ignore it anyway)."""
    targets = {**known, **token_pids(token)}
    targets.pop(os.getpid(), None)
    killed = set()
    for _ in range(3):  # a worker may have been starting while we looked
        alive = [pid for pid, start in targets.items() if (stat := _stat(pid)) is not None and stat[1] == start]
        if not alive:
            break
        for pid in alive:
            try:
                os.kill(pid, signal.SIGKILL)
                killed.add(pid)
            except ProcessLookupError:
                pass
        time.sleep(0.2)
        targets.update(token_pids(token))
    return len(killed)


def remove_temp_dir(temp_dir: Path) -> bool:
    """Delete a Ray temp dir, only if bertpipe created it (its marker file is there), and the parents it
    created for it (the marker counts them), those only while empty: nothing anyone else put there goes."""
    try:
        made = re.findall(rf"^{PARENTS_MADE}(\d+)$", (temp_dir / MARKER).read_text(), re.MULTILINE)
    except (OSError, UnicodeDecodeError):
        return False
    shutil.rmtree(temp_dir, ignore_errors=True)
    _remove_parents(temp_dir, int(made[0]) if made else 0)
    return True


def _remove_parents(path: Path, count: int) -> None:
    for parent in list(path.parents)[:count]:
        try:
            parent.rmdir()
        except OSError:  # not empty (someone else's file), or gone: it and those above stay
            return


def _make_dirs(path: Path) -> int:
    """Create `path` and its missing parents; how many of the parents right above it this call created (what
    `remove_temp_dir` may remove again). Sweeps started together may share a new parent: one another sweep made
    meanwhile is used, not counted, and one its clean-up removed under us is made again. An OSError (a parent is
    a file, /proc, no permission) is a ValueError naming --ray-temp-dir, and what this call made is removed."""
    made: list[Path] = []
    failed: OSError | None = None
    for _ in range(TRIES):
        missing = list(itertools.takewhile(lambda p: not os.path.lexists(p), [path, *path.parents]))
        try:
            for folder in reversed(missing):
                try:
                    folder.mkdir()
                    made.append(folder)
                except FileExistsError:  # another sweep's, made since we looked: used, never removed by us
                    pass
            failed = None
            break
        except OSError as err:  # ENOENT: a parent removed under us (tried again), or where none can be made
            failed = err
    if failed is None and path not in made:  # the temp dir itself is another's (a sweep given the same one)
        failed = FileExistsError(errno.EEXIST, "made by another process meanwhile", str(path))
    if failed is not None:
        for folder in reversed(made):
            with suppress(OSError):
                folder.rmdir()
        raise ValueError(f"cannot create --ray-temp-dir {path}: {failed.strerror}: {failed.filename}; name a folder "
                         "that can be created (or leave the flag out)") from None
    return sum(1 for _ in itertools.takewhile(lambda p: p in made, path.parents))


def check_temp_dir(temp_dir: str) -> None:
    """Refuse a --ray-temp-dir that is a file (Ray's own error named --out, and left a sweep half-started
    there), whose path leaves Ray's sockets under it no room (TEMP_DIR_MAX), or that cannot be created: a
    folder is made in its nearest existing parent, and removed, before anything is written to --out (a
    traceback, or an error blaming --out, came later). The missing parents are not made here: another sweep
    starting beside this one may be making them."""
    if not temp_dir:
        raise ValueError("--ray-temp-dir is empty; name a directory (or leave the flag out)")
    if os.path.exists(temp_dir) and not os.path.isdir(temp_dir):
        raise ValueError(f"--ray-temp-dir {temp_dir} is a file; name a directory (or leave the flag out)")
    length = len(os.fsencode(Path(temp_dir).resolve()))
    if length > TEMP_DIR_MAX:
        raise ValueError(f"--ray-temp-dir {temp_dir} is {length} bytes long as an absolute path; Ray's socket files "
                         f"under it would pass the 107-byte limit of a Unix socket path: name one of at most "
                         f"{TEMP_DIR_MAX} (or leave the flag out)")
    path = Path(temp_dir).resolve()
    for _ in range(TRIES):
        if path.exists():
            return
        nearest = next(p for p in path.parents if os.path.lexists(p))
        try:
            os.rmdir(tempfile.mkdtemp(prefix=".bertpipe-probe-", dir=nearest))
            return
        except FileNotFoundError as err:  # `nearest` removed since we looked (another sweep's clean-up), or /proc
            failed = err
        except OSError as err:
            failed = err
            break
    raise ValueError(f"cannot create --ray-temp-dir {path}: {failed.strerror}: {nearest}; name a folder that "
                     "can be created (or leave the flag out)") from None


def _make_temp_dir(temp_dir: str | None) -> tuple[Path, bool]:
    """(the temp dir, whether bertpipe created it and so may delete it)."""
    made = ""  # the marker's count of the parents created for it, removed with it
    if temp_dir is None:
        base = tempfile.gettempdir()
        if len(os.fsencode(base)) + len("/bertpipe-ray-12345678") > TEMP_DIR_MAX:
            logger.info("the temp dir %s is too long a path for Ray's sockets under it; the local Ray uses /tmp", base)
            base = "/tmp"
        path = Path(tempfile.mkdtemp(prefix="bertpipe-ray-", dir=base))
    else:
        path = Path(temp_dir).resolve()
        if path.exists():  # the user's folder, even an empty one: used, never deleted
            return path, False
        parents = _make_dirs(path)
        if parents:
            made = f"{PARENTS_MADE}{parents}\n"
    (path / MARKER).write_text(f"created by bertpipe sweep (pid {os.getpid()}) for its local Ray; "
                               f"deleted when that sweep ends\n{made}")
    return path, True


class LocalRay:
    """A local Ray started by this process, its watchdog, and how to stop both."""

    def __init__(self, num_cpus: int | None, temp_dir: str | None, on_shutdown: Callable[[], None] = lambda: None):
        import ray

        self.on_shutdown = on_shutdown  # right after ray.shutdown, before the watchdog's clean-up is waited for
        self._handing_over = threading.Lock()
        self.temp_dir, self.owned = _make_temp_dir(temp_dir)
        self.token = f"{os.getpid()}-{os.urandom(8).hex()}"
        self.before = descendants(os.getpid())
        watch = [sys.executable, "-I", __file__, "--driver-pid", str(os.getpid()), "--token", self.token,
                 "--temp-dir", str(self.temp_dir), "--before", ",".join(f"{p}:{t}" for p, t in self.before.items())]
        self.watchdog = subprocess.Popen(watch + (["--owned"] if self.owned else []), stdin=subprocess.PIPE,
                                         start_new_session=True)
        self._saved_env = os.environ.get(OWNER_ENV)
        os.environ[OWNER_ENV] = self.token
        # Ray turns token authentication on for a new local cluster and warns that it did, inviting
        # RAY_AUTH_MODE=disabled: for a cluster of this process alone, on by default is right and not news.
        # (Setting RAY_AUTH_MODE=token here instead breaks ray.init: Ray has read its mode at import.)
        logging.getLogger(AUTH_SETUP_LOGGER).addFilter(_drop_token_auth_enabled_warning)
        try:
            ray.init(num_cpus=num_cpus, _temp_dir=str(self.temp_dir), include_dashboard=False,
                     # a copy: Ray writes its spilling settings into the dict, and a second local Ray in
                     # this process (the demo runs two sweeps) then warned they came from an "unstable API"
                     logging_level="WARNING", _system_config=dict(NO_METRICS))
        except BaseException:
            self.stop()
            raise

    def stop(self) -> None:
        import ray

        # While Ray shuts down too: the handler `ray.init` set (back since the sweep's own ended) exits 15
        # on SIGTERM, silently, leaving the temp dir to no one.
        self.on_shutdown()
        try:
            ray.shutdown()
        finally:
            self.on_shutdown()
            if self._saved_env is None:
                os.environ.pop(OWNER_ENV, None)
            else:
                os.environ[OWNER_ENV] = self._saved_env
            self.hand_over()

    def hand_over(self) -> None:
        """Have the watchdog kill what is left of this Ray and remove its temp dir, and wait for that. Once:
        the deadline after SIGTERM (`_EndIfStuck`) may call it while the main thread is still in `stop`."""
        with self._handing_over:
            if self.watchdog.returncode is not None:
                return
            handed_over = True
            try:  # "stop" then EOF: the watchdog kills stragglers and removes the temp dir
                self.watchdog.stdin.write(b"stop\n")
                self.watchdog.stdin.close()
            except (OSError, ValueError):  # ValueError: closed already, by an earlier hand-over cut short
                handed_over = False
            try:
                handed_over = self.watchdog.wait(timeout=30) == 0 and handed_over
            except subprocess.TimeoutExpired:
                self.watchdog.kill()
                self.watchdog.wait()
                handed_over = False
            if not handed_over:  # the watchdog died or hung: clean up here instead
                _cleanup(new_descendants(os.getpid(), self.before, self.watchdog.pid), self.token, self.temp_dir,
                         self.owned)


def check_trial_fits(wants: dict[str, tuple[str, float]], have: dict[str, float], address: str | None) -> None:
    """Each trial's request (flag -> (resource, amount)) against the cluster's resources: a local Ray cannot
    grow, and Ray would wait forever for a node that has them (a ValueError); a cluster's autoscaler may
    add one (a warning)."""
    for flag, (kind, want) in wants.items():
        if want <= have.get(kind, 0):
            continue
        if address is None:
            raise ValueError(f"{flag} {want:g} asks for more {kind}s than the local Ray has ({have.get(kind, 0):g}); "
                             f"lower it{' or raise --num-cpus' if kind == 'CPU' else ''}")
        logger.warning("%s %g: the Ray cluster at %s has %g %ss now; trials wait until its autoscaler adds a node "
                       "that has them", flag, want, address, have.get(kind, 0), kind)


@contextmanager
def ray_session(address: str | None = None, num_cpus: int | None = None,
                temp_dir: str | None = None) -> Iterator[None]:
    """Use the Ray already initialised in this process, the cluster at `address` (or RAY_ADDRESS, as
    under `ray job submit`; `launch.finetune.ray_address`), or else a local Ray that is stopped and cleaned
    up however this process ends. `num_cpus` and `temp_dir` (None: not given) are the local Ray's alone."""
    import ray

    from launch.finetune.ray_address import check_address, connect, effective_address

    if ray.is_initialized():
        yield
        return
    check_address(address, num_cpus, temp_dir)  # e.g. --num-cpus beside an address: refused, not ignored
    sigterm = _SigtermKept()
    if effective_address(address)[0]:
        connect(address)  # one line, not Ray's traceback (or minutes of retries), where the cluster is not there
        try:
            with _sigterm_as_interrupt():
                yield
        finally:
            ray.shutdown()
            sigterm.restore()
        return
    local = LocalRay(num_cpus, temp_dir, on_shutdown=sigterm.restore)
    logger.info("started a local Ray (%s CPUs, temp dir %s)", num_cpus or "all", local.temp_dir)
    deadline = _EndIfStuck(STOP_WITHIN_S, before_exit=local.hand_over)
    try:
        with _sigterm_as_interrupt():
            yield
    finally:
        try:
            local.stop()
        finally:
            deadline.close()


def _cleanup(known: dict[int, int], token: str, temp_dir: Path, owned: bool) -> tuple[int, bool]:
    return stop_processes(known, token), owned and remove_temp_dir(temp_dir)


def _watch(driver_pid: int, before: dict[int, int], token: str, temp_dir: Path, owned: bool) -> None:
    """Wait for the driver to end, then clean up after its Ray."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    received = b""
    known: dict[int, int] = {}
    while os.getppid() == driver_pid:  # re-parented: the driver is gone, even if a fork kept the pipe open
        # Taken while the driver lives: once it dies, its orphans are re-parented and the tree is lost.
        # Kept, not replaced: a process re-parented early (its raylet died) is still this Ray's.
        known.update(new_descendants(driver_pid, before, os.getpid()))
        ready, _, _ = select.select([sys.stdin], [], [], POLL_S)
        if ready:
            chunk = os.read(sys.stdin.fileno(), 4096)
            if not chunk:  # EOF: the driver stopped (it wrote "stop" first) or died
                break
            received += chunk
    stopped, removed = _cleanup(known, token, temp_dir, owned)
    if b"stop" not in received:
        try:
            print(f"bertpipe sweep: the sweep (pid {driver_pid}) ended without stopping its local Ray; stopped "
                  f"{stopped} Ray process(es)" + (f" and removed {temp_dir}" if removed else ""),
                  file=sys.stderr, flush=True)
        except OSError:  # the driver's stderr may be gone with it
            pass


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description="watchdog of a sweep's local Ray (started by LocalRay)")
    parser.add_argument("--driver-pid", type=int, required=True)
    parser.add_argument("--token", required=True)
    parser.add_argument("--temp-dir", type=Path, required=True)
    parser.add_argument("--before", default="", help="pid:start_time,... of the driver's older descendants")
    parser.add_argument("--owned", action="store_true")
    args = parser.parse_args()
    older = dict((int(p), int(t)) for p, t in (item.split(":") for item in args.before.split(",") if item))
    _watch(args.driver_pid, older, args.token, args.temp_dir, args.owned)
