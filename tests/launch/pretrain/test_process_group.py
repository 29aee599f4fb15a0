"""`launch.pretrain.process_group` on two real gloo ranks: `on_rank0` runs its check on rank 0 alone and
hands every rank its result or its user error; `same_on_every_rank` runs on each rank and stops all of them
with one message naming the rank that failed or differed; rank 0 raises `StoppedTogether` (it reports),
the others `ReportedByRankZero` (they exit quietly). After each case both ranks still meet in a collective."""

from __future__ import annotations

import json
import socket

from launch.pretrain.launcher import launch_local

# argv: OUT. Each rank writes OUT/<rank>.json: case -> [error class, message] or ["ok", result].
WORKER = """
import datetime, json, os, sys
from pathlib import Path
import torch.distributed as dist
from launch.pretrain.process_group import on_rank0, same_on_every_rank, stopped_together

dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=60))  # a mismatch fails, never hangs
rank = dist.get_rank()
calls = []


def outcome(fn):
    try:
        result = ["ok", fn()]
    except ValueError as err:
        result = [type(err).__name__, str(err)]
    dist.barrier()  # every rank left the case together
    return result


def fail(message):
    raise ValueError(message)


def ran_on(value):
    calls.append(rank)
    return value


cases = {
    "on_rank0": outcome(lambda: on_rank0(lambda: ran_on({"from": rank}))),
    "on_rank0_calls": list(calls),
    "on_rank0_error": outcome(lambda: on_rank0(lambda: fail(f"bad on rank {rank}"))),
    "same": outcome(lambda: same_on_every_rank(lambda: {"key": 7, "rank": rank}, lambda r: r["key"], f"where{rank}",
                                               "differ")),
    "same_error_rank1": outcome(lambda: same_on_every_rank(
        lambda: fail("no manifest") if rank == 1 else {"key": 7}, lambda r: r["key"], f"where{rank}", "differ")),
    "same_error_rank0": outcome(lambda: same_on_every_rank(
        lambda: fail("no manifest") if rank == 0 else {"key": 7}, lambda r: r["key"], f"where{rank}", "differ")),
    "same_differs": outcome(lambda: same_on_every_rank(lambda: {"key": 7 + rank}, lambda r: r["key"], f"where{rank}",
                                                       "read different corpora")),
}
try:
    raise stopped_together("said once")
except ValueError as err:
    cases["stopped_together"] = [type(err).__name__, str(err)]
(Path(sys.argv[1]) / f"{rank}.json").write_text(json.dumps(cases))
dist.destroy_process_group()
"""


def test_on_rank0_and_same_on_every_rank_stop_every_rank_together_with_one_message(tmp_path):
    worker = tmp_path / "process_group_worker.py"
    worker.write_text(WORKER)
    assert launch_local(2, [str(tmp_path)], program=[str(worker)]) == 0
    r0, r1 = (json.loads((tmp_path / f"{r}.json").read_text()) for r in (0, 1))
    host = socket.gethostname()

    # on_rank0: run once, on rank 0; every rank gets its result
    assert r0["on_rank0"] == r1["on_rank0"] == ["ok", {"from": 0}]
    assert r0["on_rank0_calls"] == [0] and r1["on_rank0_calls"] == []
    # ... or its ValueError: rank 0 reports it, rank 1 stops with the same message, quietly
    assert r0["on_rank0_error"] == ["StoppedTogether", "bad on rank 0"]
    assert r1["on_rank0_error"] == ["ReportedByRankZero", "bad on rank 0"]

    # same_on_every_rank: each rank keeps its own result when the keys agree
    assert r0["same"] == ["ok", {"key": 7, "rank": 0}] and r1["same"] == ["ok", {"key": 7, "rank": 1}]
    # an error on rank 1 stops both, naming rank 1 and its host; rank 0's own error is said as it is
    assert r0["same_error_rank1"] == ["StoppedTogether", f"rank 1 on {host}: no manifest"]
    assert r1["same_error_rank1"] == ["ReportedByRankZero", f"rank 1 on {host}: no manifest"]
    assert r0["same_error_rank0"] == ["StoppedTogether", "no manifest"]
    assert r1["same_error_rank0"] == ["ReportedByRankZero", "no manifest"]
    # a key unlike rank 0's: both stop, naming both ranks, hosts and what each read
    differs = f"rank 1 on {host} (where1) and rank 0 on {host} (where0) read different corpora"
    assert r0["same_differs"] == ["StoppedTogether", differs] and r1["same_differs"] == ["ReportedByRankZero", differs]

    assert r0["stopped_together"] == ["StoppedTogether", "said once"]
    assert r1["stopped_together"] == ["ReportedByRankZero", "said once"]
