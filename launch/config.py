"""One typed config tree: dataclasses <- YAML presets <- dotted CLI overrides, saved resolved.

Every stage's config is a (nested) dataclass with documented fields. `load_config` layers, in order,
the dataclass defaults, a YAML file (or a named preset from `configs/`), and `key.sub=value`
overrides from the command line; unknown keys and wrong types are refused with a message naming the
dotted key, so a typo never silently falls back to a default. `save_config` writes the resolved tree
next to a run's output. The DeepSpeed JSON is *generated* from this tree, never read back into it.
"""

from __future__ import annotations

import collections.abc
import dataclasses
import errno
import os
import stat
import types
import typing
from pathlib import Path
from typing import Any, Sequence, TypeVar

import yaml

T = TypeVar("T")

PRESET_DIR = Path(__file__).resolve().parent / "configs"


def to_dict(obj: Any) -> Any:
    """A dataclass tree as plain dicts/lists/scalars (YAML- and JSON-serialisable)."""
    if dataclasses.is_dataclass(obj) and not isinstance(obj, type):
        return {f.name: to_dict(getattr(obj, f.name)) for f in dataclasses.fields(obj)}
    if isinstance(obj, (list, tuple)):
        return [to_dict(v) for v in obj]
    if isinstance(obj, dict):
        return {k: to_dict(v) for k, v in obj.items()}
    if isinstance(obj, Path):
        return str(obj)
    return obj


def _coerce(value: Any, annotation: Any, key: str) -> Any:
    origin = typing.get_origin(annotation)
    args = typing.get_args(annotation)
    if annotation is Any:
        return value
    if origin in (typing.Union, types.UnionType):
        if value is None and type(None) in args:
            return None
        errors = []
        for arg in args:
            if arg is type(None):
                continue
            try:
                return _coerce(value, arg, key)
            except ValueError as err:
                errors.append(str(err))
        raise ValueError(errors[0] if errors else f"{key}: cannot be {value!r}")
    if origin is typing.Literal:
        if value not in args:
            raise ValueError(f"{key}: {value!r} is not one of {', '.join(map(repr, args))}")
        return value
    if origin in (list, tuple, Sequence) or annotation in (list, tuple):
        if not isinstance(value, (list, tuple)):
            raise ValueError(f"{key}: expected a list, got {value!r}")
        inner = args[0] if args else Any
        items = [_coerce(v, inner, f"{key}[{i}]") for i, v in enumerate(value)]
        return tuple(items) if origin is tuple or annotation is tuple else items
    if origin is dict or annotation is dict:
        if not isinstance(value, dict):
            raise ValueError(f"{key}: expected a mapping, got {value!r}")
        return dict(value)
    if dataclasses.is_dataclass(annotation):
        if isinstance(value, annotation):
            return value
        if not isinstance(value, dict):
            raise ValueError(f"{key}: expected a mapping of {annotation.__name__} fields, got {value!r}")
        return from_dict(annotation, value, prefix=f"{key}.")
    if annotation is bool:
        if isinstance(value, bool):
            return value
        raise ValueError(f"{key}: expected true or false, got {value!r}")
    if annotation is int:
        if isinstance(value, int) and not isinstance(value, bool):
            return value
        if isinstance(value, float) and value.is_integer():
            return int(value)
        raise ValueError(f"{key}: expected an integer, got {value!r}")
    if annotation is float:
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            return float(value)
        if isinstance(value, str):
            # YAML 1.1 (PyYAML) reads `1e-4` (no dot) as a string; accept what float() accepts.
            try:
                return float(value)
            except ValueError:
                pass
        raise ValueError(f"{key}: expected a number, got {value!r}")
    if annotation is str:
        if isinstance(value, (str, int, float)) and not isinstance(value, bool):
            return str(value)
        raise ValueError(f"{key}: expected a string, got {value!r}")
    if annotation is Path:
        return Path(value)
    return value


def coerce_field(cls: type, name: str, value: Any, key: str | None = None) -> Any:
    """`value` as field `name` of dataclass `cls` takes it (YAML reads `5e-5` as a string), or a
    ValueError naming `key`."""
    return _coerce(value, typing.get_type_hints(cls)[name], key or name)


