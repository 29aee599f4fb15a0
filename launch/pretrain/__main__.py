"""`python -m launch.pretrain ...`: what `deepspeed --module`, `torchrun -m` and Kubernetes jobs run."""

import sys
import traceback

try:  # from the first import of ours: a Ctrl-C may come while the ranks start
    from launch.pretrain.worker import main

    code = main()
except KeyboardInterrupt:  # before training set its own handler (which checkpoints): one line, no traceback
    import logging

    from launch.log import setup_logging

    setup_logging()  # it may have come before main's
    logging.getLogger("launch.pretrain").error("interrupted while starting, before this run's first step: nothing "
                                               "new to save (exit 130)")
    code = 130
except Exception:  # noqa: BLE001 - a fault: its traceback, exit 1, as Python would, but see below
    traceback.print_exc()
    code = 1
worker = sys.modules.get("launch.pretrain.worker")  # absent when its import failed: then there is no group
if worker is not None:
    worker.exit_if_in_group(code)  # a rank stopped by its own error, its peers still in the group: no shutdown abort
sys.exit(code)
