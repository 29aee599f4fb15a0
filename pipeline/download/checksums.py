"""Published checksum lists (`sha1sum`/`md5sum` output) and streaming file hashes."""

from __future__ import annotations

import hashlib
import re
from pathlib import Path
from typing import Iterable

# Hex digest length per algorithm: a line whose digest has the wrong length is not that list's.
DIGEST_HEX_LEN = {"md5": 32, "sha1": 40, "sha256": 64}

_LINE = re.compile(r"^(?P<digest>[0-9a-fA-F]+)\s+\*?(?P<name>\S.*?)\s*$")

CHUNK = 1 << 20


def parse_checksum_list(text: str, algorithm: str) -> dict[str, str]:
    """`<hexdigest>  <file name>` lines (coreutils format, optional `*` binary flag) -> {name: digest}.

    Blank lines and `#` comments are ignored; a line that is not a digest of `algorithm`'s length is
    an error, because silently dropping it could leave a file unverified.
    """
    if algorithm not in DIGEST_HEX_LEN:
        raise ValueError(f"unknown checksum algorithm {algorithm!r}; use one of {', '.join(DIGEST_HEX_LEN)}")
    out: dict[str, str] = {}
    for lineno, line in enumerate(text.splitlines(), 1):
        if not line.strip() or line.lstrip().startswith("#"):
            continue
        match = _LINE.match(line)
        if not match or len(match["digest"]) != DIGEST_HEX_LEN[algorithm]:
            raise ValueError(f"line {lineno} of the {algorithm} list is not '<{algorithm} digest>  <file name>': {line!r}")
        out[match["name"]] = match["digest"].lower()
    return out


def hash_file(path: Path, algorithms: Iterable[str], chunk_size: int = CHUNK) -> dict[str, str]:
    """Hex digests of one file for several algorithms in a single pass over its bytes."""
    hashers = {name: hashlib.new(name) for name in sorted(set(algorithms))}
    with open(path, "rb") as f:
        while block := f.read(chunk_size):
            for h in hashers.values():
                h.update(block)
    return {name: h.hexdigest() for name, h in hashers.items()}


def hash_bytes(data: bytes, algorithms: Iterable[str]) -> dict[str, str]:
    return {name: hashlib.new(name, data).hexdigest() for name in sorted(set(algorithms))}


class RunningDigest:
    """Digests of `dest.part` kept up to date as bytes are written, so a finished download needs no
    second pass over a multi-GB file; re-synced from disk when the part file and the digests differ
    (a resume from an earlier run, or a restart)."""

    def __init__(self, algorithms: tuple[str, ...]) -> None:
        self.algorithms = algorithms
        self.reset()

    def reset(self) -> None:
        self.hashers = {name: hashlib.new(name) for name in self.algorithms}
        self.n = 0

    def update(self, block: bytes) -> None:
        for h in self.hashers.values():
            h.update(block)
        self.n += len(block)

    def sync(self, part: Path) -> None:
        """Re-hash `part` from disk unless the digests already cover exactly its bytes."""
        size = part.stat().st_size if part.exists() else 0
        if size == self.n:
            return
        self.reset()
        if size:
            with open(part, "rb") as f:
                while block := f.read(CHUNK):
                    self.update(block)

    def hexdigests(self) -> dict[str, str]:
        return {name: h.hexdigest() for name, h in self.hashers.items()}
