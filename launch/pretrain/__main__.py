"""`python -m launch.pretrain ...`: what `deepspeed --module`, `torchrun -m` and Kubernetes jobs run."""

import sys
import traceback

from launch.pretrain.worker import exit_if_in_group, main

try:
    code = main()
except Exception:  # noqa: BLE001 - a fault: its traceback, exit 1, as Python would, but see below
    traceback.print_exc()
    code = 1
exit_if_in_group(code)  # a rank stopped by its own error, its peers still in the group: no shutdown abort
sys.exit(code)
