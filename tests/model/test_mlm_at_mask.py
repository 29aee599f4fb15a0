"""MLM accuracy at [MASK] only: visible targets (kept or replaced) and padded slots are not counted."""

import torch

from model import mlm_counts_at_mask

MASK = 4


def test_counts_only_targets_that_show_mask():
    # One sequence of 6 tokens; three prediction slots: position 1 shows [MASK], position 3 was kept
    # (shows its own token 9), the third slot is padding (label -100).
    input_ids = torch.tensor([[2, MASK, 7, 9, 8, 3]])
    positions = torch.tensor([[1, 3, 0]])
    labels = torch.tensor([[11, 9, -100]])
    logits = torch.full((1, 3, 16), -1.0)
    logits[0, 0, 11] = 5.0  # right at [MASK]
    logits[0, 1, 9] = 5.0  # right at the kept token: counted over all targets, not at [MASK]
    logits[0, 2, 0] = 5.0
    assert mlm_counts_at_mask(logits, labels, input_ids, positions, MASK).tolist() == [1.0, 1.0]

    logits[0, 0] = -1.0
    logits[0, 0, 12] = 5.0  # wrong at [MASK]
    assert mlm_counts_at_mask(logits, labels, input_ids, positions, MASK).tolist() == [0.0, 1.0]


def test_no_target_shows_mask():
    input_ids = torch.tensor([[2, 7, 3]])
    counts = mlm_counts_at_mask(torch.zeros(1, 1, 8), torch.tensor([[7]]), input_ids, torch.tensor([[1]]), MASK)
    assert counts.tolist() == [0.0, 0.0]
