"""`checkpoint.init_from` (`launch.pretrain.init_from.load_init_from`) in this process, on a gloo group of one,
from the tiny random HF checkpoint: the weights are the checkpoint's, every non-architecture setting the run's,
and what cannot be phase 1 of this run is refused in one line (test_pretrain_e2e.py runs it from a RUN dir)."""

from __future__ import annotations


import pytest
import torch

from launch.pretrain.init_from import load_init_from
from model.config import BertConfig
from repo_paths import VOCAB

ARCH = dict(vocab_size=30522, hidden_size=32, num_hidden_layers=2, num_attention_heads=2, intermediate_size=64,
            max_position_embeddings=256)  # the tiny_checkpoint fixture's




def checkpoint_state(path) -> dict[str, torch.Tensor]:
    from model import BertForPreTraining, load_pretrained

    return load_pretrained(BertForPreTraining, path)[0].state_dict()


def test_the_weights_are_the_checkpoints_and_dropout_and_fast_paths_the_runs(gloo_group_of_one, tiny_checkpoint):
    run_cfg = BertConfig(**ARCH, hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.25, unpad=True)
    model = load_init_from(str(tiny_checkpoint), run_cfg, VOCAB)
    assert model.config == run_cfg  # its config is this run's, field for field
    theirs = checkpoint_state(tiny_checkpoint)
    mine = model.state_dict()
    assert set(mine) == set(theirs) and all(torch.equal(mine[k], theirs[k]) for k in theirs)


def test_a_padded_vocab_size_keeps_the_checkpoints_rows_and_draws_the_padding(gloo_group_of_one, tiny_checkpoint):
    run_cfg = BertConfig(**{**ARCH, "vocab_size": 30522 + 6})
    model = load_init_from(str(tiny_checkpoint), run_cfg, VOCAB)
    assert model.config.vocab_size == 30528
    theirs, mine = checkpoint_state(tiny_checkpoint), model.state_dict()
    for key in ("bert.embeddings.word.weight", "mlm.bias"):
        assert mine[key].shape[0] == 30528 and torch.equal(mine[key][:30522], theirs[key])
    assert mine["bert.embeddings.word.weight"][30522:].abs().sum() > 0  # drawn, not zeros


def test_another_architecture_vocabulary_or_a_checkpoint_without_heads_is_refused(
        gloo_group_of_one, tiny_checkpoint, tmp_path):
    deeper = BertConfig(**{**ARCH, "num_hidden_layers": 3, "intermediate_size": 128})
    with pytest.raises(ValueError, match=r"is not the model this config describes \(num_hidden_layers 2 there, 3 here; "
                                         r"intermediate_size 64 there, 128 here\)"):
        load_init_from(str(tiny_checkpoint), deeper, VOCAB)

    other_vocab = tmp_path / "vocab.txt"
    other_vocab.write_bytes(VOCAB.read_bytes().replace(b"[unused0]", b"[unused00]"))
    with pytest.raises(ValueError, match="differs from the corpus vocabulary .*; phase 2 must use the phase-1 vocab"):
        load_init_from(str(tiny_checkpoint), BertConfig(**ARCH), other_vocab)

    from model import BertModel
    from model.hf import save_pretrained

    encoder_only = tmp_path / "encoder"
    save_pretrained(BertModel(BertConfig(**ARCH)), encoder_only, vocab_file=VOCAB)
    with pytest.raises(ValueError, match=r"lacks .*mlm.*; init_from needs a pre-training checkpoint"):
        load_init_from(str(encoder_only), BertConfig(**ARCH), VOCAB)
