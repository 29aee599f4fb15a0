"""`launch.pretrain.fast_step` on its own, on the CPU: when `model.compile` applies, what `to_device` hands
the model, and what `UpdateSkipper` does to one optimizer step (test_train_loop.py runs it in the trainer)."""

from __future__ import annotations

import logging

import pytest
import torch

from launch.pretrain.fast_step import NonFiniteLossError, UpdateSkipper, compile_enabled, to_device


@pytest.mark.parametrize("setting, device, stage, expected", [
    (None, "cuda", 1, False),  # auto: off everywhere (nothing measurable gained on an H200)
    (None, "cpu", 0, False),
    (True, "cuda", 2, True),
    (True, "cpu", 1, True),
    (True, "cuda", 3, False),  # refused under ZeRO-3, with a warning
    (False, "cuda", 1, False),
    (False, "cuda", 3, False),
])
def test_when_model_compile_applies(setting, device, stage, expected, caplog):
    with caplog.at_level(logging.WARNING, logger="launch.pretrain.fast_step"):
        assert compile_enabled(setting, device, stage) is expected
    assert ("not applied under ZeRO-3" in caplog.text) == (setting is True and stage == 3)


def test_to_device_hands_the_model_the_loaders_layout_and_only_tensors():
    from model import Unpadded

    mask = torch.tensor([[1, 1, 1, 0], [1, 1, 0, 0]])
    batch = {"input_ids": torch.arange(8).view(2, 4), "attention_mask": mask,
             "unpad_indices": torch.tensor([0, 1, 2, 4, 5]), "cu_seqlens": torch.tensor([0, 3, 5], dtype=torch.int32),
             "max_seqlen": 3}
    moved, layout = to_device(batch, torch.device("cpu"))
    assert set(moved) == {"input_ids", "attention_mask", "unpad_indices", "cu_seqlens"}
    assert isinstance(layout, Unpadded) and (layout.batch, layout.seqlen, layout.max_seqlen) == (2, 4, 3)
    assert torch.equal(layout.cu_seqlens, batch["cu_seqlens"])
    plain = {k: v for k, v in batch.items() if k in ("input_ids", "attention_mask")}
    assert to_device(plain, torch.device("cpu"))[1] is None  # the model builds its own


class Engine:
    """What UpdateSkipper needs of DeepSpeed's engine at the boundary: one step = optimizer, then lr schedule."""

    def __init__(self, optimizer: torch.optim.Optimizer, scheduler) -> None:
        self.optimizer, self.scheduler = optimizer, scheduler

    def step(self) -> None:
        self.optimizer.step()
        self.scheduler.step()


def setup(max_in_a_row: int = 3):
    torch.manual_seed(0)
    param = torch.nn.Parameter(torch.ones(4))
    opt = torch.optim.AdamW([param], lr=0.1, weight_decay=0.1)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda step: 1.0 / (1 + step))
    return param, opt, sched, Engine(opt, sched), UpdateSkipper(opt, sched, max_in_a_row)


def backward(param: torch.nn.Parameter) -> None:
    param.grad = None
    (param * torch.arange(1.0, 5.0)).sum().backward()


def test_a_skipped_update_moves_nothing_then_the_next_one_trains_at_the_skipped_lr():
    param, opt, sched, engine, skipper = setup()
    ids = [torch.arange(8), torch.arange(8, 16)]
    backward(param)
    engine.step()  # an applied step: lr 0.1, then the schedule moves to 0.05
    lr = opt.param_groups[0]["lr"]
    assert lr == pytest.approx(0.05)
    before, state = param.detach().clone(), {k: v.clone() for k, v in opt.state[param].items()}

    backward(param)
    assert skipper.skip(engine, [0.0, 2.0], ids, step=2, total=0) == 1  # micro-batch 2 had a NaN (on 2 ranks)
    assert torch.equal(param.detach(), before)  # no update, no weight decay
    assert all(torch.equal(opt.state[param][k], v) for k, v in state.items())  # no optimizer state moved
    assert opt.param_groups[0]["lr"] == lr and sched.last_epoch == 1  # the schedule did not advance
    assert skipper.in_a_row == 1 and not skipper.active

    backward(param)
    engine.step()  # the retry is a real update again, at the lr the skipped one would have used
    assert not torch.equal(param.detach(), before)
    assert sched.last_epoch == 2 and opt.param_groups[0]["lr"] == pytest.approx(0.1 / 3)


def test_skip_counts_micro_batches_and_stops_at_the_limit_of_steps_in_a_row(caplog):
    param, opt, sched, engine, skipper = setup(max_in_a_row=2)
    ids = [torch.arange(i * 8, i * 8 + 8) for i in range(4)]
    with caplog.at_level(logging.WARNING, logger="launch.pretrain.fast_step"):
        backward(param)
        assert skipper.skip(engine, [1.0, 0.0, 1.0, 1.0], ids, step=5, total=7) == 3
    # One line per bad micro-batch, numbering the try and the running total.
    lines = [r.getMessage() for r in caplog.records]
    assert len(lines) == 3 and all(line.startswith("non-finite loss at step 5, try 1 ") for line in lines)
    assert [line.split("(micro-batch ")[1].split(",")[0] for line in lines] == ["1 of 4", "3 of 4", "4 of 4"]
    assert lines[-1].endswith("(1 step(s) in a row, 10 micro-batch(es) in total)")
    assert "samples [24, 25, 26, 27]..." in lines[-1]
    backward(param)
    with pytest.raises(NonFiniteLossError, match=r"^2 steps in a row with a non-finite loss, at step 5;"):
        skipper.skip(engine, [1.0, 0.0, 0.0, 0.0], ids, step=5, total=10)
