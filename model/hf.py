"""Hugging Face checkpoint interop through a state-dict adapter (names, fused QKV, vocab padding).

Our modules keep their own names (`encoder.layers.3.attention.qkv`); this file maps them to and from
HF's (`encoder.layer.3.attention.self.{query,key,value}`) instead of bending the model to match.

Loading accepts `config.json` + `model.safetensors` (or a sharded `model.safetensors.index.json`,
or `pytorch_model.bin` read by `load_torch_file`, the one `torch.load`: tensors only, never code),
tensor names with or without the `bert.` prefix, with or without `cls.*` / task heads: heads the
checkpoint lacks are initialised and listed in the returned `LoadReport`. Checkpoints whose embedding matrix is padded beyond the real vocabulary
(NVIDIA's 30528 rows for the 30522-token vocab) are trimmed to the size `vocab.txt` says.
Saving writes a directory `transformers.BertForPreTraining.from_pretrained` (or the matching task
class) loads with no missing or unexpected keys.
"""

from __future__ import annotations

import json
import logging
import os
import re
import shutil
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

import torch
from torch import nn

from model.bert import BertForPreTraining, BertModel
from model.config import BertConfig
from model.torch_files import load_torch_file
from model.heads import (
    BertForMultipleChoice,
    BertForQuestionAnswering,
    BertForSequenceClassification,
    BertForTokenClassification,
)

logger = logging.getLogger(__name__)

M = TypeVar("M", bound=nn.Module)

# Our class -> HF architecture name written to config.json.
_ARCHITECTURES: dict[type, str] = {
    BertModel: "BertModel",
    BertForPreTraining: "BertForPreTraining",
    BertForSequenceClassification: "BertForSequenceClassification",
    BertForQuestionAnswering: "BertForQuestionAnswering",
    BertForTokenClassification: "BertForTokenClassification",
    BertForMultipleChoice: "BertForMultipleChoice",
}

# Per-layer renames: HF suffix after `encoder.layer.N.` <-> ours after `encoder.layers.N.`.
_LAYER_MAP = {
    "attention.output.dense": "attention.out",
    "attention.output.LayerNorm": "attention.norm",
    "intermediate.dense": "ffn.up",
    "output.dense": "ffn.down",
    "output.LayerNorm": "ffn.norm",
}
_TOP_MAP = {
    "embeddings.word_embeddings": "embeddings.word",
    "embeddings.position_embeddings": "embeddings.position",
    "embeddings.token_type_embeddings": "embeddings.token_type",
    "embeddings.LayerNorm": "embeddings.norm",
    "pooler.dense": "pooler.dense",
}
_HEAD_MAP = {  # HF (no prefix) -> ours (top level of the head model)
    "cls.predictions.transform.dense": "mlm.transform",
    "cls.predictions.transform.LayerNorm": "mlm.norm",
    "cls.seq_relationship": "nsp",
    "classifier": "classifier",
    "qa_outputs": "qa_outputs",
}
# HF tensors that carry no information of their own: buffers and tied copies.
UNTIED_DECODER = "cls.predictions.decoder.weight"
_REDUNDANT = re.compile(r"(^|\.)(position_ids|cls\.predictions\.decoder\.(weight|bias))$")
_LAYER_RE = re.compile(r"^encoder\.layer\.(\d+)\.(.+)\.(weight|bias)$")
_OUR_LAYER_RE = re.compile(r"^(?:bert\.)?encoder\.layers\.(\d+)\.")  # an encoder layer's tensors, our names


@dataclass
class LoadReport:
    """What `load_pretrained` did, for the log and for tests."""

    source: str
    missing_keys: list[str] = field(default_factory=list)  # ours, freshly initialised
    unexpected_keys: list[str] = field(default_factory=list)  # checkpoint's, ignored
    mismatched_keys: list[str] = field(default_factory=list)  # head shapes differ: re-initialised
    vocab_trimmed_from: int | None = None  # embedding rows in the file when more than the vocab
    head_labels: list[str] | None = None  # config.json's id2label by output index; None if absent or LABEL_i only

    @property
    def initialized_heads(self) -> list[str]:
        return sorted({k.split(".")[0] for k in self.missing_keys + self.mismatched_keys})


