"""torchrun that exits with its failed worker's own exit code:
`python -m launch.pretrain.torchrun [torchrun's flags] --module launch.pretrain [bertpipe pretrain's flags]`.

torchrun exits 1 whatever its workers did, so a scheduler cannot tell a run that must not be retried
from one that should be: a user error (exit 2: the message says which flag or input to change, and a
retry repeats it) or a diverged run (3: a retry from the last checkpoint diverges again) from a fault (a
full disk, say: 1), a peer lost on another node (4) or a kill (128 + the signal). The Kubernetes JobSet manifest fails the job at
once on 2 and 3 (`podFailurePolicy`) and restarts it on anything else.

Flags, PET_* variables, rendezvous and worker handling are torchrun's own (`torch.distributed.run`);
only the exit is ours, chosen as `bertpipe pretrain --nproc N` chooses it: the first worker to fail,
not one stopped after it, and a worker killed by a signal named in one line (`launch/pretrain/launcher.py`).
"""

from __future__ import annotations

import logging
import sys

log = logging.getLogger("launch.pretrain.torchrun")  # also when run as __main__


def main(argv: list[str] | None = None) -> int:
    from torch.distributed.elastic.multiprocessing.api import SignalException
    from torch.distributed.elastic.multiprocessing.errors import ChildFailedError
    from torch.distributed.run import parse_args, run

    from launch.log import setup_logging
    from launch.pretrain.launcher import cause, exit_code, report_killed

    args = parse_args(argv)
    setup_logging()
    # torchrun logs nothing while it waits for the other nodes, which can be minutes (a master not up yet).
    where = "this node alone (--standalone)" if args.standalone else \
        f"{args.rdzv_backend} rendezvous at {args.rdzv_endpoint or f'{args.master_addr}:{args.master_port or 29500}'}"
    log.info("torchrun: %s node(s) x %s process(es), %s; the workers start once every node has joined", args.nnodes,
             args.nproc_per_node, where)
    try:
        run(args)
        return 0
    except ChildFailedError as err:  # the workers said why (or report_killed does); no table of it again
        rank, code = cause([(rank, failure.exitcode) for rank, failure in err.failures.items()])
        report_killed(rank, code)
        return exit_code(code)
    except SignalException as err:  # torchrun itself was stopped (the pod deleted): its workers got the signal
        log.error("torchrun was stopped by %s and passed it on to its workers (they checkpoint at their next step, "
                  "given --shutdown-timeout)", err.sigval.name)
        return 128 + int(err.sigval)


if __name__ == "__main__":
    sys.exit(main())
