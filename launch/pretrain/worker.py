"""Worker entry point: `deepspeed [--hostfile H] --module launch.pretrain ...`, `torchrun ... -m
launch.pretrain ...`, or started by `bertpipe pretrain --nproc N`. Same flags as `bertpipe pretrain`.
"""

from __future__ import annotations

import argparse
import logging
import sys

from launch.log import setup_logging

log = logging.getLogger(__name__)


def main(argv: list[str] | None = None) -> int:
    from launch.cli.pretrain import add_arguments, build_trainer
    from launch.pretrain.trainer import NonFiniteLossError

    parser = argparse.ArgumentParser(prog="launch.pretrain", description=__doc__)
    add_arguments(parser)
    # The deepspeed launcher appends --local_rank; LOCAL_RANK in the environment is what we use.
    parser.add_argument("--local_rank", "--local-rank", type=int, default=None, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    setup_logging()
    try:
        trainer = build_trainer(args)
        trainer.setup()
        return trainer.train()
    except ValueError as err:  # a user error: the message says what to change
        log.error("%s", err)
        return 2
    except NonFiniteLossError as err:
        log.error("%s", err)
        return 3


if __name__ == "__main__":
    sys.exit(main())