# ---------------------------------------------------------------------------------------- config


def config_from_hf(hf: dict[str, Any], complete: bool = True, **overrides: Any) -> BertConfig | None:
    """An HF `config.json` mapping -> BertConfig, refusing variants this BERT does not implement and left-out sizes."""
    if not isinstance(hf, dict):
        raise ValueError(f"it holds a JSON {type(hf).__name__}, not an object of settings; not a model config")
    if hf.get("model_type", "bert") != "bert":
        raise ValueError(f"model_type is {hf.get('model_type')!r}; only 'bert' checkpoints can be loaded")
    act = hf.get("hidden_act", "gelu")
    if act != "gelu":
        raise ValueError(f"hidden_act {act!r} is not supported (BERT uses exact 'gelu')")
    pos = hf.get("position_embedding_type", "absolute")
    if pos != "absolute":
        raise ValueError(f"position_embedding_type {pos!r} is not supported (only 'absolute')")
    for flag in ("is_decoder", "add_cross_attention"):  # a decoder's causal or cross attention: not run here
        if hf.get(flag):
            raise ValueError(f"{flag} is true: a BERT decoder; only encoder checkpoints can be loaded")
    names = ("vocab_size", "hidden_size", "num_hidden_layers", "num_attention_heads", "intermediate_size",
             "max_position_embeddings", "type_vocab_size", "hidden_dropout_prob",
             "attention_probs_dropout_prob", "classifier_dropout", "layer_norm_eps", "initializer_range", "pad_token_id")
    fields = {n: hf[n] for n in names if hf.get(n) is not None}
    for name, value in fields.items():
        integer = name.endswith(("_size", "_layers", "_heads", "_embeddings", "_id"))
        kinds = (int,) if integer else (int, float)
        if isinstance(value, bool) or not isinstance(value, kinds):
            raise ValueError(f"{name} is {value!r}; it must be {'an integer' if integer else 'a number'}")
    fields.update(overrides)
    sizes = [n for n in ("hidden_size", "num_hidden_layers", "num_attention_heads", "intermediate_size") if n not in fields]
    if sizes and complete:  # BERT-Base's value would fill it unseen, and the weights' shapes were blamed
        raise ValueError(f"it has no {sizes[0]}; add it (the checkpoint's own value)")
    return None if sizes else BertConfig(**fields)  # complete=False: variants only, no check on BERT-Base's sizes


def _head_labels(hf: dict[str, Any]) -> list[str] | None:
    """The label names a classifier head was trained for (`id2label`, by output index); None when the
    config names none or only transformers' placeholders (LABEL_0, ...)."""
    try:
        id2label = hf["id2label"]
        names = [str(id2label[k]) for k in sorted(id2label, key=int)]
    except (KeyError, ValueError, AttributeError, TypeError):
        return None
    return None if all(re.fullmatch(r"LABEL_\d+", n) for n in names) else names


def config_to_hf(config: BertConfig, architecture: str, extra: dict[str, Any] | None = None) -> dict[str, Any]:
    out = {
        "architectures": [architecture],
        "model_type": "bert",
        "hidden_act": "gelu",
        "position_embedding_type": "absolute",
        "tie_word_embeddings": True,
        "vocab_size": config.vocab_size,
        "hidden_size": config.hidden_size,
        "num_hidden_layers": config.num_hidden_layers,
        "num_attention_heads": config.num_attention_heads,
        "intermediate_size": config.intermediate_size,
        "max_position_embeddings": config.max_position_embeddings,
        "type_vocab_size": config.type_vocab_size,
        "hidden_dropout_prob": config.hidden_dropout_prob,
        "attention_probs_dropout_prob": config.attention_probs_dropout_prob,
        "classifier_dropout": config.classifier_dropout,
        "layer_norm_eps": config.layer_norm_eps,
        "initializer_range": config.initializer_range,
        "pad_token_id": config.pad_token_id,
    }
    out.update(extra or {})
    return out


# ---------------------------------------------------------------------------------- state dicts


