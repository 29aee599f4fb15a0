"""One way to configure every command: `--config FILE.yaml` plus `--KEY VALUE` for any config field.

The flags are generated from the command's config dataclass, so a default is stated once (the
dataclass field) and `--help` shows it from there. A nested section's field is `--section.field`
(`--optim.lr 1e-4`, `--zero.stage 2`); underscores are written as dashes (`--seq-len 512`). Values
are read as YAML scalars (`null`, `1e-4`, `true`) and then typed strictly by `launch.config.from_dict`,
so a wrong type names its flag. Booleans take `--x`, `--x true|false` or `--no-x`,
lists take several values (`--input a b`), mappings take `KEY=VALUE` items (`--model.fields
hidden_dropout_prob=0`).

Layering, lowest first: dataclass defaults, `--config` (a YAML file, or a preset for `pretrain`),
the deprecated override forms (`key=value` arguments, `--set key=value`, still accepted with a
warning), then the flags given on the command line.

We wrote this (about 300 lines) instead of adopting tyro, jsonargparse or OmegaConf: those bring their
own help layout and error wording, and none keeps our strict "valid keys here: ..." messages, YAML
presets and deprecated forms without as much glue as this file; see docs/ARCHITECTURE.md.
"""

from __future__ import annotations

import argparse
import ast
import dataclasses
import inspect
import logging
import re
import shlex
import textwrap
import types
import typing
from pathlib import Path
from typing import Any, Iterator, Sequence

import yaml

from launch.config import from_dict, load_yaml, merge, parse_overrides, preset_names, resolve_preset, yaml_problem
from launch.errors import CliError

log = logging.getLogger(__name__)

_PREFIX = "cfg:"  # argparse dest prefix of generated flags: cfg:section.field


def field_docs(cls: type) -> dict[str, str]:
    """Help text of each field of a dataclass: its trailing `# comment`, else its docstring entry.

    Docstring entries are lines `name: text` (also `a / b: text` or `a, b: text` for several fields),
    continued by more-indented lines.
    """
    docs: dict[str, str] = {}
    lines = (inspect.getdoc(cls) or "").splitlines()
    i = 0
    while i < len(lines):
        m = re.match(r"^\s*([a-z_][a-z0-9_]*(?:\s*(?:/|,)\s*[a-z_][a-z0-9_]*)*)\s*:\s+(.*)$", lines[i])
        if m:
            indent = len(lines[i]) - len(lines[i].lstrip())
            text = [m.group(2).strip()]
            while i + 1 < len(lines) and lines[i + 1].strip() and len(lines[i + 1]) - len(lines[i + 1].lstrip()) > indent:
                i += 1
                text.append(lines[i].strip())
            for name in re.split(r"\s*[/,]\s*", m.group(1)):
                docs.setdefault(name, " ".join(text))
        i += 1
    source = textwrap.dedent(inspect.getsource(cls))
    source_lines = source.splitlines()
    for node in ast.parse(source).body[0].body:
        if isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
            comment = source_lines[node.end_lineno - 1].partition("#")[2].strip()
            if comment and "noqa" not in comment:
                docs[node.target.id] = comment
    return docs


def _leaves(cls: type, prefix: tuple[str, ...] = ()) -> Iterator[tuple[tuple[str, ...], dataclasses.Field, Any, str]]:
    """(path, field, annotation, help) for every non-dataclass field of a dataclass tree."""
    hints = typing.get_type_hints(cls)
    docs = field_docs(cls)
    for f in dataclasses.fields(cls):
        annotation = hints[f.name]
        if dataclasses.is_dataclass(annotation):
            yield from _leaves(annotation, prefix + (f.name,))
        else:
            yield prefix + (f.name,), f, annotation, docs.get(f.name, "")


def _default_of(f: dataclasses.Field) -> Any:
    if f.default is not dataclasses.MISSING:
        return f.default
    if f.default_factory is not dataclasses.MISSING:
        return f.default_factory()
    return None


