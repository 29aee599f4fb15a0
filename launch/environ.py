"""Environment variables changed for a while, then put back as they were."""

from __future__ import annotations

import contextlib
import os
from typing import Iterator


@contextlib.contextmanager
def restoring_environ(*keys: str) -> Iterator[None]:
    """On exit, each of `keys` in `os.environ` is as it was on entry (set to its old value, or unset);
    the body changes them as it needs."""
    saved = {key: os.environ.get(key) for key in keys}
    try:
        yield
    finally:
        for key, value in saved.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value
