"""The pre-training loss (masked LM + next sentence) and its accuracy counts, without an fp32 copy of
the MLM logits.

Shape legend: B batch, P masked-LM predictions per sequence, N = B * P rows, V vocab.

In 16-bit training the MLM logits are [N, V] bf16 (~312 MB at micro-batch 256, P 20, V 30522);
`logits.float()` before cross-entropy doubled that into a transient fp32 copy. Here cross-entropy
reads the 16-bit logits a block of rows at a time, computes log-sum-exp in fp32, and recomputes the
softmax block by block in backward: the fp32 working set is one block. Accuracy takes the argmax of
the logits in their own dtype. fp32 logits take `F.cross_entropy` itself, so fp32 numerics are the
reference's bit for bit.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

IGNORE = -100  # the loader's label for padded prediction slots

# Rows per fp32 block: 1024 x 30522 x 4 bytes = 125 MB of fp32 at a time.
BLOCK_ROWS = 1024


class _BlockwiseCrossEntropy(torch.autograd.Function):
    """Mean cross-entropy over rows whose label is not IGNORE, 16-bit logits in, fp32 accumulation."""

    @staticmethod
    def forward(ctx, logits_NV: torch.Tensor, labels_N: torch.Tensor, block: int) -> torch.Tensor:
        valid_N = labels_N != IGNORE
        # Only IGNORE rows pick a stand-in class: any other label outside [0, V) fails in gather, as in F.cross_entropy.
        target_N = torch.where(valid_N, labels_N, 0)
        lse_N = torch.empty(logits_NV.shape[0], dtype=torch.float32, device=logits_NV.device)
        for start in range(0, logits_NV.shape[0], block):
            lse_N[start:start + block] = torch.logsumexp(logits_NV[start:start + block].float(), dim=-1)
        picked_N = logits_NV.gather(1, target_N[:, None]).squeeze(1).float()
        # Divided by the count of valid rows on the device (0/0 = NaN, as F.cross_entropy): no sync.
        count = valid_N.sum()
        loss = torch.where(valid_N, lse_N - picked_N, 0.0).sum() / count
        ctx.save_for_backward(logits_NV, target_N, valid_N, lse_N, count)
        ctx.block = block
        return loss

    @staticmethod
    def backward(ctx, grad_loss: torch.Tensor):
        logits_NV, target_N, valid_N, lse_N, count = ctx.saved_tensors
        grad_NV = torch.empty_like(logits_NV)
        # No valid row: zero gradients, as F.cross_entropy's (0 * grad / 0 would be NaN).
        row_scale_N = valid_N.float() * (grad_loss / count.clamp(min=1))
        for start in range(0, logits_NV.shape[0], ctx.block):
            end = start + ctx.block
            probs = torch.exp(logits_NV[start:end].float() - lse_N[start:end, None])  # softmax of the block
            probs.scatter_add_(1, target_N[start:end, None], -torch.ones_like(probs[:, :1]))
            grad_NV[start:end] = (probs * row_scale_N[start:end, None]).to(grad_NV.dtype)
        return grad_NV, None, None


def masked_lm_loss(logits_NV: torch.Tensor, labels_N: torch.Tensor, block: int = BLOCK_ROWS) -> torch.Tensor:
    """Mean cross-entropy of the masked-LM logits over non-IGNORE labels, as an fp32 scalar."""
    if logits_NV.dtype == torch.float32:
        return F.cross_entropy(logits_NV, labels_N, ignore_index=IGNORE)
    return _BlockwiseCrossEntropy.apply(logits_NV, labels_N, block)


def pretraining_loss(mlm_logits_BPV: torch.Tensor, nsp_logits_B2: torch.Tensor, masked_lm_ids_BP: torch.Tensor,
                     next_sentence_label_B: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """MLM + NSP loss (fp32), and [mlm_correct, mlm_total, nsp_correct, nsp_total] (float64, on the
    logits' device; nothing here waits for the device)."""
    labels_N = masked_lm_ids_BP.reshape(-1)
    logits_NV = mlm_logits_BPV.reshape(-1, mlm_logits_BPV.shape[-1])
    loss = masked_lm_loss(logits_NV, labels_N) + F.cross_entropy(nsp_logits_B2.float(), next_sentence_label_B)
    with torch.no_grad():
        valid_N = labels_N != IGNORE
        counts = torch.stack([
            ((logits_NV.argmax(-1) == labels_N) & valid_N).sum(), valid_N.sum(),
            (nsp_logits_B2.argmax(-1) == next_sentence_label_B).sum(),
            (next_sentence_label_B >= 0).sum(),  # the batch size, counted on the device
        ]).double()
    return loss, counts


def targets_showing_mask(masked_lm_ids_BP: torch.Tensor, input_ids_BL: torch.Tensor,
                         masked_lm_positions_BP: torch.Tensor, mask_id: int) -> torch.Tensor:
    """[B, P] bool: the prediction slots that are real targets and whose input shows [MASK]."""
    shown_BP = torch.gather(input_ids_BL, 1, masked_lm_positions_BP)
    return (masked_lm_ids_BP != IGNORE) & (shown_BP == mask_id)


def mlm_counts_at_mask(mlm_logits_BPV: torch.Tensor, masked_lm_ids_BP: torch.Tensor, input_ids_BL: torch.Tensor,
                       masked_lm_positions_BP: torch.Tensor, mask_id: int) -> torch.Tensor:
    """[correct, total] (float64) over the targets whose input shows [MASK].

    BERT leaves 20% of its targets visible (10% kept, 10% replaced at random), and accuracy over all
    targets counts them, so a model that copies what it sees scores well above the unigram level
    without using any context (pipeline/mlm_baseline.py). At [MASK] only context can help: this is the
    accuracy that shows whether pre-training learned any."""
    at_mask_BP = targets_showing_mask(masked_lm_ids_BP, input_ids_BL, masked_lm_positions_BP, mask_id)
    correct = ((mlm_logits_BPV.argmax(-1) == masked_lm_ids_BP) & at_mask_BP).sum()
    return torch.stack([correct, at_mask_BP.sum()]).double()