def from_dict(cls: type[T], data: dict[str, Any], prefix: str = "") -> T:
    """Build dataclass `cls` from a mapping, strictly: unknown keys and wrong types are errors."""
    hints = typing.get_type_hints(cls)
    fields = {f.name: f for f in dataclasses.fields(cls)}
    odd = [k for k in data if not isinstance(k, str)]
    if odd:  # `1: 2` or `null: 2` in a YAML file (a TypeError traceback)
        raise ValueError(f"config key {odd[0]!r}{' under ' + prefix.rstrip('.') if prefix else ''} is not a name; "
                         f"valid keys here: {', '.join(prefix + k for k in fields)}")
    unknown = sorted(set(data) - set(fields))
    if unknown:
        raise ValueError(
            f"unknown config key(s) {', '.join(prefix + k for k in unknown)}; "
            f"valid keys here: {', '.join(prefix + k for k in fields)}"
        )
    kwargs = {name: _coerce(value, hints[name], prefix + name) for name, value in data.items()}
    return cls(**kwargs)


def merge(base: dict[str, Any], update: dict[str, Any]) -> dict[str, Any]:
    """Deep-merge `update` into a copy of `base` (mappings merge, everything else replaces)."""
    out = dict(base)
    for key, value in update.items():
        if isinstance(value, dict) and isinstance(out.get(key), dict):
            out[key] = merge(out[key], value)
        else:
            out[key] = value
    return out


def differences(old: dict[str, Any], new: dict[str, Any], prefix: str = "") -> dict[str, tuple[Any, Any]]:
    """`{dotted.key: (old value, new value)}` for every leaf where two config trees (`to_dict`) differ."""
    out: dict[str, tuple[Any, Any]] = {}
    for key in [*new, *(k for k in old if k not in new)]:  # in the new tree's order (a saved one may be sorted)
        a, b = old.get(key), new.get(key)
        if isinstance(a, dict) and isinstance(b, dict) and key != "fields":  # model.fields: a value of its own
            out.update(differences(a, b, f"{prefix}{key}."))
        elif a != b:
            out[f"{prefix}{key}"] = (a, b)
    return out


def missing_keys(tree: dict[str, Any], full: dict[str, Any], prefix: str = "") -> list[str]:
    """The dotted keys of `full` (a whole `to_dict` tree) that `tree` lacks; mapping fields are one value."""
    out: list[str] = []
    for key, value in full.items():
        if key not in tree:
            out.append(f"{prefix}{key}")
        elif isinstance(value, dict) and isinstance(tree[key], dict) and key != "fields":
            out += missing_keys(tree[key], value, f"{prefix}{key}.")
    return out


def parse_overrides(overrides: Sequence[str]) -> dict[str, Any]:
    """`["optim.lr=1e-4", "zero.stage=2"]` -> nested dict; values parsed as YAML scalars/lists."""
    tree: dict[str, Any] = {}
    for item in overrides:
        if "=" not in item:
            raise ValueError(f"override {item!r} is not of the form key.sub=value")
        key, raw = item.split("=", 1)
        parts = key.strip().split(".")
        if not all(parts):
            raise ValueError(f"override {item!r} has an empty key part")
        node = tree
        for part in parts[:-1]:
            node = node.setdefault(part, {})
            if not isinstance(node, dict):
                raise ValueError(f"override {item!r} conflicts with another override of {part!r}")
        try:
            node[parts[-1]] = yaml.safe_load(raw) if raw.strip() else ""
        except yaml.YAMLError as err:
            raise ValueError(f"override {item!r}: {raw!r} is not a YAML value: {yaml_problem(err, where=False)}; "
                             f"fix it, or quote it if it is text") from None
    return tree


def yaml_problem(err: yaml.YAMLError, *, where: bool = True) -> str:
    """One line from a PyYAML error (its str() is a multi-line excerpt): what is wrong and, when
    `where`, at which line and column of the file."""
    problem = getattr(err, "problem", None)
    if not problem:
        return " ".join(str(err).split())
    text = problem
    if err.context:
        started = f" started at line {err.context_mark.line + 1}" if where and err.context_mark else ""
        text += f" ({err.context}{started})"
    if where and err.problem_mark:
        text = f"line {err.problem_mark.line + 1}, column {err.problem_mark.column + 1}: {text}"
    return text


