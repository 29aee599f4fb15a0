"""Numerical parity with transformers.BertModel on a real checkpoint (MiniLM-L6, 6 layers, H384)."""

from __future__ import annotations

import shutil

import pytest
import torch

from model import BertForPreTraining, BertForSequenceClassification, BertModel, load_pretrained, save_pretrained

# Every fast-path combination that claims exactness in fp32.
EXACT_COMBOS = [
    {"attention_impl": "eager"},
    {"attention_impl": "sdpa"},
    {"attention_impl": "eager", "unpad": True},
    {"attention_impl": "sdpa", "unpad": True},
    {"attention_impl": "sdpa", "unpad": True, "pad_vocab_multiple": 64},
]


@pytest.fixture(scope="module")
def hf_reference(hf_minilm, minilm_batch):
    ids, types, mask = minilm_batch
    with torch.no_grad():
        return hf_minilm(input_ids=ids, token_type_ids=types, attention_mask=mask, output_hidden_states=True)


@pytest.mark.parametrize("combo", EXACT_COMBOS, ids=lambda c: "-".join(f"{k}={v}" for k, v in c.items()))
def test_hidden_states_match_transformers(minilm_dir, minilm_batch, hf_reference, combo):
    ids, types, mask = minilm_batch
    model, report = load_pretrained(BertModel, minilm_dir, config_overrides=combo)
    assert report.missing_keys == [] and report.unexpected_keys == [] and report.mismatched_keys == []
    model.eval()
    with torch.no_grad():
        ours = model(ids, types, mask, output_hidden_states=True)
    real = mask.bool()
    assert len(ours.hidden_states) == len(hf_reference.hidden_states) == 7
    for layer, (a, b) in enumerate(zip(ours.hidden_states, hf_reference.hidden_states)):
        diff = (a - b)[real].abs().max().item()
        assert diff < 1e-5, f"layer {layer}: max |ours - transformers| = {diff}"
    assert (ours.last_hidden_state - hf_reference.last_hidden_state)[real].abs().max() < 1e-5
    assert (ours.pooled_output - hf_reference.pooler_output).abs().max() < 1e-5


def test_missing_heads_are_initialised_and_reported(minilm_dir):
    model, report = load_pretrained(BertForPreTraining, minilm_dir)
    assert report.initialized_heads == ["mlm", "nsp"]
    assert "mlm.bias" in report.missing_keys and "nsp.weight" in report.missing_keys
    assert not any(k.startswith("bert.") for k in report.missing_keys)
    cls, report = load_pretrained(BertForSequenceClassification, minilm_dir, num_labels=3)
    assert report.missing_keys == ["classifier.weight", "classifier.bias"]
    assert cls.classifier.out_features == 3


def test_pytorch_bin_with_bert_prefix_and_padded_vocab(minilm_dir, tmp_path, minilm_batch, hf_reference):
    """The NVIDIA-style checkpoint: `bert.` prefix, pickle, embeddings padded to 30528 rows while
    vocab.txt has 30522 tokens; loads, trims and still matches."""
    from safetensors.torch import load_file

    state = {f"bert.{k}": v for k, v in load_file(str(minilm_dir / "model.safetensors")).items()}
    emb = state["bert.embeddings.word_embeddings.weight"]
    state["bert.embeddings.word_embeddings.weight"] = torch.cat([emb, torch.randn(6, emb.shape[1])])
    torch.save(state, tmp_path / "pytorch_model.bin")
    config = (minilm_dir / "config.json").read_text().replace('"vocab_size": 30522', '"vocab_size": 30528')
    (tmp_path / "config.json").write_text(config)
    shutil.copyfile(minilm_dir / "vocab.txt", tmp_path / "vocab.txt")
    model, report = load_pretrained(BertModel, tmp_path)
    assert report.vocab_trimmed_from == 30528 and model.config.vocab_size == 30522
    assert report.source.endswith("pytorch_model.bin")
    ids, types, mask = minilm_batch
    with torch.no_grad():
        out = model.eval()(ids, types, mask)
    assert (out.last_hidden_state - hf_reference.last_hidden_state)[mask.bool()].abs().max() < 1e-5


