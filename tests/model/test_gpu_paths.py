"""The GPU fast paths (varlen flash attention on unpadded tokens, compiled fusions) against the eager
fp32 reference, within bf16 tolerance. They run wherever CUDA is present; CPU-only CI skips them and
covers the same code paths' CPU fallbacks in test_fast_paths.py."""

from __future__ import annotations

import pytest
import torch

from model import BertConfig, BertForPreTraining, BertModel, compile_fast_paths

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")


def _batch(device, b=8, l=128, p=20, seed=0):
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(1000, 30522, (b, l), generator=g)
    lengths = torch.randint(8, l + 1, (b,), generator=g)
    lengths[0] = l
    mask = (torch.arange(l)[None] < lengths[:, None]).long()
    positions = torch.stack([torch.randperm(int(n) - 1, generator=g)[:p].sort().values + 1 for n in lengths.clamp(min=p + 1)])
    positions = torch.minimum(positions, lengths[:, None] - 1)
    return ids.to(device), torch.zeros_like(ids).to(device), mask.to(device), positions.to(device)


def _rel_err(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a.float() - b.float()).norm() / b.float().norm())


def _count_varlen(monkeypatch) -> list[int]:
    """The unpadded path falls back to re-padding with one log line: count the varlen calls that
    succeed, so that a test checks the varlen kernel and not the fallback."""
    import model.attention as attention

    calls: list[int] = []
    real = attention.varlen_flash_attention

    def counting(*args, **kwargs):
        out = real(*args, **kwargs)
        calls.append(1)
        return out

    monkeypatch.setattr(attention, "varlen_flash_attention", counting)
    return calls


def test_varlen_bf16_matches_eager_fp32(monkeypatch):
    calls = _count_varlen(monkeypatch)
    torch.manual_seed(0)
    config = BertConfig.preset("base", attention_probs_dropout_prob=0.0, hidden_dropout_prob=0.0)
    ref = BertModel(config.replace(attention_impl="eager")).cuda().eval()
    fast = BertModel(config.replace(unpad=True)).cuda().eval().to(torch.bfloat16)
    fast.load_state_dict(ref.state_dict())
    ids, types, mask, _ = _batch("cuda")
    with torch.no_grad():
        a = ref(ids, types, mask).last_hidden_state
        b = fast(ids, types, mask).last_hidden_state
    real = mask.bool()
    assert _rel_err(b[real], a[real]) < 2e-2
    assert len(calls) == config.num_hidden_layers, "unpad re-padded instead of running varlen attention"


def test_varlen_training_with_dropout_0_matches_the_repadded_path_and_its_gradients(monkeypatch):
    calls = _count_varlen(monkeypatch)
    torch.manual_seed(0)
    config = BertConfig.preset("base", attention_probs_dropout_prob=0.0, hidden_dropout_prob=0.0, unpad=True)
    ids, types, mask, positions = _batch("cuda")
    grads, logits = [], []
    for on_cuda in (False, True):  # the re-padded reference on CPU fp32, varlen on CUDA bf16
        torch.manual_seed(0)
        model = BertForPreTraining(config).train()
        if on_cuda:
            model = model.cuda().to(torch.bfloat16)
        dev = "cuda" if on_cuda else "cpu"
        out = model(ids.to(dev), types.to(dev), mask.to(dev), positions.to(dev))
        out.mlm_logits.float().logsumexp(-1).mean().backward()
        logits.append(out.mlm_logits.float().cpu())
        grads.append(model.bert.encoder.layers[0].attention.qkv.weight.grad.float().cpu())
    assert len(calls) == config.num_hidden_layers
    assert _rel_err(logits[1], logits[0]) < 3e-2
    assert _rel_err(grads[1], grads[0]) < 5e-2


def test_varlen_with_attention_dropout_has_the_repadded_paths_loss_statistics(monkeypatch):
    """Dropout masks differ between kernels, so compare distributions: the mean MLM loss over seeds of
    varlen flash attention with dropout 0.1 equals the re-padded SDPA path's within their spread."""
    calls = _count_varlen(monkeypatch)
    config = BertConfig.preset("base", attention_probs_dropout_prob=0.1, hidden_dropout_prob=0.0, unpad=True)
    ids, types, mask, positions = _batch("cuda")
    torch.manual_seed(0)
    base = BertForPreTraining(config).cuda().to(torch.bfloat16).train()
    losses = {}
    for varlen in (False, True):
        for layer in base.bert.encoder.layers:
            layer.attention.varlen_dropout = varlen
        values = []
        for seed in range(24):
            torch.manual_seed(seed)
            with torch.no_grad():
                out = base(ids, types, mask, positions)
            values.append(float(out.mlm_logits.float().logsumexp(-1).mean()))
        losses[varlen] = torch.tensor(values)
    assert len(calls) == 24 * config.num_hidden_layers  # only the varlen_dropout=True runs used it
    a, b = losses[False], losses[True]
    spread = float(torch.sqrt(a.var() / len(a) + b.var() / len(b)))
    assert abs(float(a.mean() - b.mean())) < 4 * spread + 1e-3, (a.mean(), b.mean(), spread)
    assert float(a.std()) > 0 and float(b.std()) > 0  # dropout really ran on both paths


def test_blockwise_loss_on_bf16_logits_matches_fp32_on_cuda():
    from model import masked_lm_loss

    g = torch.Generator().manual_seed(0)
    logits = (torch.randn(5120, 30522, generator=g) * 3).to("cuda", torch.bfloat16).requires_grad_()
    labels = torch.randint(0, 30522, (5120,), generator=g).cuda()
    labels[::5] = -100
    loss = masked_lm_loss(logits, labels)
    loss.backward()
    ref_in = logits.detach().float().requires_grad_()
    ref = torch.nn.functional.cross_entropy(ref_in, labels, ignore_index=-100)
    ref.backward()
    assert abs(float(loss) - float(ref)) < 1e-4 * float(ref)
    assert _rel_err(logits.grad, ref_in.grad) < 1e-2


def test_compiled_unpadded_pretraining_bf16_matches_eager():
    torch.manual_seed(0)
    config = BertConfig.preset("base", attention_probs_dropout_prob=0.0, hidden_dropout_prob=0.0)
    ref = BertForPreTraining(config.replace(attention_impl="eager")).cuda()
    fast = BertForPreTraining(config.replace(unpad=True, pad_vocab_multiple=64)).cuda()
    state = fast.state_dict()
    for k, v in ref.state_dict().items():
        state[k].zero_()
        state[k][: v.shape[0]].copy_(v)
    fast.to(torch.bfloat16)
    assert compile_fast_paths(fast) > 0
    ids, types, mask, positions = _batch("cuda")
    a = ref(ids, types, mask, positions)
    b = fast(ids, types, mask, positions)
    assert _rel_err(b.mlm_logits, a.mlm_logits) < 3e-2
    assert _rel_err(b.nsp_logits, a.nsp_logits) < 3e-2
    a.mlm_logits.float().logsumexp(-1).mean().backward()
    b.mlm_logits.float().logsumexp(-1).mean().backward()
    ga = ref.bert.encoder.layers[0].attention.qkv.weight.grad
    gb = fast.bert.encoder.layers[0].attention.qkv.weight.grad
    assert _rel_err(gb, ga) < 5e-2
