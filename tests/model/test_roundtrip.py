"""HF checkpoint round trips: ours -> export -> transformers, and HF -> ours -> export -> HF."""

from __future__ import annotations

import pytest
import torch
import transformers
from safetensors.torch import load_file

from model import (
    BertConfig,
    BertForMultipleChoice,
    BertForPreTraining,
    BertForQuestionAnswering,
    BertForSequenceClassification,
    BertForTokenClassification,
    BertModel,
    load_pretrained,
    save_pretrained,
)


def _batch(vocab: int, b: int = 3, l: int = 24, seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(1000, vocab, (b, l), generator=g)
    types = torch.zeros_like(ids)
    types[:, l // 2:] = 1
    mask = torch.ones_like(ids)
    mask[1, l - 7:] = 0
    mask[2, 5:] = 0
    return ids, types, mask


@pytest.mark.parametrize("pad_vocab_multiple", [1, 64])
def test_our_init_exports_to_transformers_with_identical_logits(tmp_path, pad_vocab_multiple):
    torch.manual_seed(1)
    config = BertConfig.preset("tiny", pad_vocab_multiple=pad_vocab_multiple)
    ours = BertForPreTraining(config).eval()
    save_pretrained(ours, tmp_path)
    hf, info = transformers.BertForPreTraining.from_pretrained(str(tmp_path), output_loading_info=True)
    assert info["missing_keys"] == set() or not info["missing_keys"], info
    assert not info["unexpected_keys"] and not info["mismatched_keys"], info
    hf.eval()
    assert hf.config.vocab_size == 30522
    ids, types, mask = _batch(30522)
    with torch.no_grad():
        a = ours(ids, types, mask)
        b = hf(input_ids=ids, token_type_ids=types, attention_mask=mask)
    real = mask.bool()
    assert a.mlm_logits.shape == b.prediction_logits.shape
    assert (a.mlm_logits - b.prediction_logits)[real].abs().max() < 1e-5
    assert (a.nsp_logits - b.seq_relationship_logits).abs().max() < 1e-5
    # Our init has zero biases and identity LayerNorms, under which a dropped or swapped bias / LayerNorm
    # (e.g. the MLM bias) would not change the logits: perturb every tensor and export again.
    with torch.no_grad():
        for p in ours.parameters():
            p.add_(torch.randn_like(p) * 0.05)
    save_pretrained(ours, tmp_path / "perturbed")
    hf = transformers.BertForPreTraining.from_pretrained(str(tmp_path / "perturbed")).eval()
    with torch.no_grad():
        a = ours(ids, types, mask)
        b = hf(input_ids=ids, token_type_ids=types, attention_mask=mask)
    assert (a.mlm_logits - b.prediction_logits)[real].abs().max() < 1e-5
    assert (a.nsp_logits - b.seq_relationship_logits).abs().max() < 1e-5


def test_hf_to_ours_to_hf_keeps_every_tensor(tmp_path):
    torch.manual_seed(2)
    hf_config = transformers.BertConfig(vocab_size=30522, hidden_size=64, num_hidden_layers=2, num_attention_heads=2,
                                        intermediate_size=256)
    hf = transformers.BertForPreTraining(hf_config)
    with torch.no_grad():  # non-trivial heads, so a dropped or misnamed tensor would show
        for p in hf.cls.parameters():
            p.add_(torch.randn_like(p) * 0.1)
    hf.save_pretrained(str(tmp_path / "hf"))
    ours, report = load_pretrained(BertForPreTraining, tmp_path / "hf", config_overrides={"pad_vocab_multiple": 64})
    assert not report.missing_keys and not report.unexpected_keys
    save_pretrained(ours, tmp_path / "ours")
    a = load_file(str(tmp_path / "hf" / "model.safetensors"))
    b = load_file(str(tmp_path / "ours" / "model.safetensors"))
    assert set(a) == set(b)
    for key in a:
        assert torch.equal(a[key], b[key]), key
    # The loaded heads compute what transformers' do (not only the same tensors under the same names).
    ids, types, mask = _batch(30522)
    with torch.no_grad():
        ours_out = ours.eval()(ids, types, mask)
        hf_out = hf.eval()(input_ids=ids, token_type_ids=types, attention_mask=mask)
    assert (ours_out.mlm_logits - hf_out.prediction_logits)[mask.bool()].abs().max() < 1e-5
    assert (ours_out.nsp_logits - hf_out.seq_relationship_logits).abs().max() < 1e-5
    # A save that keeps the tied MLM bias only under `cls.predictions.decoder.bias` loads it too.
    from safetensors.torch import save_file

    (tmp_path / "decoder_bias").mkdir()
    (tmp_path / "decoder_bias" / "config.json").write_bytes((tmp_path / "hf" / "config.json").read_bytes())
    renamed = {("cls.predictions.decoder.bias" if k == "cls.predictions.bias" else k): v for k, v in a.items()}
    save_file(renamed, str(tmp_path / "decoder_bias" / "model.safetensors"))
    again, report = load_pretrained(BertForPreTraining, tmp_path / "decoder_bias")
    assert not report.missing_keys and not report.unexpected_keys
    assert torch.equal(again.mlm.bias, a["cls.predictions.bias"])


@pytest.mark.parametrize(
    "ours_cls, hf_cls, kwargs",
    [
        (BertModel, transformers.BertModel, {}),
        (BertForSequenceClassification, transformers.BertForSequenceClassification, {"num_labels": 3}),
        (BertForTokenClassification, transformers.BertForTokenClassification, {"num_labels": 5}),
        (BertForQuestionAnswering, transformers.BertForQuestionAnswering, {}),
    ],
    ids=lambda v: getattr(v, "__name__", "") if isinstance(v, type) else "",
)
def test_task_heads_export_and_match_transformers(tmp_path, ours_cls, hf_cls, kwargs):
    torch.manual_seed(3)
    ours = ours_cls(BertConfig.preset("tiny", vocab_size=5000), **kwargs).eval()
    save_pretrained(ours, tmp_path)
    hf, info = hf_cls.from_pretrained(str(tmp_path), output_loading_info=True)
    assert not info["missing_keys"] and not info["unexpected_keys"], info
    hf.eval()
    ids, types, mask = _batch(5000)
    with torch.no_grad():
        a = ours(ids, types, mask)
        b = hf(input_ids=ids, token_type_ids=types, attention_mask=mask)
    real = mask.bool()
    if ours_cls is BertModel:
        assert (a.last_hidden_state - b.last_hidden_state)[real].abs().max() < 1e-5
    elif ours_cls is BertForQuestionAnswering:
        assert (a.start_logits - b.start_logits)[real].abs().max() < 1e-5
        assert (a.end_logits - b.end_logits)[real].abs().max() < 1e-5
    elif ours_cls is BertForTokenClassification:
        assert (a - b.logits)[real].abs().max() < 1e-5
    else:
        assert (a - b.logits).abs().max() < 1e-5
    # And back: transformers' own save loads into ours with nothing missing.
    hf.save_pretrained(str(tmp_path / "again"))
    back, report = load_pretrained(ours_cls, tmp_path / "again", **kwargs)
    assert not report.missing_keys and not report.unexpected_keys


def test_multiple_choice_matches_transformers(tmp_path):
    torch.manual_seed(4)
    ours = BertForMultipleChoice(BertConfig.preset("tiny", vocab_size=5000)).eval()
    save_pretrained(ours, tmp_path)
    hf = transformers.BertForMultipleChoice.from_pretrained(str(tmp_path)).eval()
    ids, types, mask = (t.view(1, 3, -1) for t in _batch(5000))
    with torch.no_grad():
        a = ours(ids, types, mask)
        b = hf(input_ids=ids, token_type_ids=types, attention_mask=mask).logits
    assert a.shape == (1, 3) and (a - b).abs().max() < 1e-5
    with pytest.raises(ValueError, match="choices"):
        ours(ids[0], types[0], mask[0])


def test_export_refuses_a_vocab_of_the_wrong_size(tmp_path):
    vocab = tmp_path / "vocab.txt"
    vocab.write_text("[PAD]\n[UNK]\n")
    with pytest.raises(ValueError, match="2 tokens"):
        save_pretrained(BertModel(BertConfig.preset("tiny")), tmp_path / "out", vocab_file=vocab)
    assert not (tmp_path / "out").exists()  # refused before any file is written


def test_initializer_range_zero_builds_a_model():
    """An HF config may hold initializer_range 0 (the config allows it); the init divided by it."""
    model = BertModel(BertConfig.preset("tiny", vocab_size=100, initializer_range=0.0))
    assert model.embeddings.word.weight.abs().max() == 0


def test_sharded_safetensors_checkpoint_loads(tmp_path):
    torch.manual_seed(5)
    hf_config = transformers.BertConfig(vocab_size=5000, hidden_size=64, num_hidden_layers=2, num_attention_heads=2,
                                        intermediate_size=256)
    hf = transformers.BertForPreTraining(hf_config).eval()
    hf.save_pretrained(str(tmp_path), max_shard_size="200KB")
    assert (tmp_path / "model.safetensors.index.json").is_file()
    ours, report = load_pretrained(BertForPreTraining, tmp_path)
    assert not report.missing_keys and not report.unexpected_keys
    assert report.source.endswith("model.safetensors.index.json")
    ids, types, mask = _batch(5000)
    with torch.no_grad():
        a, b = ours.eval()(ids, types, mask), hf(input_ids=ids, token_type_ids=types, attention_mask=mask)
    assert (a.nsp_logits - b.seq_relationship_logits).abs().max() < 1e-5


def _hf_tiny(tmp_path, **config):
    torch.manual_seed(5)
    hf_config = transformers.BertConfig(vocab_size=1000, hidden_size=64, num_hidden_layers=2, num_attention_heads=2,
                                        intermediate_size=256, **config)
    return transformers.BertForPreTraining(hf_config).eval()


def test_a_missing_encoder_tensor_is_refused_not_drawn_at_random(tmp_path):
    from safetensors.torch import save_file

    _hf_tiny(tmp_path).save_pretrained(str(tmp_path))
    tensors = load_file(tmp_path / "model.safetensors")
    del tensors["bert.encoder.layer.1.output.dense.weight"]
    save_file(tensors, str(tmp_path / "model.safetensors"), metadata={"format": "pt"})
    for cls, kw in ((BertForPreTraining, {}), (BertForSequenceClassification, {"num_labels": 2})):
        with pytest.raises(ValueError, match=r"model.safetensors lacks encoder weights \(bert.encoder.layers.1.ffn"):
            load_pretrained(cls, tmp_path, **kw)
    # the pooler may be absent (some checkpoints drop it): it starts fresh, with a warning
    _hf_tiny(tmp_path).save_pretrained(str(tmp_path))
    tensors = {k: v for k, v in load_file(tmp_path / "model.safetensors").items() if ".pooler." not in k}
    save_file(tensors, str(tmp_path / "model.safetensors"), metadata={"format": "pt"})
    _, report = load_pretrained(BertForSequenceClassification, tmp_path, num_labels=2)
    assert "bert.pooler.dense.weight" in report.missing_keys


def test_an_untied_mlm_decoder_is_refused_for_pre_training_and_ignored_for_fine_tuning(tmp_path):
    hf = _hf_tiny(tmp_path, tie_word_embeddings=False)
    with torch.no_grad():
        hf.cls.predictions.decoder.weight.add_(1.0)
    hf.save_pretrained(str(tmp_path))
    with pytest.raises(ValueError, match=r"cls.predictions.decoder.weight differs from the word embeddings"):
        load_pretrained(BertForPreTraining, tmp_path)
    _, report = load_pretrained(BertForSequenceClassification, tmp_path, num_labels=2)
    assert "cls.predictions.decoder.weight" in report.unexpected_keys
    _hf_tiny(tmp_path).save_pretrained(str(tmp_path))  # tied: loads with nothing left over
    _, report = load_pretrained(BertForPreTraining, tmp_path)
    assert not report.missing_keys and not report.unexpected_keys


def test_head_label_counts_are_checked_where_each_head_needs_them():
    # A one-label sequence head is regression (STS-B); a one-label tagger would argmax to that label on
    # every token and score nothing, so it is refused when built, not after an epoch.
    config = BertConfig.preset("tiny", vocab_size=100, max_position_embeddings=16)
    assert BertForSequenceClassification(config, num_labels=1).classifier.out_features == 1
    with pytest.raises(ValueError, match="num_labels must be >= 1"):
        BertForSequenceClassification(config, num_labels=0)
    assert BertForTokenClassification(config, num_labels=2).classifier.out_features == 2
    with pytest.raises(ValueError, match="num_labels must be >= 2 for token classification, got 1"):
        BertForTokenClassification(config, num_labels=1)