def test_vocab_that_does_not_belong_to_the_checkpoint_is_refused(minilm_dir, tmp_path):
    for name in ("config.json", "model.safetensors"):
        shutil.copyfile(minilm_dir / name, tmp_path / name)
    (tmp_path / "vocab.txt").write_text("".join(f"tok{i}\n" for i in range(30600)))
    with pytest.raises(ValueError, match="does not belong"):
        load_pretrained(BertModel, tmp_path)


def test_not_a_model_directory(tmp_path):
    with pytest.raises(ValueError, match="no config.json"):
        load_pretrained(BertModel, tmp_path)
    (tmp_path / "config.json").write_text('{"model_type": "bert"}')
    with pytest.raises(ValueError, match="model.safetensors"):
        load_pretrained(BertModel, tmp_path)
    (tmp_path / "config.json").write_text('{"model_type": "roberta"}')
    with pytest.raises(ValueError, match="only 'bert'"):
        load_pretrained(BertModel, tmp_path)


def test_real_checkpoint_round_trips_tensor_for_tensor(minilm_dir, tmp_path):
    """HF (real MiniLM weights, no `bert.` prefix) -> ours (vocab padded to 64) -> export: same tensors."""
    from safetensors.torch import load_file

    model, _ = load_pretrained(BertModel, minilm_dir, config_overrides={"pad_vocab_multiple": 64, "unpad": True})
    assert model.embeddings.word.weight.shape[0] == 30528
    save_pretrained(model, tmp_path, vocab_file=minilm_dir / "vocab.txt")
    original = load_file(str(minilm_dir / "model.safetensors"))
    exported = load_file(str(tmp_path / "model.safetensors"))
    original.pop("embeddings.position_ids", None)  # a buffer transformers recomputes, not a weight
    assert set(original) == set(exported)
    for key, tensor in original.items():
        assert torch.equal(tensor, exported[key]), key
    assert (tmp_path / "vocab.txt").read_bytes() == (minilm_dir / "vocab.txt").read_bytes()


@pytest.mark.parametrize("classifier_dropout", [None, 0.0, 0.3])
def test_the_heads_take_classifier_dropout_as_transformers_does(tiny_checkpoint, tmp_path, classifier_dropout):
    """A transformers config's classifier_dropout (null: hidden_dropout_prob) is the task heads' dropout,
    and it survives a save."""
    import json

    import transformers

    from model import BertForMultipleChoice, BertForTokenClassification

    ckpt = shutil.copytree(tiny_checkpoint, tmp_path / "ckpt")
    config = json.loads((ckpt / "config.json").read_text())
    (ckpt / "config.json").write_text(json.dumps({**config, "hidden_dropout_prob": 0.2,
                                                  "classifier_dropout": classifier_dropout}))
    pairs = [(BertForSequenceClassification, {"num_labels": 3}, transformers.BertForSequenceClassification),
             (BertForTokenClassification, {"num_labels": 3}, transformers.BertForTokenClassification),
             (BertForMultipleChoice, {}, transformers.BertForMultipleChoice)]
    for ours_cls, kwargs, theirs_cls in pairs:
        ours, _ = load_pretrained(ours_cls, ckpt, **kwargs)
        theirs = theirs_cls.from_pretrained(ckpt, **kwargs)
        assert ours.dropout.p == theirs.dropout.p == (0.2 if classifier_dropout is None else classifier_dropout)
        assert ours.bert.embeddings.dropout.p == 0.2  # the encoder keeps hidden_dropout_prob
    save_pretrained(ours, tmp_path / "saved")
    assert json.loads((tmp_path / "saved" / "config.json").read_text())["classifier_dropout"] == classifier_dropout
