"""Each fast path against the eager reference on CPU: same outputs, same gradients, same state_dict keys."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from model import BertConfig, BertForPreTraining, BertModel, apply_activation_checkpointing, compile_fast_paths

REFERENCE = {"attention_impl": "eager", "unpad": False, "pad_vocab_multiple": 1}
FAST = [
    {"attention_impl": "sdpa"},
    {"unpad": True},
    {"attention_impl": "sdpa", "unpad": True},
    {"attention_impl": "sdpa", "unpad": True, "pad_vocab_multiple": 64},
]


def _batch(b: int = 4, l: int = 32, p: int = 5, seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(1000, 30522, (b, l), generator=g)
    types = (torch.arange(l) >= l // 2).long().expand(b, l).clone()
    lengths = torch.tensor([l, l - 9, 11, 6])[:b]
    mask = (torch.arange(l)[None, :] < lengths[:, None]).long()
    positions = torch.stack([torch.randperm(int(n) - 1, generator=g)[:p].sort().values + 1 for n in lengths])
    positions[3, 3:] = 0  # the loader pads positions with 0 and labels with -100
    labels = torch.randint(0, 30522, (b, p), generator=g)
    labels[3, 3:] = -100
    nsp = torch.tensor([0, 1, 0, 1])[:b]
    return ids, types, mask, positions, labels, nsp


def _loss(out, labels, nsp):
    return F.cross_entropy(out.mlm_logits.reshape(-1, out.mlm_logits.shape[-1]).float(), labels.reshape(-1),
                           ignore_index=-100) + F.cross_entropy(out.nsp_logits.float(), nsp)


def _grads(model):
    return {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}


def _copy_weights(src: torch.nn.Module, dst: torch.nn.Module) -> None:
    target = dst.state_dict()
    with torch.no_grad():
        for key, value in src.state_dict().items():
            target[key].zero_()
            target[key][tuple(slice(0, n) for n in value.shape)].copy_(value)


@pytest.mark.parametrize("combo", FAST, ids=lambda c: "-".join(f"{k}={v}" for k, v in c.items()))
def test_fast_path_matches_eager_reference_forward_and_backward(combo):
    torch.manual_seed(0)
    base = BertConfig.preset("tiny", hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0)
    ref = BertForPreTraining(base.replace(**REFERENCE))
    fast = BertForPreTraining(base.replace(**{**REFERENCE, **combo}))
    assert list(ref.state_dict()) == list(fast.state_dict())
    _copy_weights(ref, fast)
    ids, types, mask, positions, labels, nsp = _batch()
    out_ref, out_fast = ref(ids, types, mask, positions), fast(ids, types, mask, positions)
    assert out_fast.mlm_logits.shape == out_ref.mlm_logits.shape == (4, 5, 30522)
    assert (out_fast.mlm_logits - out_ref.mlm_logits).abs().max() < 1e-5
    assert (out_fast.nsp_logits - out_ref.nsp_logits).abs().max() < 1e-5
    _loss(out_ref, labels, nsp).backward()
    _loss(out_fast, labels, nsp).backward()
    g_ref, g_fast = _grads(ref), _grads(fast)
    assert set(g_ref) == set(g_fast)
    for name, g in g_ref.items():
        gf = g_fast[name][tuple(slice(0, n) for n in g.shape)]
        assert torch.allclose(gf, g, atol=1e-6, rtol=1e-4), name
    if combo.get("pad_vocab_multiple", 1) > 1:  # rows that only pad the vocabulary never learn
        assert g_fast["bert.embeddings.word.weight"][30522:].abs().max() == 0


def test_mlm_at_masked_positions_equals_full_logits_gathered():
    torch.manual_seed(0)
    for unpad in (False, True):
        model = BertForPreTraining(BertConfig.preset("tiny", unpad=unpad)).eval()
        ids, types, mask, positions, _, _ = _batch()
        with torch.no_grad():
            full = model(ids, types, mask).mlm_logits
            sparse = model(ids, types, mask, positions).mlm_logits
        assert full.shape == (4, 32, 30522)
        gathered = torch.gather(full, 1, positions[..., None].expand(-1, -1, full.shape[-1]))
        assert (sparse - gathered).abs().max() < 1e-5


def test_unpadded_hidden_states_are_zero_at_padding_and_pooler_matches(monkeypatch, caplog):
    from model import attention

    torch.manual_seed(0)
    padded = BertModel(BertConfig.preset("tiny")).eval()
    unpadded = BertModel(BertConfig.preset("tiny", unpad=True)).eval()
    unpadded.load_state_dict(padded.state_dict())
    ids, types, mask, *_ = _batch()
    monkeypatch.setattr(attention, "_warned", set())  # the fallback logs once per process
    with torch.no_grad(), caplog.at_level("INFO", logger="model.attention"):
        a, b = padded(ids, types, mask, output_hidden_states=True), unpadded(ids, types, mask, output_hidden_states=True)
    assert "re-padding inside attention" in caplog.text  # no varlen kernel on CPU: the fallback says so
    assert (b.last_hidden_state[~mask.bool()] == 0).all()
    assert (a.last_hidden_state - b.last_hidden_state)[mask.bool()].abs().max() < 1e-5
    assert (a.pooled_output - b.pooled_output).abs().max() < 1e-5
    assert len(b.hidden_states) == 3


def test_activation_checkpointing_keeps_loss_and_gradients_with_dropout():
    torch.manual_seed(0)
    config = BertConfig.preset("tiny", unpad=True)  # dropout 0.1 on: RNG must be replayed exactly
    plain = BertForPreTraining(config).train()
    ckpt = BertForPreTraining(config).train()
    ckpt.load_state_dict(plain.state_dict())
    assert apply_activation_checkpointing(ckpt) == 1
    assert list(ckpt.state_dict()) == list(plain.state_dict())
    ids, types, mask, positions, labels, nsp = _batch()
    torch.manual_seed(7)
    loss_plain = _loss(plain(ids, types, mask, positions), labels, nsp)
    loss_plain.backward()
    torch.manual_seed(7)
    loss_ckpt = _loss(ckpt(ids, types, mask, positions), labels, nsp)
    loss_ckpt.backward()
    assert torch.equal(loss_plain, loss_ckpt)
    g_plain, g_ckpt = _grads(plain), _grads(ckpt)
    for name in g_plain:
        assert torch.allclose(g_plain[name], g_ckpt[name], atol=1e-7), name
    with pytest.raises(ValueError, match="no BERT encoder"):
        apply_activation_checkpointing(torch.nn.Linear(2, 2))


def test_init_and_forward_are_deterministic_under_a_seed():
    def build():
        torch.manual_seed(1234)
        return BertForPreTraining(BertConfig.preset("tiny"))

    a, b = build(), build()
    for (ka, va), (kb, vb) in zip(a.state_dict().items(), b.state_dict().items()):
        assert ka == kb and torch.equal(va, vb), ka
    ids, types, mask, positions, *_ = _batch()
    outs = []
    for model in (a, b):
        torch.manual_seed(5)
        outs.append(model.train()(ids, types, mask, positions).mlm_logits)
    assert torch.equal(outs[0], outs[1])
    # Reference init: truncated normal within 2 std of 0.02, LayerNorm at identity, zero biases.
    w = a.bert.encoder.layers[0].ffn.up.weight
    assert w.abs().max() <= 0.04 + 1e-7 and 0.015 < w.std() < 0.02
    assert torch.equal(a.mlm.bias, torch.zeros_like(a.mlm.bias))


def test_mlm_decoder_is_tied_to_word_embeddings():
    model = BertForPreTraining(BertConfig.preset("tiny", pad_vocab_multiple=64))
    assert model.mlm.decoder_weight is model.bert.embeddings.word.weight
    names = [n for n, _ in model.named_parameters()]
    assert len(names) == len(set(names)) and not any("decoder" in n for n in names)
    assert model.bert.embeddings.word.weight.shape[0] == 30528


def test_config_presets_and_validation():
    tiny = BertConfig.preset("tiny")
    assert (tiny.num_hidden_layers, tiny.hidden_size, tiny.intermediate_size, tiny.vocab_size) == (2, 64, 256, 30522)
    large = BertConfig.preset("large")
    assert (large.num_hidden_layers, large.hidden_size, large.num_attention_heads, large.intermediate_size) == (24, 1024, 16, 4096)
    assert abs(BertConfig.preset("base").num_parameters() - 109.5e6) < 0.5e6  # BERT-Base: 110M
    with pytest.raises(ValueError, match="multiple of num_attention_heads"):
        BertConfig(hidden_size=100, num_attention_heads=3)
    with pytest.raises(ValueError, match="choose one of"):
        BertConfig.preset("huge")
    with pytest.raises(ValueError, match="max_position_embeddings"):
        BertModel(BertConfig.preset("tiny", max_position_embeddings=16))(torch.ones(1, 17, dtype=torch.long))


@pytest.mark.slow
def test_compiled_fast_paths_match_eager_and_keep_keys():
    torch.manual_seed(0)
    config = BertConfig.preset("tiny", unpad=True, hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0)
    eager = BertForPreTraining(config)
    fused = BertForPreTraining(config)
    fused.load_state_dict(eager.state_dict())
    keys = list(fused.state_dict())
    assert compile_fast_paths(fused) == 5  # 2 attention outputs + 2 feed-forward blocks + the MLM head
    assert list(fused.state_dict()) == keys
    ids, types, mask, positions, labels, nsp = _batch()
    for model in (eager, fused):
        _loss(model(ids, types, mask, positions), labels, nsp).backward()
    a, b = eager(ids, types, mask, positions), fused(ids, types, mask, positions)
    assert (a.mlm_logits - b.mlm_logits).abs().max() < 1e-4
    g_a, g_b = _grads(eager), _grads(fused)
    for name in g_a:
        assert torch.allclose(g_a[name], g_b[name], atol=1e-5, rtol=1e-3), name


@pytest.mark.parametrize("field, value", [
    ("pad_token_id", 1000),  # one past the last id: an IndexError in the first embedding lookup
    ("hidden_dropout_prob", 1.0),  # drops everything: a model that learns nothing, silently
    ("attention_probs_dropout_prob", 1.0),
    ("classifier_dropout", 1.0),
    ("layer_norm_eps", 0.0),  # a division by zero on a constant row
    ("pad_vocab_multiple", 0),  # a ZeroDivisionError sizing the vocabulary rows
])
def test_config_refuses_each_value_just_past_its_range(field, value):
    with pytest.raises(ValueError, match=field):
        BertConfig.preset("tiny", vocab_size=1000, **{field: value})
    # ...while the edge just inside it builds.
    inside = {"pad_token_id": 999, "layer_norm_eps": 1e-12, "pad_vocab_multiple": 1}.get(field, 0.0)
    BertConfig.preset("tiny", vocab_size=1000, **{field: inside})


@pytest.mark.parametrize("preset", ["tiny", "mini"])
def test_num_parameters_counts_exactly_the_models_parameters(preset):
    # The count a user quotes (and plans memory by): the encoder and pooler as built, the tied MLM decoder once.
    config = BertConfig.preset(preset, vocab_size=1000, max_position_embeddings=64)
    model = BertModel(config)
    assert config.num_parameters() == sum(p.numel() for p in model.parameters())
    assert config.num_parameters(include_embeddings=False) == sum(
        p.numel() for name, p in model.named_parameters() if not name.startswith("embeddings."))