def resolve_preset(name_or_path: str | Path, *, named: str | None = None, hint: str | None = None) -> Path:
    """A YAML path as given, or a preset name (`tiny`, `bert-large-phase1`) from launch/configs/.

    `named`: how a refusal names it (`--config x.yaml`; default "config file x.yaml"), `hint`: what to pass instead."""
    path = Path(name_or_path)
    if path.suffix in (".yaml", ".yml"):
        if (problem := config_file_problem(path)) is not None:
            raise ValueError(_refusal(named or f"config file {path}", problem, hint))
        return path
    preset = PRESET_DIR / f"{name_or_path}.yaml"
    if preset.is_file():
        return preset
    presets = ", ".join(preset_names()) or "none"
    if named is None:
        raise ValueError(f"no config file or preset named {name_or_path!r}; presets: {presets}")
    problem = config_file_problem(path)
    hint = hint or f"pass a YAML file or a preset name ({presets})"
    if problem == "does not exist":
        raise ValueError(f"{named} is neither a preset nor a file; {hint}")
    if problem is None:  # a file, but a name without .yaml is read as a preset's
        raise ValueError(f"{named} is not a preset, and a config file's name ends in .yaml or .yml: rename it; {hint}")
    raise ValueError(f"{named} is not a preset, and it {problem}; {hint}")


def preset_names() -> list[str]:
    """The presets in launch/configs/, smallest first (as `--help` lists them)."""
    order = ("tiny", "demo", "demo-seq64", "bert-base", "bert-large-phase1", "bert-large-phase2")
    return sorted((p.stem for p in PRESET_DIR.glob("*.yaml")), key=lambda n: (order.index(n) if n in order else len(order), n))


class StrictYamlLoader(yaml.SafeLoader):
    """PyYAML's safe loader, except that a key given twice in one mapping is an error: PyYAML keeps the
    last, so a second `optim:` section silently replaced the first."""


def _mapping_without_repeats(loader: StrictYamlLoader, node: yaml.MappingNode, deep: bool = False) -> dict:
    seen: dict[Any, int] = {}
    for key_node, _ in node.value:
        key = loader.construct_object(key_node, deep=True)
        if isinstance(key, collections.abc.Hashable):
            if key in seen:
                raise yaml.constructor.ConstructorError(
                    None, None, f"key {key!r} appears twice (lines {seen[key] + 1} and {key_node.start_mark.line + 1}); "
                    "the second would replace the first", key_node.start_mark)
            seen[key] = key_node.start_mark.line
    return loader.construct_mapping(node, deep)


StrictYamlLoader.add_constructor(yaml.resolver.BaseResolver.DEFAULT_MAPPING_TAG, _mapping_without_repeats)


def _key_not_a_name(data: dict[Any, Any], prefix: str = "") -> tuple[str, Any] | None:
    """(where, key) of the first key that is not a string (`1:` or `null:`), at any depth."""
    for key, value in data.items():
        if not isinstance(key, str):
            return prefix.rstrip("."), key
        if isinstance(value, dict) and (odd := _key_not_a_name(value, f"{prefix}{key}.")) is not None:
            return odd
    return None


# A config is a few KB: a bigger --config is the wrong file (a corpus, a checkpoint), and was read whole.
MAX_CONFIG_BYTES = 1 << 20


def _refusal(named: str, problem: str, hint: str | None) -> str:
    return f"{named} {problem}" + (f"; {hint}" if hint else "")


def _kind_problem(st: os.stat_result) -> str | None:
    """Why a file of this stat cannot be a config file (a directory, a socket, a device, too big), or None.
    A pipe is read (`--config <(...)`, `--config /dev/stdin`), without waiting for a writer: see `_read_config_text`."""
    if stat.S_ISDIR(st.st_mode):
        return "is a directory, not a file"
    if not (stat.S_ISREG(st.st_mode) or stat.S_ISFIFO(st.st_mode)):  # /dev/zero never ends; a terminal waits
        return f"is {'a socket' if stat.S_ISSOCK(st.st_mode) else 'a device'}, not a file"
    if st.st_size > MAX_CONFIG_BYTES:
        return f"is {st.st_size:,} bytes; a config file is a few KB (at most {MAX_CONFIG_BYTES:,} bytes)"
    return None