def hf_to_ours(hf_state: dict[str, torch.Tensor], config: BertConfig) -> tuple[dict[str, torch.Tensor], list[str]]:
    """HF tensors -> (our tensors with encoder keys under `bert.` and head keys at top level, ignored keys).

    The word embeddings and MLM bias are trimmed to `config.vocab_size` here; padding to the
    model's `padded_vocab_size` happens when the tensors are copied in.
    """
    ours: dict[str, torch.Tensor] = {}
    ignored: list[str] = []
    qkv: dict[tuple[int, str], dict[str, torch.Tensor]] = {}
    decoder_bias = decoder_weight = None
    for name, tensor in hf_state.items():
        key = name[len("bert."):] if name.startswith("bert.") else name
        key = key.replace("LayerNorm.gamma", "LayerNorm.weight").replace("LayerNorm.beta", "LayerNorm.bias")
        if key == "cls.predictions.decoder.bias":
            decoder_bias = tensor  # tied to cls.predictions.bias; some saves keep only this name
        if key == "cls.predictions.decoder.weight":
            decoder_weight = tensor  # a copy of the word embeddings, unless the checkpoint untied them
        if _REDUNDANT.search(key):
            continue
        m = _LAYER_RE.match(key)
        if m:
            layer, middle, kind = int(m.group(1)), m.group(2), m.group(3)
            if middle.startswith("attention.self."):
                qkv.setdefault((layer, kind), {})[middle.rsplit(".", 1)[1]] = tensor
            elif middle in _LAYER_MAP:
                ours[f"bert.encoder.layers.{layer}.{_LAYER_MAP[middle]}.{kind}"] = tensor
            else:
                ignored.append(name)
            continue
        stem, _, kind = key.rpartition(".")
        if stem in _TOP_MAP:
            ours[f"bert.{_TOP_MAP[stem]}.{kind}"] = tensor
        elif stem in _HEAD_MAP:
            ours[f"{_HEAD_MAP[stem]}.{kind}"] = tensor
        elif key == "cls.predictions.bias":
            ours["mlm.bias"] = tensor
        else:
            ignored.append(name)
    if "mlm.bias" not in ours and decoder_bias is not None:
        ours["mlm.bias"] = decoder_bias
    word = ours.get("bert.embeddings.word.weight")
    if decoder_weight is not None and word is not None:
        n = min(len(word), len(decoder_weight))
        if decoder_weight.shape[1:] != word.shape[1:] or not torch.equal(decoder_weight[:n], word[:n]):
            ignored.append(UNTIED_DECODER)  # our MLM head is tied: `load_pretrained` refuses it there
    for (layer, kind), parts in sorted(qkv.items()):
        if set(parts) != {"query", "key", "value"}:
            raise ValueError(f"layer {layer} attention {kind} is incomplete in the checkpoint: has {sorted(parts)}")
        ours[f"bert.encoder.layers.{layer}.attention.qkv.{kind}"] = torch.cat(
            [parts["query"], parts["key"], parts["value"]], dim=0
        )
    return ours, ignored


def ours_to_hf(state: dict[str, torch.Tensor], config: BertConfig, prefix: str = "bert.") -> dict[str, torch.Tensor]:
    """Our state dict (of any of our model classes) -> HF names, vocab trimmed, QKV split."""
    top = {v: k for k, v in _TOP_MAP.items()}
    layer_map = {v: k for k, v in _LAYER_MAP.items()}
    heads = {v: k for k, v in _HEAD_MAP.items()}
    out: dict[str, torch.Tensor] = {}
    v = config.vocab_size
    for name, tensor in state.items():
        key = name[len("bert."):] if name.startswith("bert.") else name
        stem, _, kind = key.rpartition(".")
        m = re.match(r"^encoder\.layers\.(\d+)\.(.+)$", stem)
        if m:
            layer, middle = m.group(1), m.group(2)
            if middle == "attention.qkv":
                for part, chunk in zip(("query", "key", "value"), tensor.chunk(3, dim=0)):
                    out[f"{prefix}encoder.layer.{layer}.attention.self.{part}.{kind}"] = chunk
            else:
                out[f"{prefix}encoder.layer.{layer}.{layer_map[middle]}.{kind}"] = tensor
        elif stem in top:
            out[f"{prefix}{top[stem]}.{kind}"] = tensor[:v] if stem == "embeddings.word" else tensor
        elif key == "mlm.bias":
            out["cls.predictions.bias"] = tensor[:v]
        elif stem in heads:
            out[f"{heads[stem]}.{kind}"] = tensor
        else:
            raise KeyError(f"no Hugging Face name for parameter {name!r}")
    return {k: t.detach().contiguous() for k, t in out.items()}