def _yaml_value(text: str) -> Any:
    try:
        return yaml.safe_load(text) if text.strip() else ""
    except yaml.YAMLError as err:  # argparse prints it as `argument --x: ...`
        raise argparse.ArgumentTypeError(f"{text!r} is not a YAML value: {yaml_problem(err, where=False)}; "
                                         f"fix it, or quote it if it is text") from None


def _bool_value(text: str) -> bool:
    value = _yaml_value(text)
    if not isinstance(value, bool):
        raise argparse.ArgumentTypeError(f"expected true or false, got {text!r}")
    return value


def _bool_or_null(text: str) -> bool | None:
    """An optional switch (`--model.compile null`: auto, as its help says) also takes null."""
    return None if _yaml_value(text) is None else _bool_value(text)


def _text_or_null(text: str) -> str | None:
    return None if text in ("null", "None", "~") else text


def out_dir(value: str) -> Path:
    """The argparse type of an `--out` folder (pretrain's, download's, the demo's): `Path("")` is ".", so an empty
    --out (a `--out "$RUN"` with RUN unset) wrote into the working directory without a word."""
    if not value:
        raise argparse.ArgumentTypeError("is empty; name an output directory")
    return Path(value)


def _mapping_item(text: str) -> tuple[str, Any]:
    if "=" not in text:
        raise argparse.ArgumentTypeError(f"{text!r} is not of the form KEY=VALUE")
    key, value = text.split("=", 1)
    return key.strip(), _yaml_value(value)


def _flag_of(path: tuple[str, ...]) -> str:
    return "--" + ".".join(part.replace("_", "-") for part in path)


def flag_of(key: str) -> str:
    """The flag of a dotted config key, as users type it: `log.log_every` -> `--log.log-every`."""
    return _flag_of(tuple(key.split(".")))


def add_config_flags(parser: argparse.ArgumentParser, cls: type, *, flag_names: dict[str, str] | None = None,
                     aliases: dict[str, Sequence[str]] | None = None, skip: Sequence[str] = (),
                     required: Sequence[str] = (), config_help: str | None = None,
                     help_texts: dict[str, str] | None = None) -> None:
    """Add `--config` and one flag per field of dataclass `cls` (see the module docstring).

    flag_names: dotted field -> flag, where a command keeps a name users know (`inputs` -> `--input`).
    aliases: dotted field -> more spellings of its flag (`schedule.total_steps` -> `--max-steps`).
    skip: dotted fields that get no flag (the command sets them itself).
    required: dotted fields the command needs (from a flag or --config): their help says "required", not
      the empty default.
    help_texts: dotted field -> the help a command gives it instead of the field's comment (a sweep's
      `--out` is not one fine-tuning run's).
    """
    flag_names, aliases, help_texts = flag_names or {}, aliases or {}, help_texts or {}
    parser.add_argument("--config", metavar="FILE.yaml", default=None,
                        help=config_help or f"a YAML file of {cls.__name__} fields; flags given here win")
    groups: dict[str, argparse._ArgumentGroup] = {}
    for path, f, annotation, help_text in _leaves(cls):
        dotted = ".".join(path)
        if dotted in skip:
            continue
        target = parser
        if len(path) > 1:
            section = ".".join(path[:-1])
            if section not in groups:
                groups[section] = parser.add_argument_group(f"{section} (--{section}.KEY VALUE)")
            target = groups[section]
        help_text = help_texts.get(dotted, help_text)
        default = _default_of(f)
        shown = "required" if dotted in required else f"default: {'null' if default is None else json_like(default)}"
        kwargs: dict[str, Any] = dict(dest=_PREFIX + dotted, default=argparse.SUPPRESS,
                                      help=f"{help_text} ({shown})".strip().replace("%", "%%"))
        base = _without_none(annotation)
        base_origin = typing.get_origin(base)
        optional = base is not annotation
        if base is bool:
            # `--x`, `--x true|false` and `--no-x` all work: people write both styles.
            kwargs.update(nargs="?", const=True, type=_bool_or_null if optional else _bool_value,
                          metavar="true|false|null" if optional else "true|false")
            names = [flag_names.get(dotted, _flag_of(path)), *aliases.get(dotted, ())]
            negative = "--" + ".".join([*(p.replace("_", "-") for p in path[:-1]), "no-" + path[-1].replace("_", "-")])
            kwargs["help"] = kwargs["help"][:-1] + f"; {negative} = false)"
            target.add_argument(*names, **kwargs)
            target.add_argument(negative, dest=kwargs["dest"], action="store_false", default=argparse.SUPPRESS,
                                help=argparse.SUPPRESS)
            continue
        elif base_origin is typing.Literal:
            kwargs["choices"] = [str(a) for a in typing.get_args(base)]
            kwargs["type"] = str
        elif base_origin in (list, tuple) or base in (list, tuple):
            # A list of text (file names, globs) stays text: as YAML, `*.txt` was an alias, `notes #1.txt`
            # lost its `#1.txt` as a comment and `Ali: Fear.txt` became a mapping.
            # Given twice (`--input a --input b`), the lists add up: the second used to replace the first.
            item = (typing.get_args(base) or (None,))[0]
            kwargs.update(nargs="+", type=str if item is str else _yaml_value, metavar="VALUE", action="extend")
        elif base_origin is dict or base is dict:
            kwargs.update(nargs="+", type=_mapping_item, metavar="KEY=VALUE", action="extend")
        else:
            # Text stays text (`--text-field yes` is "yes", not true); numbers are read as YAML.
            convert = (_text_or_null if optional else str) if base is str else _yaml_value
            kwargs.update(type=convert, metavar={int: "N", float: "X"}.get(base, "VALUE"))
        if dotted in aliases:
            kwargs["action"] = _OneSpelling
        target.add_argument(flag_names.get(dotted, _flag_of(path)), *aliases.get(dotted, ()), **kwargs)


