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


def test_a_full_disk_met_by_tensorboards_writer_thread_is_one_warning_not_its_traceback(tmpfs):
    # A disk that filled between checkpoints printed TensorBoard's thread traceback (17 lines) beside the
    # run's one-line message. Real: TensorBoard's own writer thread, flushing on its timer onto a full tmpfs.
    import subprocess

    disk = tmpfs(1 << 20)
    script = (
        "import subprocess, sys, time\n"
        "from launch.log import setup_logging\n"
        "setup_logging()\n"
        "from torch.utils.tensorboard import SummaryWriter\n"
        f"w = SummaryWriter(log_dir={str(disk / 'tb')!r}, flush_secs=1)\n"
        "w.add_scalar('loss', 1.0, 0); w.flush()\n"
        f"subprocess.run(['dd', 'if=/dev/zero', 'of={disk / 'fill'}', 'bs=4k'], capture_output=True)\n"
        "try:\n"
        "    for i in range(2000):\n"
        "        w.add_scalar('loss', float(i), i)\n"
        "    time.sleep(3)  # the thread's timed flush meets the full disk\n"
        "    w.add_scalar('loss', 0.0, 0)\n"
        "except OSError as err:  # the writer raises it again in the run's thread, which reports it itself\n"
        "    print('the run hears of it too:', err.errno)\n"
        "    time.sleep(2)  # the thread's own end (its hook) before this process ends\n"
    )
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    assert "the run hears of it too: 28" in done.stdout
    lines = [line for line in done.stderr.splitlines() if line.strip() and "accelerator" not in line]
    assert len(lines) == 1 and "Traceback" not in done.stderr, done.stderr[-3000:]
    assert "tensorboard's writer thread stopped: no space left on device while writing" in lines[0]
