"""The typed config tree: layering, strictness, and the saved resolved config."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal, Optional

import pytest
import yaml

from launch.config import from_dict, load_config, parse_overrides, save_config, to_dict


@dataclass
class Optim:
    name: Literal["adamw", "lamb"] = "adamw"
    lr: float = 1e-4
    betas: list[float] = field(default_factory=lambda: [0.9, 0.999])


@dataclass
class Run:
    seed: int = 0
    bf16: bool = False
    note: Optional[str] = None
    optim: Optim = field(default_factory=Optim)


def test_layers_defaults_file_and_overrides(tmp_path):
    path = tmp_path / "run.yaml"
    path.write_text("seed: 7\noptim:\n  name: lamb\n  lr: 0.001\n")
    cfg = load_config(Run, path, ["optim.lr=2e-3", "bf16=true", "note=phase 1"])
    assert cfg == Run(seed=7, bf16=True, note="phase 1", optim=Optim(name="lamb", lr=2e-3))


def test_unknown_key_names_the_dotted_path():
    with pytest.raises(ValueError, match=r"unknown config key\(s\) optim\.lrr; valid keys here: optim\.name"):
        from_dict(Run, {"optim": {"lrr": 1.0}})


@pytest.mark.parametrize(
    "override, message",
    [
        ("seed=abc", "seed: expected an integer"),
        ("bf16=2", "bf16: expected true or false"),
        ("optim.name=sgd", "optim.name: 'sgd' is not one of 'adamw', 'lamb'"),
        ("optim.betas=0.9", "optim.betas: expected a list"),
    ],
)
def test_wrong_types_are_refused(override, message):
    with pytest.raises(ValueError, match=message.replace(".", r"\.").replace("(", r"\(")):
        load_config(Run, None, [override])


def test_an_integral_float_is_an_integer_a_fraction_is_not():
    # A YAML `epochs: 3.0` or a JSON number from another tool is the integer 3, kept as an int; 2.5 is refused.
    cfg = from_dict(Run, {"seed": 3.0})
    assert cfg.seed == 3 and type(cfg.seed) is int
    with pytest.raises(ValueError, match="seed: expected an integer, got 2.5"):
        from_dict(Run, {"seed": 2.5})
    from launch.finetune.finetune_config import FinetuneConfig

    assert from_dict(FinetuneConfig, {"task": "sst2", "epochs": 3.0}).epochs == 3


def test_malformed_override():
    with pytest.raises(ValueError, match="not of the form key.sub=value"):
        parse_overrides(["optim.lr"])


def test_missing_file_and_unknown_preset():
    with pytest.raises(ValueError, match="does not exist"):
        load_config(Run, "nope.yaml")
    with pytest.raises(ValueError, match="no config file or preset named 'nope'"):
        load_config(Run, "nope")


@pytest.mark.parametrize("text, message", [
    # PyYAML keeps the second `optim:`: lr 0.05 was lost without a word
    ("optim:\n  lr: 0.05\noptim:\n  name: lamb\n", r"key 'optim' appears twice \(lines 1 and 3\); the second would replace"),
    ("optim:\n  lr: 0.05\n  lr: 0.01\n", r"key 'lr' appears twice \(lines 2 and 3\)"),
    ("1: 2\n", r"run.yaml: key 1 is not a name"),  # a TypeError traceback
    ("optim:\n  null: 2\n", r"run.yaml: key None under optim is not a name"),
    # dropped without a word: a BERT-base model trained where tiny was meant
    ("defaults: tiny\nseed: 3\n", r"`defaults:` is not supported; pass the preset as --config PRESET"),
])
def test_a_config_file_that_would_lose_or_misread_settings_is_refused(tmp_path, text, message):
    path = tmp_path / "run.yaml"
    path.write_text(text)
    with pytest.raises(ValueError, match=message) as err:
        load_config(Run, path)
    assert str(path) in str(err.value)  # every refusal names the file


def test_saved_config_round_trips(tmp_path):
    cfg = load_config(Run, None, ["optim.betas=[0.8, 0.9]", "seed=3"])
    save_config(cfg, tmp_path / "config.yaml")
    saved = yaml.safe_load((tmp_path / "config.yaml").read_text())
    assert saved == to_dict(cfg)
    assert from_dict(Run, saved) == cfg