class _OneSpelling(argparse.Action):
    """A field with two spellings (`--max-steps`, `--schedule.total-steps`) given both ways with
    different values is refused: the last would win silently, and one of them is not what was meant."""

    def __call__(self, parser, namespace, values, option_string=None):
        earlier = getattr(namespace, self.dest, None)
        spelled = vars(namespace).setdefault("spellings:", {})
        if self.dest in spelled and spelled[self.dest] != option_string and earlier != values:
            parser.error(f"{spelled[self.dest]} {earlier} and {option_string} {values} set the same field; "
                         "give one of them")
        spelled[self.dest] = option_string
        setattr(namespace, self.dest, values)


def _without_none(annotation: Any) -> Any:
    """`int | None` -> `int` (a flag takes `null` for None); other annotations unchanged."""
    if typing.get_origin(annotation) in (typing.Union, types.UnionType):
        rest = [a for a in typing.get_args(annotation) if a is not type(None)]
        if len(rest) == 1:
            return rest[0]
    return annotation


def json_like(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (list, tuple)):
        return "[" + ", ".join(json_like(v) for v in value) + "]"
    if isinstance(value, dict):
        return "{" + ", ".join(f"{k}: {json_like(v)}" for k, v in value.items()) + "}"
    return str(value) if value != "" else "''"


def given_flags(args: argparse.Namespace) -> dict[str, Any]:
    """The config fields given as flags, as a nested dict (dotted dests unfolded)."""
    tree: dict[str, Any] = {}
    for dest, value in vars(args).items():
        if not dest.startswith(_PREFIX):
            continue
        parts = dest[len(_PREFIX):].split(".")
        node = tree
        for part in parts[:-1]:
            node = node.setdefault(part, {})
        # Mapping flags arrive as a list of (key, value) pairs.
        is_pairs = isinstance(value, list) and value and all(isinstance(v, tuple) for v in value)
        node[parts[-1]] = dict(value) if is_pairs else value
    return tree


