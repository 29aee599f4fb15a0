"""Hugging Face directories that do not describe their own weights are refused, naming the file.

Each case is a copy of a real exported checkpoint (`tiny_checkpoint`) with one file changed.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from model import BertModel, load_pretrained
from model.hf import count_vocab
from pipeline.vocab import read_vocab_tokens


def _copy(src: Path, dest: Path) -> Path:
    return Path(shutil.copytree(src, dest))


@pytest.mark.parametrize("text", [
    "[PAD]\n[UNK]\n", "[PAD]\n[UNK]", "[PAD]\n[UNK]\n\n\n", "\ufeff[PAD]\r\n[UNK]\r\n", "[PAD]\n\n[UNK]\n", "",
])
def test_vocab_size_is_counted_by_the_one_rule(tmp_path, text):
    path = tmp_path / "vocab.txt"
    path.write_text(text, encoding="utf-8")
    assert count_vocab(path) == len(read_vocab_tokens(text))  # model/ restates pipeline.vocab's rule


def test_a_vocab_ending_in_blank_lines_still_loads(tiny_checkpoint, tmp_path):
    ckpt = _copy(tiny_checkpoint, tmp_path / "ckpt")
    with open(ckpt / "vocab.txt", "a", encoding="utf-8") as f:
        f.write("\n\n")
    model, _ = load_pretrained(BertModel, ckpt)
    assert model.config.vocab_size == 30522


@pytest.mark.parametrize("tokens", [30000, 30522 + 1])  # well under the 30522 rows; one more than them
def test_a_vocab_that_is_not_the_checkpoints_is_refused_not_trimmed_to(tiny_checkpoint, tmp_path, tokens):
    """Rows beyond vocab.txt are alignment padding only when fewer than 128: a vocabulary 522 tokens short
    belongs to another model, and loading would have cut the embeddings to it without a word."""
    ckpt = _copy(tiny_checkpoint, tmp_path / "ckpt")
    (ckpt / "vocab.txt").write_text("".join(f"tok{i}\n" for i in range(tokens)), encoding="utf-8")
    with pytest.raises(ValueError, match=rf"vocab.txt has {tokens} tokens but the checkpoint has 30522 embedding rows"):
        load_pretrained(BertModel, ckpt)


def test_an_empty_vocab_is_named_as_empty_not_as_another_models(tiny_checkpoint, tmp_path):
    # A write cut short by a full disk leaves vocab.txt at 0 bytes; the message blamed another vocabulary.
    ckpt = _copy(tiny_checkpoint, tmp_path / "ckpt")
    (ckpt / "vocab.txt").write_bytes(b"")
    with pytest.raises(ValueError, match=r"vocab.txt is empty; copy the model's vocab.txt there again"):
        load_pretrained(BertModel, ckpt)


def _edit_config(ckpt: Path, **changes) -> None:
    config = json.loads((ckpt / "config.json").read_text())
    (ckpt / "config.json").write_text(json.dumps({**config, **changes}))


def test_a_config_with_fewer_layers_than_the_weights_is_refused(tiny_checkpoint, tmp_path):
    ckpt = _copy(tiny_checkpoint, tmp_path / "ckpt")
    _edit_config(ckpt, num_hidden_layers=1)
    with pytest.raises(ValueError, match=r"model.safetensors holds encoder layer\(s\) 1 beyond what config.json's "
                                         r"num_hidden_layers describes"):
        load_pretrained(BertModel, ckpt)


@pytest.mark.parametrize("content, message", [
    ("[1, 2]", "holds a JSON list, not an object"),
    (None, r"num_hidden_layers is 2.0; it must be an integer"),
    (None, r"hidden_size is '32'; it must be an integer"),
    (b'{"hidden_act": "gelu\xe9"}', "is not UTF-8 text"),
])
def test_a_config_that_is_not_settings_is_refused_naming_it(tiny_checkpoint, tmp_path, content, message):
    ckpt = _copy(tiny_checkpoint, tmp_path / "ckpt")
    if isinstance(content, bytes):
        (ckpt / "config.json").write_bytes(content)
    elif content is not None:
        (ckpt / "config.json").write_text(content)
    else:
        field, value = ("num_hidden_layers", 2.0) if "layers" in message else ("hidden_size", "32")
        _edit_config(ckpt, **{field: value})
    with pytest.raises(ValueError, match="config.json") as err:
        load_pretrained(BertModel, ckpt)
    assert err.match(message)


@pytest.mark.parametrize("flag", ["is_decoder", "add_cross_attention"])
def test_a_bert_decoder_is_refused_not_run_as_an_encoder(tiny_checkpoint, tmp_path, flag):
    ckpt = _copy(tiny_checkpoint, tmp_path / "ckpt")
    _edit_config(ckpt, **{flag: True})
    with pytest.raises(ValueError, match=f"{flag} is true: a BERT decoder; only encoder checkpoints"):
        load_pretrained(BertModel, ckpt)


@pytest.mark.parametrize("field, value, message", [
    # Each a BERT-shaped checkpoint this model would run with the wrong math and no error.
    ("position_embedding_type", "relative_key", "position_embedding_type 'relative_key' is not supported"),
    ("hidden_act", "relu", "hidden_act 'relu' is not supported"),
    ("model_type", "roberta", "model_type is 'roberta'; only 'bert' checkpoints can be loaded"),
    ("num_attention_heads", True, "num_attention_heads is True; it must be an integer"),  # JSON true is not 1 head
])
def test_a_variant_this_bert_does_not_implement_is_refused_naming_it(tiny_checkpoint, tmp_path, field, value, message):
    ckpt = _copy(tiny_checkpoint, tmp_path / "ckpt")
    _edit_config(ckpt, **{field: value})
    with pytest.raises(ValueError, match="config.json") as err:
        load_pretrained(BertModel, ckpt)
    assert err.match(message)


def test_a_sharded_index_whose_weight_map_is_not_a_mapping_is_refused(tiny_checkpoint, tmp_path):
    ckpt = _copy(tiny_checkpoint, tmp_path / "ckpt")
    (ckpt / "model.safetensors").rename(ckpt / "model-00001-of-00001.safetensors")
    (ckpt / "model.safetensors.index.json").write_text(json.dumps({"weight_map": ["model-00001-of-00001.safetensors"]}))
    with pytest.raises(ValueError, match="weight_map must map tensor names to file names"):
        load_pretrained(BertModel, ckpt)
