"""The one `torch.load` of the code base: pickled PyTorch files read as tensors and plain values only.

A file that names any other class or function is refused in one line naming the file (unpickling it
could run code): `load_torch_file` reads, `check_torch_file` only inspects (cheap on large files).
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import torch

# torch words a refused global as "GLOBAL m.f was not an allowed global" or, for modules it blocks
# outright (os, subprocess), "unsupported GLOBAL posix.system whose module posix is blocked".
_UNSAFE_GLOBAL = re.compile(r"GLOBAL (\S+) (?:was not an allowed global|whose module \S+ is blocked)")


def _refusal(path: Path, globals_: list[str]) -> ValueError:
    return ValueError(
        f"{path}: refused to load: it references {', '.join(sorted(globals_)[:3])}, which is not a tensor or a plain "
        f"value (unpickling it could run code); only tensor files are loaded: get this checkpoint as safetensors, "
        f"or from a source you trust")


def load_torch_file(path: str | Path, allowed_globals: tuple[Any, ...] = (), map_location: Any = "cpu") -> Any:
    """The one `torch.load` of the code base: tensors and plain values only (`weights_only=True`), plus the
    classes in `allowed_globals`; anything else is refused in one line naming the file and why."""
    import pickle

    path = Path(path)
    try:
        with torch.serialization.safe_globals(list(allowed_globals)):
            return torch.load(path, map_location=map_location, weights_only=True)
    except pickle.UnpicklingError as err:
        names = _UNSAFE_GLOBAL.findall(str(err))
        if names:
            raise _refusal(path, names) from None
        detail = re.search(r"WeightsUnpickler error:\s*(.+?)\s*(?:\n\n|$)", str(err), re.S)
        raise ValueError(f"{path}: refused to load: it is not a file of tensors and plain values "
                         f"({detail.group(1) if detail else str(err).splitlines()[0][:200]})") from None
    except (RuntimeError, OSError, EOFError, KeyError, IndexError, ValueError) as err:
        # Whatever unpickling a file that is not one hits: an empty file's EOFError says nothing, "hello"'s
        # is a KeyError from the pickle memo.
        raise _not_tensors(path, err) from None


def _not_tensors(path: Path, err: BaseException) -> ValueError:
    if isinstance(err, FileNotFoundError):  # not "truncated": there is no such file
        return ValueError(f"{path} does not exist")
    line = (str(err).splitlines() or [""])[0][:200]
    detail = f"{type(err).__name__}: {line}" if line else type(err).__name__
    return ValueError(f"{path} is truncated or not a PyTorch tensor file ({detail})")


def check_torch_file(path: str | Path, allowed_names: frozenset[str] = frozenset()) -> None:
    """Refuse, as `load_torch_file` would, a file whose pickle names any class or function beyond tensors,
    plain values and `allowed_names` (`module.Name`), without reading its tensors (cheap on large files)."""
    path = Path(path)
    try:
        found = torch.serialization.get_unsafe_globals_in_checkpoint(path)
    except (ValueError, RuntimeError, OSError, KeyError) as err:
        if not isinstance(err, ValueError):  # a zip archive cut short
            raise _not_tensors(path, err) from None
        load_torch_file(path, map_location="meta")  # not a zip archive: the legacy format, checked by loading it
        return
    unsafe = [name for name in found if name not in allowed_names]
    if unsafe:
        raise _refusal(path, unsafe)
