"""launch.log: the one logging setup of every command and worker."""

from __future__ import annotations

import io
import logging
import sys

from launch.log import setup_logging


def test_records_go_to_stderr_as_it_is_when_they_are_logged(monkeypatch):
    # pytest's capture swaps sys.stderr per test and closes the old one; a handler that kept the stream of
    # its setup wrote into a closed file in a later test ("--- Logging error ---" and its traceback).
    monkeypatch.setattr(logging.getLogger(), "handlers", list(logging.getLogger().handlers))
    first, second = io.StringIO(), io.StringIO()
    monkeypatch.setattr(sys, "stderr", first)
    setup_logging()
    logging.getLogger("bertpipe.test").warning("one")
    first.close()
    monkeypatch.setattr(sys, "stderr", second)
    logging.getLogger("bertpipe.test").warning("two")
    assert second.getvalue().endswith("WARNING bertpipe.test: two\n")