def config_file_problem(path: str | Path) -> str | None:
    """Why `path` cannot be read as a config file ("does not exist", "is a directory, not a file", ...), or None."""
    try:
        return _kind_problem(os.stat(path))
    except OSError as err:
        missing = err.errno in (errno.ENOENT, errno.ENOTDIR)
        return "does not exist" if missing else f"cannot be read: {err.strerror or err}"


def _read_config_text(path: str | Path, named: str, hint: str | None) -> str:
    """The text of a config file: a socket or device is refused before it is opened; a pipe is opened without
    waiting for a writer (a named pipe nobody writes to waited forever), then read to its end; at most
    MAX_CONFIG_BYTES + 1 bytes are read."""
    if (problem := config_file_problem(path)) is not None:
        raise ValueError(_refusal(named, problem, hint))
    try:
        fd = os.open(path, os.O_RDONLY | getattr(os, "O_NONBLOCK", 0))
    except OSError as err:
        raise ValueError(_refusal(named, f"cannot be read: {err.strerror or err}", hint)) from None
    with os.fdopen(fd, "rb") as f:
        st = os.fstat(fd)
        if (problem := _kind_problem(st)) is not None:
            raise ValueError(_refusal(named, problem, hint))
        os.set_blocking(fd, True)  # opened: now a pipe's writer may take its time
        data = f.read(MAX_CONFIG_BYTES + 1)
    if stat.S_ISFIFO(st.st_mode) and not data:
        raise ValueError(_refusal(named, "is a pipe that nobody wrote to", hint))
    if len(data) > MAX_CONFIG_BYTES:  # one whose size stat does not tell (/proc), or that grew
        raise ValueError(_refusal(named, f"is over {MAX_CONFIG_BYTES:,} bytes; a config file is a few KB", hint))
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError:
        raise ValueError(f"config file {path} is not UTF-8 text; save it as UTF-8") from None


def load_yaml(path: str | Path, *, named: str | None = None, hint: str | None = None) -> dict[str, Any]:
    """The mapping in config file `path`, strictly read. `named`: how a file that cannot be read is named in the
    refusal (`--config x.yaml`; default "config file x.yaml"), `hint`: what to pass instead."""
    text = _read_config_text(path, named or f"config file {path}", hint)
    try:
        data = yaml.load(text, Loader=StrictYamlLoader) or {}
    except yaml.YAMLError as err:
        raise ValueError(f"config file {path} is not valid YAML: {yaml_problem(err)}; fix the YAML there") from None
    if not isinstance(data, dict):
        # Not `{path}: ...`: a relative path like `c.yaml` would read as a config key.
        raise ValueError(f"config file {path}: expected a mapping of config keys at the top level")
    if (odd := _key_not_a_name(data)) is not None:
        raise ValueError(f"config file {path}: key {odd[1]!r}{' under ' + odd[0] if odd[0] else ''} is not a name; "
                         "config keys are words (`optim:`, `lr:`)")
    if "defaults" in data:  # it was dropped without a word, and a BERT-base model trained where tiny was meant
        raise ValueError(f"config file {path}: `defaults:` is not supported; pass the preset as --config PRESET and "
                         "your changes as flags, or copy the preset's keys into this file")
    return data


def load_config(cls: type[T], config: str | Path | None = None, overrides: Sequence[str] = ()) -> T:
    """Defaults, then the YAML file or preset, then dotted overrides; strict at every layer."""
    data: dict[str, Any] = {}
    if config is not None:
        data = load_yaml(resolve_preset(config))
    data = merge(data, parse_overrides(overrides))
    return from_dict(cls, data)


def save_config(obj: Any, path: str | Path) -> None:
    """Write the resolved config tree as YAML (what a run actually used, defaults included); whole or not
    at all, as `--resume` reads RUN/config.yaml back as the run's settings."""
    from pipeline.atomic_write import write_text_atomic

    Path(path).parent.mkdir(parents=True, exist_ok=True)
    write_text_atomic(path, yaml.safe_dump(to_dict(obj), sort_keys=False))
