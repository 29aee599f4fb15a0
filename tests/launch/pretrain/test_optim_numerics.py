"""Gradient accumulation dtype in the generated DeepSpeed config, the one weight-decay rule, and the
multi-tensor LAMB against a per-tensor float64 reference on flat partitions with gaps."""

from __future__ import annotations

import pytest
import torch

from launch.config import load_config
from launch.pretrain.deepspeed_config import deepspeed_config
from launch.pretrain.optimizers import Lamb, Segment, param_groups
from launch.pretrain.pretrain_config import PretrainConfig


@pytest.mark.parametrize("dtype", ["bf16", "fp32"])
def test_bf16_runs_accumulate_gradients_in_fp32_as_deepspeed_reads_it(dtype):
    from deepspeed.runtime.config import DeepSpeedConfig

    cfg = load_config(PretrainConfig, "bert-large-phase1",
                      ["data.micro_batch_size=8", "data.global_batch_size=64", f"precision.dtype={dtype}"])
    ds = deepspeed_config(cfg, world_size=1, grad_accum=8)
    parsed = DeepSpeedConfig(ds)  # DeepSpeed's own parser: the key is the one it reads
    if dtype == "bf16":
        assert ds["data_types"] == {"grad_accum_dtype": "fp32"}
        assert parsed.grad_accum_dtype == "fp32"
    else:
        assert "data_types" not in ds and parsed.grad_accum_dtype is None


def test_one_weight_decay_rule_for_pretraining_and_finetuning():
    """Biases and LayerNorm parameters (whatever their names) do not decay; every other weight does;
    fine-tuning's groups are the same parameters."""
    from launch.finetune.runner import _param_groups
    from model import BertConfig, BertForPreTraining, BertForTokenClassification

    model = torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.LayerNorm(4), torch.nn.Embedding(5, 4))
    decay, spared = param_groups(model, 0.1)
    assert [id(p) for p in decay["params"]] == [id(model[0].weight), id(model[2].weight)]
    assert [id(p) for p in spared["params"]] == [id(model[0].bias), id(model[1].weight), id(model[1].bias)]
    assert spared["weight_decay"] == 0.0 and spared["layer_adaptation"] is False and decay["weight_decay"] == 0.1

    for bert in (BertForPreTraining(BertConfig.preset("tiny", vocab_size=99)),
                 BertForTokenClassification(BertConfig.preset("tiny", vocab_size=99), num_labels=3)):
        names = {id(p): n for n, p in bert.named_parameters()}
        decay, spared = param_groups(bert, 0.01)
        assert sorted(names[id(p)] for g in (decay, spared) for p in g["params"]) == sorted(names.values())
        assert all(n.endswith("bias") or ".norm." in n for n in map(names.get, map(id, spared["params"])))
        assert not [n for n in map(names.get, map(id, decay["params"])) if n.endswith("bias") or ".norm." in n]
        fine = _param_groups(bert, 0.01)
        assert [[id(p) for p in g["params"]] for g in fine] == [[id(p) for p in g["params"]] for g in (decay, spared)]
        assert all("layer_adaptation" not in g for g in fine)  # AdamW takes no LAMB options


def _reference_lamb(params, grads_per_step, groups, lr, betas, eps, max_ratio):
    """Per-tensor LAMB in float64 (the loop the multi-tensor version replaced)."""
    w = [p.detach().double().clone() for p in params]
    m = [torch.zeros_like(x) for x in w]
    v = [torch.zeros_like(x) for x in w]
    for t, grads in enumerate(grads_per_step, start=1):
        for i, g in enumerate(grads):
            g = g.double()
            m[i] = betas[0] * m[i] + (1 - betas[0]) * g
            v[i] = betas[1] * v[i] + (1 - betas[1]) * g * g
            wd, adapt = groups[i]
            r = (m[i] / (1 - betas[0] ** t)) / ((v[i] / (1 - betas[1] ** t)).sqrt() + eps) + wd * w[i]
            ratio = 1.0
            if adapt and w[i].norm() > 0 and r.norm() > 0:
                ratio = min(float(w[i].norm() / r.norm()), max_ratio)
            w[i] = w[i] - lr * ratio * r
    return w


def test_multi_tensor_lamb_on_flat_partitions_with_gaps_equals_the_reference():
    """Two groups, each one flat tensor holding several parameters in shuffled order with padding
    between and after them (as ZeRO lays them out): every parameter gets its own trust ratio and the
    padding never moves."""
    torch.manual_seed(0)
    shapes = [(6, 5), (7,), (3, 4), (5,), (2, 9)]
    groups = [(0.01, True), (0.0, False), (0.01, True), (0.0, False), (0.01, True)]
    params = [torch.randn(s) * (1 + i) for i, s in enumerate(shapes)]
    steps = [[torch.randn(s) * 0.3 for s in shapes] for _ in range(4)]
    lr, betas, eps = 0.05, (0.9, 0.999), 1e-6
    expected = _reference_lamb(params, steps, groups, lr, betas, eps, 10.0)

    flats, segments, where = [], {}, {}
    for members in ([4, 0, 2], [3, 1]):  # decaying weights, then biases/LayerNorm, in shuffled order
        at, segs, chunks = 0, [], []
        for i in members:
            chunks += [torch.zeros(2), params[i].reshape(-1)]  # a gap of 2 before each parameter
            segs.append(Segment(i, at + 2, params[i].numel()))
            where[i] = (len(flats), at + 2)
            at += 2 + params[i].numel()
        flat = torch.nn.Parameter(torch.cat(chunks + [torch.zeros(3)]))
        flats.append(flat)
        segments[id(flat)] = (flat, segs)
    lamb = Lamb([{"params": [flats[0]], "weight_decay": 0.01},
                 {"params": [flats[1]], "weight_decay": 0.0, "layer_adaptation": False}],
                lr=lr, betas=betas, eps=eps)
    lamb.set_partitioning(segments, len(shapes), None)
    for grads in steps:
        for flat in flats:
            flat.grad = torch.zeros_like(flat)
        for i, g in enumerate(grads):
            f, start = where[i]
            flats[f].grad[start:start + g.numel()] = g.reshape(-1)
        lamb.step()
    for i, e in enumerate(expected):
        f, start = where[i]
        got = flats[f].detach()[start:start + e.numel()].view(e.shape)
        torch.testing.assert_close(got.double(), e, rtol=1e-5, atol=1e-6, msg=f"parameter {i}")
    for f, flat in enumerate(flats):
        mask = torch.ones(flat.numel(), dtype=torch.bool)
        for seg in segments[id(flat)][1]:
            mask[seg.start:seg.start + seg.numel] = False
        assert flat.detach()[mask].abs().max() == 0, "padding between parameters moved"