def as_flag(form: str, cls: type, flag_names: dict[str, str] | None = None) -> str | None:
    """A `key=value` override as the flag that sets the same field of `cls` (`warmup=0.06` -> `--warmup 0.06`;
    a mapping field's key as its item, `model.fields.unpad=true` -> `--model.fields unpad=true`), or None
    where `key` names no field (the config's own error then says which keys there are)."""
    key, _, value = form.partition("=")
    parts = tuple(part.strip() for part in key.split("."))
    leaves = {path: annotation for path, _, annotation, _ in _leaves(cls)}
    for n in range(len(parts), 0, -1):
        if parts[:n] not in leaves:
            continue
        flag = (flag_names or {}).get(".".join(parts[:n]), _flag_of(parts[:n]))
        mapping = typing.get_origin(_without_none(leaves[parts[:n]])) is dict
        if n < len(parts):
            return f"{flag} {shlex.quote('.'.join(parts[n:]) + '=' + value)}" if mapping else None
        try:  # `model.fields={unpad: true}`: the flag takes its items
            items = _yaml_value(value) if mapping else None
        except argparse.ArgumentTypeError:  # the config's own error names it next
            items = None
        if isinstance(items, dict):
            return " ".join([flag] + [shlex.quote(f"{k}={json_like(v)}") for k, v in items.items()])
        return f"{flag} {shlex.quote(value)}"
    return None


def warn_deprecated(command: str, forms: Sequence[str], cls: type, flag_names: dict[str, str] | None = None) -> None:
    """The old override forms still work, with one line saying what to write instead: these very overrides as
    this command's flags (a fixed example named flags that most commands lack, `--optim.lr` to `finetune`)."""
    if forms:
        more = " ..." if len(forms) > 3 else ""
        flags = [flag for flag in (as_flag(form, cls, flag_names) for form in forms[:3]) if flag]
        log.warning("bertpipe %s: %s: the `key=value` / `--set key=value` override forms are deprecated; "
                    "write %s", command, " ".join(forms[:3]) + more,
                    " ".join(flags) + more if flags else "`--key value`")


def config_from_args(args: argparse.Namespace, cls: type, *, legacy: Sequence[str] = (), preset: bool = False,
                     fixed: dict[str, Any] | None = None, config_file: Any = None,
                     flag_names: dict[str, str] | None = None) -> Any:
    """Defaults <- --config (or `config_file`) <- deprecated `key=value` overrides <- flags <- `fixed`.

    `preset=True` lets --config name a preset in launch/configs/ (pre-training). Errors become a
    CliError naming the key (as the command's flag: `flag_names` where it is not the key's own spelling)
    and the valid keys.
    """
    try:
        source = config_file if config_file is not None else args.config
        data: dict[str, Any] = {}
        if source is not None:
            # A missing --config was "[Errno 2] No such file or directory: 'x.yaml'": refusals name the flag.
            named = hint = None
            if getattr(args, "config", None) is not None and str(source) == str(args.config):
                named = f"--config {source}"
                hint = (f"pass a YAML file of {cls.__name__} fields"
                        + (f" or a preset name ({', '.join(preset_names())})" if preset else ""))
            path = resolve_preset(source, named=named, hint=hint) if preset else source
            data = load_yaml(path, named=named, hint=hint)
        data = merge(data, parse_overrides(legacy))
        data = merge(data, given_flags(args))
        data = merge(data, fixed or {})
        return from_dict(cls, data)
    except (OSError, ValueError) as err:
        raise CliError(_flagged(str(err), flag_names)) from None
    except yaml.YAMLError as err:  # load_yaml and parse_overrides name their source; this is a last resort
        raise CliError(f"cannot read the configuration: {yaml_problem(err)}") from None


def _flagged(message: str, flag_names: dict[str, str] | None = None) -> str:
    """Name config keys the way the command line spells them (`seq_len` -> `--seq-len`, `inputs` -> `--input`)."""
    return re.sub(r"^([a-z_][a-z0-9_]*(?:\.[a-z_][a-z0-9_]*)*)(?=: )",
                  lambda m: (flag_names or {}).get(m.group(1), _flag_of(tuple(m.group(1).split(".")))), message, count=1)
