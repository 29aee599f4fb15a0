"""The sync-free pieces of the training step on CPU, each against its reference: the loader's
precomputed unpadding vs the model's own, varlen flash attention's selection and call (shapes and
autograd on the meta device, where the aten op has its shape function), and the pre-training loss
on 16-bit logits vs cross-entropy on an fp32 copy."""

from __future__ import annotations

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from model import BertConfig, BertForPreTraining, Unpadded, masked_lm_loss, pretraining_loss
from model.attention import unpadded_attention, varlen_flash_attention, varlen_refusal


def _loader_batches(corpus, count=3):
    from pipeline.loader import PretrainLoader, ShardedSplit

    loader = PretrainLoader(ShardedSplit(corpus, "train"), seed=7, micro_batch_size=8, global_batch_size=16,
                            prefetch=0, unpad_layout=True, pin_memory=True)
    it = iter(loader)
    return [next(it)[0] for _ in range(count)]


def test_loader_layout_equals_the_models_own(small_corpus):
    batches = _loader_batches(small_corpus, 8)
    assert any((b["attention_mask"] == 0).any() for b in batches)  # real padding among them
    for batch in batches:
        mask = batch["attention_mask"]
        own = Unpadded.from_mask(mask)
        assert batch["cu_seqlens"].dtype == torch.int32 and batch["unpad_indices"].dtype == torch.int64
        assert torch.equal(batch["unpad_indices"], own.indices)
        assert torch.equal(batch["cu_seqlens"], own.cu_seqlens)
        assert type(batch["max_seqlen"]) is int and batch["max_seqlen"] == own.max_seqlen
        # pinning needs CUDA; without it the batch is left as it is
        assert batch["input_ids"].is_pinned() == torch.cuda.is_available()


def test_model_with_the_loaders_layout_gives_the_same_outputs_and_gradients(small_corpus):
    torch.manual_seed(0)
    batch = max(_loader_batches(small_corpus, 8), key=lambda b: int((b["attention_mask"] == 0).sum()))
    model = BertForPreTraining(BertConfig.preset("tiny", vocab_size=30522, unpad=True, hidden_dropout_prob=0.0,
                                                 attention_probs_dropout_prob=0.0))
    b, l = batch["input_ids"].shape
    layout = Unpadded.precomputed(batch["unpad_indices"], batch["cu_seqlens"], batch["max_seqlen"], b, l)
    args = (batch["input_ids"], batch["token_type_ids"], batch["attention_mask"], batch["masked_lm_positions"])
    results = []
    for given in (None, layout):
        model.zero_grad()
        out = model(*args, layout=given)
        loss, _ = pretraining_loss(out.mlm_logits, out.nsp_logits, batch["masked_lm_ids"], batch["next_sentence_label"])
        loss.backward()
        results.append((out.mlm_logits, out.nsp_logits, [p.grad.clone() for p in model.parameters()]))
    (a_mlm, a_nsp, a_grads), (b_mlm, b_nsp, b_grads) = results
    assert torch.equal(a_mlm, b_mlm) and torch.equal(a_nsp, b_nsp)
    assert all(torch.equal(x, y) for x, y in zip(a_grads, b_grads))


def test_precomputed_layout_refuses_wrong_dtypes():
    with pytest.raises(ValueError, match="int32"):
        Unpadded.precomputed(torch.arange(3), torch.tensor([0, 3]), 3, 1, 4)
    with pytest.raises(ValueError, match="int64"):
        Unpadded.precomputed(torch.arange(3, dtype=torch.int32), torch.tensor([0, 3], dtype=torch.int32), 3, 1, 4)


def test_varlen_is_chosen_only_where_it_can_run():
    bf16 = torch.bfloat16
    assert varlen_refusal("cuda", bf16, 0.0, True, False) is None
    assert varlen_refusal("cuda", bf16, 0.1, False, False) is None  # eval: no dropout applied
    assert varlen_refusal("cuda", bf16, 0.1, True, True) is None  # the switch on: flash with dropout
    assert "varlen_dropout" in varlen_refusal("cuda", bf16, 0.1, True, False)
    assert "fp16/bf16" in varlen_refusal("cuda", torch.float32, 0.0, True, True)
    assert "cpu" in varlen_refusal("cpu", bf16, 0.0, True, True)


def test_varlen_call_takes_int32_offsets_a_host_max_and_dropout_with_an_autograd_node():
    """On the meta device the aten op runs its shape function: what the CUDA kernel would be handed."""
    lengths = [5, 3, 8]
    t, heads, d = sum(lengths), 2, 16
    mask = torch.zeros(3, 8, dtype=torch.long)
    for i, n in enumerate(lengths):
        mask[i, :n] = 1
    cpu_layout = Unpadded.from_mask(mask)
    layout = Unpadded.precomputed(cpu_layout.indices.to("meta"), cpu_layout.cu_seqlens.to("meta"),
                                  cpu_layout.max_seqlen, 3, 8)
    qkv = torch.randn(t, 3 * heads * d, device="meta", dtype=torch.bfloat16, requires_grad=True)
    calls = []
    real = torch.ops.aten._flash_attention_forward

    class Spy:
        def __call__(self, *args):
            calls.append(args)
            return real(*args)

    torch.ops.aten._flash_attention_forward = Spy()
    try:
        out = varlen_flash_attention(qkv, layout, heads, 0.1)
    finally:
        torch.ops.aten._flash_attention_forward = real
    (q, k, v, cu_q, cu_k, max_q, max_k, dropout, causal, debug), = calls
    assert q.shape == (t, heads, d) and cu_q.dtype == torch.int32 and cu_q is cu_k
    assert type(max_q) is int and max_q == max_k == 8 and dropout == 0.1 and not causal and not debug
    assert out.shape == (t, heads * d)
    assert type(out.grad_fn).__name__ == "ViewBackward0"
    assert "FlashAttentionBackward" in type(out.grad_fn.next_functions[0][0]).__name__
    out.sum().backward()
    assert qkv.grad.shape == qkv.shape


