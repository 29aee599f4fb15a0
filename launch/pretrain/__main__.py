"""`python -m launch.pretrain ...`: what `deepspeed --module`, `torchrun -m` and Kubernetes jobs run."""

import sys

from launch.pretrain.worker import main

sys.exit(main())