# ---------------------------------------------------------------------------------------- files


def _readable(f: Path) -> Path:  # refused in one line: safetensors said a file it may not open does not exist
    if not os.access(f, os.R_OK):
        raise ValueError(f"cannot read {f}: Permission denied; make it readable")
    return f


def read_hf_state(path: Path) -> tuple[dict[str, torch.Tensor], str]:
    """The tensors of an HF directory: safetensors (single or sharded) first, else pytorch_model.bin
    (a pickle: read through `load_torch_file`, so a file that would run code is refused)."""
    from safetensors import SafetensorError
    from safetensors.torch import load_file

    single = path / "model.safetensors"
    index = path / "model.safetensors.index.json"
    binary = path / "pytorch_model.bin"
    if single.is_file():
        files = [single]
    elif index.is_file():
        try:
            weight_map = json.loads(_readable(index).read_text(encoding="utf-8"))["weight_map"]
        except (json.JSONDecodeError, UnicodeDecodeError, KeyError, TypeError) as err:
            raise ValueError(f"{index} is not a safetensors index (no valid weight_map: {err})") from None
        if not isinstance(weight_map, dict) or not all(isinstance(f, str) for f in weight_map.values()):
            raise ValueError(f"{index} is not a safetensors index (weight_map must map tensor names to file names)")
        files = [path / f for f in sorted(set(weight_map.values()))]
        missing = [f.name for f in files if not f.is_file()]
        if missing:
            raise ValueError(f"{index} names shards that are missing: {', '.join(missing[:5])}")
    elif binary.is_file():
        state = load_torch_file(_readable(binary))
        if not isinstance(state, dict) or not all(isinstance(t, torch.Tensor) for t in state.values()):
            raise ValueError(f"{binary} does not hold a state dict of tensors")
        return state, binary.name
    else:
        raise ValueError(f"{path} has no model.safetensors, model.safetensors.index.json or pytorch_model.bin")
    state: dict[str, torch.Tensor] = {}
    for f in files:
        try:
            state.update(load_file(str(_readable(f))))
        except SafetensorError as err:
            raise ValueError(f"{f} is truncated or not a safetensors file ({err})") from None
    return state, (single if single.is_file() else index).name


def count_vocab(vocab_file: Path) -> int:
    """Tokens in a vocab.txt by `pipeline.vocab.read_vocab_tokens`' rule (line i is id i; a BOM, CRLF and trailing empty
    lines tolerated), restated as model/ imports nothing of ours; tests/model/test_hf_refusals.py holds them equal."""
    try:
        lines = _readable(vocab_file).read_text(encoding="utf-8-sig").split("\n")
    except UnicodeDecodeError as err:
        raise ValueError(f"{vocab_file} is not UTF-8 text ({err.reason} at byte {err.start}); "
                         "a vocab.txt holds one token per line in UTF-8") from None
    while lines and lines[-1].rstrip("\r") == "":
        lines.pop()
    return len(lines)


