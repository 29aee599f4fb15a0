"""Our LAMB under ZeRO on 2 gloo processes makes the same update as single-process LAMB."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest
import torch

from launch.pretrain.launcher import launch_local

WORKER = Path(__file__).with_name("lamb_worker.py")


def _worker_module():
    spec = importlib.util.spec_from_file_location("lamb_worker", WORKER)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _reference(w) -> list[torch.Tensor]:
    """Textbook LAMB in one process: the clipped gradient of the mean of the two half-batch losses."""
    model = w.make_model()
    lamb = w.new_lamb(model)
    for b in w.make_batches():
        half = w.BATCH // 2
        loss = sum(w.loss_fn(model, {k: v[r * half:(r + 1) * half] for k, v in b.items()}) for r in range(2)) / 2
        lamb.zero_grad()
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), w.CLIP)
        lamb.step()
    return [p.detach().clone() for p in model.parameters()]


@pytest.mark.slow
def test_lamb_under_zero_matches_single_process(tmp_path):
    stages = [1, 2, 3]
    assert launch_local(2, [str(tmp_path), *map(str, stages)], program=[str(WORKER)]) == 0
    w = _worker_module()
    expected = _reference(w)
    initial = [p.detach() for p in w.make_model().parameters()]
    for stage in stages:
        got = torch.load(tmp_path / f"zero{stage}.pt")
        # The check means something only if ZeRO cut some parameter across both ranks.
        owners: dict[int, set[int]] = {}
        for rank, segments in enumerate(got["segments"]):
            for index, _, _ in segments:
                owners.setdefault(index, set()).add(rank)
        assert any(len(r) == 2 for r in owners.values()), f"ZeRO-{stage} split no parameter across ranks"
        assert set(owners) == set(range(len(expected)))
        for i, (g, e, p0) in enumerate(zip(got["params"], expected, initial)):
            assert not torch.equal(e, p0)
            torch.testing.assert_close(g, e, rtol=1e-5, atol=1e-6, msg=f"ZeRO-{stage} parameter {i}")


def test_partition_wide_trust_ratio_would_differ():
    """Guards the test above: one trust ratio per flat partition (the naive ZeRO LAMB) is a different update."""
    from launch.pretrain.optimizers import Lamb, Segment

    torch.manual_seed(0)
    a, b = torch.nn.Parameter(torch.randn(6) * 10), torch.nn.Parameter(torch.randn(4) * 0.1)
    grads = torch.randn(10)
    proper = Lamb([a, b], lr=0.1, weight_decay=0.0)
    a.grad, b.grad = grads[:6].clone(), grads[6:].clone()
    proper.step()
    flat = torch.nn.Parameter(torch.cat([a.detach(), b.detach()]))  # already updated; redo from scratch below
    torch.manual_seed(0)
    a0, b0 = torch.randn(6) * 10, torch.randn(4) * 0.1
    flat = torch.nn.Parameter(torch.cat([a0, b0]))
    flat.grad = grads.clone()
    segmented = Lamb([flat], lr=0.1, weight_decay=0.0)
    segmented.set_partitioning({id(flat): (flat, [Segment(0, 0, 6), Segment(1, 6, 4)])}, 2, None)
    segmented.step()
    torch.testing.assert_close(flat.detach(), torch.cat([a.detach(), b.detach()]))
    naive_flat = torch.nn.Parameter(torch.cat([a0, b0]))
    naive_flat.grad = grads.clone()
    naive = Lamb([naive_flat], lr=0.1, weight_decay=0.0)
    naive.step()
    assert not torch.allclose(naive_flat.detach(), flat.detach())


def _textbook_lamb(model, grads_per_step, lr, betas, eps, wd, max_ratio):
    """LAMB written out from You et al. (2020), Alg. 2, as NVIDIA's FusedLAMB computes it: bias-corrected
    Adam ratio, weight decay added *before* the trust ratio, ratio 1 where either norm is 0, and
    biases / LayerNorm with neither decay nor adaptation (google-research/bert). float64 throughout."""
    params = {n: p.detach().double().clone() for n, p in model.named_parameters()}
    m = {n: torch.zeros_like(p) for n, p in params.items()}
    v = {n: torch.zeros_like(p) for n, p in params.items()}
    ratios: dict[str, list[float]] = {n: [] for n in params}
    for t, grads in enumerate(grads_per_step, start=1):
        for n, w in params.items():
            g = grads[n].double()
            m[n] = betas[0] * m[n] + (1 - betas[0]) * g
            v[n] = betas[1] * v[n] + (1 - betas[1]) * g * g
            m_hat, v_hat = m[n] / (1 - betas[0] ** t), v[n] / (1 - betas[1] ** t)
            plain = w.dim() < 2  # bias / LayerNorm
            r = m_hat / (v_hat.sqrt() + eps) + (0.0 if plain else wd) * w
            ratio = 1.0
            if not plain:
                w_norm, r_norm = w.norm().item(), r.norm().item()
                ratio = min(w_norm / r_norm, max_ratio) if w_norm > 0 and r_norm > 0 else 1.0
            ratios[n].append(ratio)
            params[n] = w - lr * ratio * r
    return params, ratios


def test_lamb_matches_the_textbook_update():
    """The math itself (the ZeRO test above compares our LAMB with our LAMB): bias correction, decay
    inside the trust ratio, no decay/adaptation for bias and LayerNorm, a zero norm, the clamp."""
    from launch.pretrain.optimizers import Lamb, param_groups

    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(6, 8), torch.nn.LayerNorm(8), torch.nn.Linear(8, 3, bias=False),
                                torch.nn.Linear(3, 5))
    with torch.no_grad():
        model[2].weight.zero_()  # ||w|| = 0: trust ratio 1
        model[3].weight.mul_(300.0)  # ||w|| >> ||u||: clamped at max_trust_ratio
        model[1].weight.uniform_(0.5, 1.5)
    lr, betas, eps, wd = 0.05, (0.9, 0.999), 1e-6, 0.01
    g = torch.Generator().manual_seed(3)
    steps = [{n: torch.randn(p.shape, generator=g) * (0.1 + i) for n, p in model.named_parameters()}
             for i in range(4)]
    expected, ratios = _textbook_lamb(model, steps, lr, betas, eps, wd, max_ratio=10.0)
    # The cases this test is about really occur.
    assert ratios["2.weight"][0] == 1.0 and ratios["3.weight"][0] == 10.0
    assert any(1.0 < r < 10.0 for r in ratios["0.weight"]) or any(0 < r < 1.0 for r in ratios["0.weight"])

    lamb = Lamb(param_groups(model, wd), lr=lr, betas=betas, eps=eps, weight_decay=wd)
    for grads in steps:
        for n, p in model.named_parameters():
            p.grad = grads[n].clone()
        lamb.step()
    for n, p in model.named_parameters():
        torch.testing.assert_close(p.detach().double(), expected[n], rtol=1e-5, atol=1e-6, msg=n)