def test_unpadded_attention_on_cpu_falls_back_to_the_padded_reference():
    torch.manual_seed(0)
    mask = torch.tensor([[1, 1, 1, 0], [1, 1, 0, 0]])
    layout = Unpadded.from_mask(mask)
    qkv = torch.randn(int(mask.sum()), 3 * 8)
    from model.attention import additive_key_mask, padded_attention

    ref = layout.unpad(padded_attention(layout.pad(qkv), additive_key_mask(mask, qkv.dtype), 2, "eager", 0.0, False))
    got = unpadded_attention(qkv, layout, additive_key_mask(mask, qkv.dtype), 2, "eager", 0.1, False, True)
    torch.testing.assert_close(got, ref)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_blockwise_loss_on_16bit_logits_matches_cross_entropy_on_an_fp32_copy(dtype):
    g = torch.Generator().manual_seed(0)
    logits = (torch.randn(70, 333, generator=g) * 4).to(dtype).requires_grad_()
    labels = torch.randint(0, 333, (70,), generator=g)
    labels[::6] = -100
    ours = masked_lm_loss(logits, labels, block=16)  # several blocks and a ragged last one
    ours.backward(torch.tensor(1.7))
    ref_in = logits.detach().float().requires_grad_()
    ref = F.cross_entropy(ref_in, labels, ignore_index=-100)
    (ref * 1.7).backward()
    assert ours.dtype == torch.float32
    torch.testing.assert_close(ours, ref, rtol=1e-6, atol=1e-6)
    assert logits.grad.dtype == dtype
    torch.testing.assert_close(logits.grad.float(), ref_in.grad.to(dtype).float(), rtol=0, atol=2e-3 * ref_in.grad.abs().max().item())
    assert logits.grad[::6].abs().max() == 0  # ignored rows get no gradient


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_blockwise_loss_edges_are_cross_entropys(dtype):
    """Every label ignored: a NaN loss (0/0) but zero gradients, as F.cross_entropy; a negative label
    other than -100 fails as it does there, not trained as class 0."""
    logits = torch.randn(6, 40).to(dtype).requires_grad_()
    loss = masked_lm_loss(logits, torch.full((6,), -100), block=4)
    loss.backward()
    assert loss.isnan() and torch.equal(logits.grad, torch.zeros_like(logits))
    with pytest.raises((IndexError, RuntimeError), match="out of bounds|out of range"):
        masked_lm_loss(logits, torch.tensor([1, 2, -1, 3, 4, 5]), block=4)


def test_fp32_loss_and_counts_are_the_reference_formula_bit_for_bit():
    g = torch.Generator().manual_seed(1)
    mlm = torch.randn(4, 5, 50, generator=g)
    nsp = torch.randn(4, 2, generator=g)
    labels = torch.randint(0, 50, (4, 5), generator=g)
    labels[3, 2:] = -100
    nsp_labels = torch.tensor([0, 1, 1, 0])
    loss, counts = pretraining_loss(mlm, nsp, labels, nsp_labels)
    ref = F.cross_entropy(mlm.reshape(-1, 50), labels.reshape(-1), ignore_index=-100) + F.cross_entropy(nsp, nsp_labels)
    assert torch.equal(loss, ref)
    valid = labels != -100
    expected = [float(((mlm.argmax(-1) == labels) & valid).sum()), float(valid.sum()),
                float((nsp.argmax(-1) == nsp_labels).sum()), 4.0]
    assert counts.dtype == torch.float64 and counts.tolist() == expected
    assert np.isnan(pretraining_loss(mlm, nsp, torch.full_like(labels, -100), nsp_labels)[0].item())


def test_an_empty_row_is_refused_not_pooled_from_its_neighbour():
    # The pooler takes each row's first real token: an all-0 row used to get the next row's [CLS]
    # (or, as the last row, an index error).
    for empty in (1, 2):
        mask = torch.ones(3, 4, dtype=torch.long)
        mask[empty] = 0
        with pytest.raises(ValueError, match=rf"attention_mask row\(s\) \[{empty}\] have no token"):
            Unpadded.from_mask(mask)


def test_the_layout_built_from_the_mask_knows_the_longest_real_row():
    # Varlen kernels size their work by max_seqlen: the padded length instead would waste it, a shorter
    # one would cut sequences off. Read from the device here (no loader-made value to trust).
    mask = torch.tensor([[1, 1, 0, 0, 0], [1, 1, 1, 0, 0], [1, 0, 0, 0, 0]])
    layout = Unpadded.from_mask(mask)
    assert layout.max_seqlen == 3 and layout.cu_seqlens.tolist() == [0, 2, 5, 6]
    assert Unpadded.precomputed(layout.indices, layout.cu_seqlens, 3, 3, 5).max_seqlen == 3
