"""Start a CLI the way a user's interactive shell does, for tests that send it signals.

A command started with `&` from a non-interactive shell (CI scripts, `nohup`, a backgrounded
`make test`) inherits SIGINT and SIGQUIT ignored, and Python then installs no KeyboardInterrupt
handler: a test's Ctrl-C would be ignored by the child and the test would pass or fail depending
on how pytest itself was started. Tests that press Ctrl-C start their child through `popen`.
"""

from __future__ import annotations

import signal
import subprocess
from typing import Any


def _default_interrupts() -> None:
    # Runs in the child between fork and exec; the new program starts with Ctrl-C's default action.
    signal.signal(signal.SIGINT, signal.SIG_DFL)
    signal.signal(signal.SIGQUIT, signal.SIG_DFL)


def popen(argv: list[str], **kwargs: Any) -> subprocess.Popen:
    """subprocess.Popen in its own session (a signal to its group reaches nothing else), Ctrl-C live."""
    return subprocess.Popen(argv, start_new_session=True, preexec_fn=_default_interrupts, **kwargs)