def load_pretrained(model_cls: type[M], path: str | Path, config_overrides: dict[str, Any] | None = None,
                    **head_kwargs: Any) -> tuple[M, LoadReport]:
    """Build `model_cls(config, **head_kwargs)` from an HF-format directory.

    `config_overrides` changes fields that do not alter the weights' shapes (fast-path switches,
    dropout), e.g. `{"unpad": True, "pad_vocab_multiple": 64}`.
    """
    path = Path(path)
    config_file = path / "config.json"
    if not config_file.is_file():
        raise ValueError(f"{path} is not a Hugging Face model directory (no config.json)")
    try:
        hf_config = json.loads(_readable(config_file).read_text(encoding="utf-8"))
    except json.JSONDecodeError as err:
        raise ValueError(f"{config_file} is not valid JSON ({err.msg})") from None
    except UnicodeDecodeError as err:
        raise ValueError(f"{config_file} is not UTF-8 text ({err.reason} at byte {err.start})") from None
    try:
        config_from_hf(hf_config, complete=False)  # refuse unsupported variants before reading any weights
    except ValueError as err:
        raise ValueError(f"{config_file}: {err}") from None
    state, source = read_hf_state(path)
    try:  # a size left out is refused once the weights exist ("no weights" is the first thing to say)
        base = config_from_hf(hf_config)
    except ValueError as err:
        raise ValueError(f"{config_file}: {err}") from None
    if bad := next((k for k, t in state.items() if t.is_floating_point() and not torch.isfinite(t).all()), None):
        raise ValueError(f"{path / source} holds NaN/inf in {bad}; the checkpoint is damaged")  # not the lr's fault
    ours, ignored = hf_to_ours(state, base)
    report = LoadReport(source=str(path / source), unexpected_keys=ignored, head_labels=_head_labels(hf_config))

    rows = ours["bert.embeddings.word.weight"].shape[0] if "bert.embeddings.word.weight" in ours else None
    if rows is None:
        raise ValueError(f"{report.source} has no word embeddings (embeddings.word_embeddings.weight); not a BERT checkpoint")
    vocab_size = hf_config.get("vocab_size", rows)
    vocab_file = path / "vocab.txt"
    if vocab_file.is_file():
        # The file's vocabulary is the truth: configs of padded checkpoints say 30528 for 30522 tokens.
        vocab_size = count_vocab(vocab_file)
        if vocab_size == 0:  # a write cut short (a full disk) leaves it so: no vocabulary, not someone else's
            raise ValueError(f"{vocab_file} is empty; copy the model's vocab.txt there again, or write the model again")
        # Rows beyond the vocabulary are alignment padding (30528 = 30522 rounded up to 64) only
        # when there are fewer than 128 of them; anything else is someone else's vocabulary.
        if not 0 <= rows - vocab_size < 128:
            raise ValueError(f"{vocab_file} has {vocab_size} tokens but the checkpoint has {rows} embedding rows; "
                             "the vocabulary does not belong to this checkpoint")
    if rows < vocab_size:
        raise ValueError(f"{report.source} has {rows} embedding rows but config.json says vocab_size={vocab_size}")
    if rows > vocab_size:
        report.vocab_trimmed_from = rows
        ours["bert.embeddings.word.weight"] = ours["bert.embeddings.word.weight"][:vocab_size]
        if "mlm.bias" in ours:
            ours["mlm.bias"] = ours["mlm.bias"][:vocab_size]

    config = config_from_hf(hf_config, **{"vocab_size": vocab_size, **(config_overrides or {})})
    model = model_cls(config, **head_kwargs)
    target = model.state_dict()
    if model_cls is BertModel:  # BertModel's own keys have no `bert.` prefix
        ours = {k[len("bert."):]: t for k, t in ours.items() if k.startswith("bert.")} | {
            k: t for k, t in ours.items() if not k.startswith("bert.")
        }
    with torch.no_grad():
        for key, dest in target.items():
            if key not in ours:
                report.missing_keys.append(key)
                continue
            src = ours.pop(key)
            if src.shape != dest.shape and src.shape[1:] == dest.shape[1:] and key.endswith(("embeddings.word.weight", "mlm.bias")):
                dest.zero_()
                dest[: src.shape[0]].copy_(src)  # vocab padded to pad_vocab_multiple: extra rows zero
            elif src.shape != dest.shape:
                head = not key.startswith(("bert.", "embeddings.", "encoder.", "pooler."))
                if not head:
                    raise ValueError(f"{report.source}: {key} has shape {tuple(src.shape)}, the config expects {tuple(dest.shape)}")
                report.mismatched_keys.append(key)
            else:
                dest.copy_(src)
    report.unexpected_keys += list(ours)  # state_dict() tensors share storage: the copies above are in place
    _refuse_lost_weights(report, model_has_mlm="mlm.bias" in target)
    if report.missing_keys or report.mismatched_keys:
        logger.info("%s: initialised %s (not in the checkpoint or shape differs)", path, ", ".join(report.initialized_heads))
    if report.unexpected_keys:
        logger.info("%s: ignored %d checkpoint tensors: %s", path, len(report.unexpected_keys), ", ".join(report.unexpected_keys[:8]))
    if report.vocab_trimmed_from:
        logger.info("%s: trimmed embeddings from %d rows to the %d-token vocabulary", path, report.vocab_trimmed_from, vocab_size)
    return model, report


