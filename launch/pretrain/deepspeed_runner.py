"""DeepSpeed's runner that does not exit 0 when what it started was killed:
`python -m launch.pretrain.deepspeed_runner [deepspeed's flags] --module launch.pretrain [bertpipe pretrain's flags]`.

The `deepspeed` command starts one process, `mpirun` (or pdsh, or on one node DeepSpeed's local
launcher), waits for it and exits with its code only when that code is positive. A process killed by
a signal has a negative code, so when the out-of-memory killer (or anyone) SIGKILLs mpirun, `deepspeed`
exits 0 and a Kubernetes job (the MPIJob, the TrainJob) counts the unfinished run as done. This module
runs DeepSpeed's own runner (flags, hostfile and launchers unchanged) and, in that case, names the signal
in one line and exits 128 + its number, as a shell reports it, so the job restarts and `--resume`
continues from the last checkpoint. On one node its local launcher exits 256 - N for a rank killed by
signal N (247 for SIGKILL); that too becomes one line and 128 + N. A hostfile or resource request the
runner refuses is one line and exit 2, a user error, not its traceback. Every other exit is the runner's own.
"""

from __future__ import annotations

import logging
import os
import subprocess
import sys
from typing import Any

log = logging.getLogger("launch.pretrain.deepspeed_runner")  # also when run as __main__


class _RecordingSubprocess:
    """What DeepSpeed's runner module sees as `subprocess`: the module itself, except that Popen
    remembers the processes it starts (the runner keeps its child in a local variable)."""

    def __init__(self) -> None:
        self.started: list[subprocess.Popen] = []

    def __getattr__(self, name: str) -> Any:
        return getattr(subprocess, name)

    def Popen(self, *args: Any, **kwargs: Any) -> subprocess.Popen:  # noqa: N802 (subprocess's name)
        process = subprocess.Popen(*args, **kwargs)
        self.started.append(process)
        return process


LOCAL_LAUNCHER = "deepspeed.launcher.launch"
# How DeepSpeed's runner words the hostfile and resource checks it refuses with a ValueError (runner.py).
REFUSALS = ("Hostfile", "Hostname", "No slot", "include_str", "Cannot specify", "Num nodes")


def _argv(args: Any) -> list[str]:
    return [str(a) for a in args] if isinstance(args, (list, tuple)) else str(args).split()


def _named(args: Any) -> str:
    argv = _argv(args)
    if LOCAL_LAUNCHER in argv:
        return f"DeepSpeed's local launcher ({LOCAL_LAUNCHER})"
    return os.path.basename(argv[0]) if argv else "its launcher"


def main(argv: list[str] | None = None) -> int:
    from deepspeed.launcher import runner

    from launch.log import setup_logging
    from launch.pretrain.launcher import exit_code, signal_name

    setup_logging()
    recording = _RecordingSubprocess()
    runner.subprocess = recording
    code = 0
    try:
        runner.main(argv)
    except SystemExit as stop:  # the runner's own exit: a positive code from its child, or a usage error
        if isinstance(stop.code, str):
            print(stop.code, file=sys.stderr)
        code = stop.code if isinstance(stop.code, int) else 0 if stop.code is None else 1
    except ValueError as err:  # the hostfile or its flags, before anything started: a retry repeats it
        if not str(err).startswith(REFUSALS):
            raise
        log.error("deepspeed runner: %s", err)
        return 2
    finally:
        runner.subprocess = subprocess
    if not recording.started:
        return code
    started = recording.started[0]
    # Negative when it was killed by a signal, which the runner exits 0 for.
    child, what = started.returncode, f"{_named(started.args)}, started by the deepspeed runner,"
    if LOCAL_LAUNCHER in _argv(started.args) and 128 + 64 < child < 256:
        # The local launcher exits sys.exit(-N) for a rank killed by signal N: the shell reads 256 - N.
        # (It names the first failed rank its poll finds; its own line above says which.)
        child, what = child - 256, "a rank under DeepSpeed's local launcher"
    if child >= 0:
        return code
    # Its ranks may have said more; a SIGKILL is on Linux usually the out-of-memory killer, which `dmesg` names.
    log.error("%s was killed by %s (exit %d); the run stopped: continue from its last checkpoint with --resume", what,
              signal_name(-child), exit_code(child))
    return exit_code(child)


if __name__ == "__main__":
    sys.exit(main())