def _refuse_lost_weights(report: LoadReport, *, model_has_mlm: bool) -> None:
    """Only task heads (and the pooler, which some checkpoints drop) may start from a fresh draw: an
    encoder tensor missing from the file, or an MLM decoder we cannot tie, would train a different model."""
    encoder = [k for k in report.missing_keys
               if k.startswith(("bert.", "embeddings.", "encoder.")) and ".pooler." not in f".{k}"]
    beyond = sorted({int(m.group(1)) for k in report.unexpected_keys if (m := _OUR_LAYER_RE.match(k))})
    if beyond:  # config.json describes fewer layers than the file holds: the model would be cut short
        raise ValueError(f"{report.source} holds encoder layer(s) {', '.join(map(str, beyond))} beyond what config.json's "
                         "num_hidden_layers describes; the config does not belong to these weights")
    if encoder:
        raise ValueError(f"{report.source} lacks encoder weights ({', '.join(encoder[:3])}"
                         f"{', ...' if len(encoder) > 3 else ''}): they would start random; use a complete BERT checkpoint")
    if model_has_mlm and UNTIED_DECODER in report.unexpected_keys:
        raise ValueError(f"{report.source}: {UNTIED_DECODER} differs from the word embeddings; bertpipe's MLM head is "
                         "tied to them, as BERT's, so this checkpoint's MLM head cannot be loaded (fine-tuning it works)")
    pooler = [k for k in report.missing_keys if ".pooler." in f".{k}"]
    if pooler:
        logger.warning("%s has no pooler weights: the pooler starts from a fresh draw", report.source)


def save_pretrained(model: nn.Module, path: str | Path, vocab_file: str | Path | None = None,
                    extra_config: dict[str, Any] | None = None) -> Path:
    """Write `config.json` + `model.safetensors` (+ `vocab.txt`) in Hugging Face's format.

    `extra_config` adds keys to config.json (e.g. `id2label` for a classifier).
    """
    from safetensors.torch import save_file

    arch = _ARCHITECTURES.get(type(model))
    if arch is None:
        raise ValueError(f"cannot export a {type(model).__name__}; supported: {', '.join(c.__name__ for c in _ARCHITECTURES)}")
    config: BertConfig = model.config
    if vocab_file is not None and (n := count_vocab(Path(vocab_file))) != config.vocab_size:  # before any file is written
        raise ValueError(f"{vocab_file} has {n} tokens but the model's vocab_size is {config.vocab_size}; pass the vocabulary the model was trained with")
    path = Path(path)
    path.mkdir(parents=True, exist_ok=True)
    extra = dict(extra_config or {})
    if hasattr(model, "num_labels") and "num_labels" not in extra and "id2label" not in extra:
        extra["id2label"] = {str(i): f"LABEL_{i}" for i in range(model.num_labels)}
    state = {k: t.float() if t.dtype in (torch.float16, torch.bfloat16) else t for k, t in model.state_dict().items()}
    if type(model) is BertModel:
        state = {f"bert.{k}": t for k, t in state.items()}
    tensors = ours_to_hf(state, config, prefix="" if type(model) is BertModel else "bert.")
    save_file({k: t.cpu() for k, t in tensors.items()}, str(path / "model.safetensors"), metadata={"format": "pt"})
    (path / "config.json").write_text(json.dumps(config_to_hf(config, arch, extra), indent=2, sort_keys=True) + "\n")
    if vocab_file is not None and Path(vocab_file).resolve() != (path / "vocab.txt").resolve():
        shutil.copyfile(vocab_file, path / "vocab.txt")
    return path
