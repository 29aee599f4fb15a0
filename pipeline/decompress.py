"""Decompression of one input file's bytes: bz2, gzip and xz sniffed from magic bytes, not the name.

Concatenated members (Wikipedia's multistream dumps, `cat a.gz b.gz`) read fully. Damage (a
truncated file, invalid data) raises `CorruptStream` once the text decoded well before it has been
yielded, so the readers keep the complete documents before the damage. Neither format says where
damage starts: gzip checks a member only at its end, bz2 a block (900 kB at the default level)
only after writing it out, and a decoder can run on through megabytes of garbled text before it
notices (measured: up to 1.8 MB for bz2, 3 MB for gzip, over 40 random damages each). So the last
HOLD bytes decoded before the damage are dropped with it, more than the longest garbled run measured.
"""

from __future__ import annotations

import bz2
import collections
import lzma
import zlib
from typing import BinaryIO, Iterator

CHUNK = 1 << 20  # bytes read, and about the bytes yielded, at a time
STEP = 1 << 16  # output per decompressor call (a call that raises returns nothing)
HOLD = 4 << 20  # decoded bytes held back until more follow: dropped if damage is found within them


class CorruptStream(Exception):
    """The compressed stream ends early (`truncated`: what decoded before is sound) or holds invalid data."""

    def __init__(self, message: str, *, truncated: bool = False) -> None:
        super().__init__(message)
        self.truncated = truncated


class TrailingBytes(CorruptStream):
    """Bytes after the last complete member that are not another member: the text is all there."""

    def __init__(self, message: str) -> None:
        super().__init__(message, truncated=True)


# Archive formats we do not decode, by magic bytes: read as text they were skipped as "binary".
_UNSUPPORTED = {b"\x28\xb5\x2f\xfd": "zstd", b"PK\x03\x04": "zip", b"7z\xbc\xaf\x27\x1c": "7z",
                b"\x04\x22\x4d\x18": "lz4"}


def unsupported_compression(head: bytes) -> str | None:
    """The name of the archive format `head` (a file's first bytes) starts, if we cannot decode it."""
    return next((name for magic, name in _UNSUPPORTED.items() if head.startswith(magic)), None)


def decompressed_chunks(raw: BinaryIO) -> Iterator[bytes]:
    """Uncompressed bytes of `raw`, sniffing bz2/gzip/xz; raises `CorruptStream` on damage at the end."""
    head = raw.read(CHUNK)
    magic = next((m for m in _MAKERS if head.startswith(m)), None)
    if magic is None:
        while head:
            yield head
            head = raw.read(CHUNK)
        return
    yield from _coalesced(_decoded(raw, head, magic))


# Magic bytes -> a decoder of one member (gzip) or stream (bz2, xz).
_MAKERS = {b"BZh": bz2.BZ2Decompressor, b"\x1f\x8b": lambda: zlib.decompressobj(16 + zlib.MAX_WBITS),
           b"\xfd7zXZ\x00": lambda: lzma.LZMADecompressor(lzma.FORMAT_XZ)}


def _after_member(raw: BinaryIO, data: bytes, magic: bytes) -> bytes:
    """What follows a complete member: the next member's bytes, or b"" at the end of the file. Zero bytes
    between or after members are skipped (xz's stream padding; tape blocks, which gzip also ignores);
    anything else there is not the file's text: raised as `TrailingBytes`, after the text of the members
    whose checksums passed."""
    while True:
        data = data.lstrip(b"\0")
        # A read can end inside the next member's magic bytes (b"\x1f" of gzip's b"\x1f\x8b", b"BZ" of
        # bz2's b"BZh"): judged alone they are not a member, and a valid file lost all its text after
        # that read. So a start of the magic is read on until it is whole, or the file ends.
        if len(data) >= len(magic) or (data and not magic.startswith(data)):
            break
        more = raw.read(CHUNK)
        if not more:
            break  # the end of the file: nothing, or a fragment that only looks like a member's start
        data += more
    if not data or data.startswith(magic):
        return data
    raise TrailingBytes(f"bytes after the last complete compressed member are not another member ({data[:8]!r}...); "
                        "ignored, the text before them is complete")


def _decoded(raw: BinaryIO, data: bytes, magic: bytes) -> Iterator[bytes]:
    decomp = _MAKERS[magic]()
    try:
        while True:
            yield from _inflate(decomp, data)
            if decomp.eof:
                # Concatenated members (multistream dumps, `cat a.gz b.gz`): start a new decoder.
                data = _after_member(raw, decomp.unused_data, magic)
                if not data:
                    return
                decomp = _MAKERS[magic]()
                continue
            data = raw.read(CHUNK)
            if not data:
                break
    except (OSError, EOFError, zlib.error, lzma.LZMAError, ValueError) as err:
        raise CorruptStream(str(err)) from err
    raise CorruptStream("compressed stream ends before its end marker (truncated file)", truncated=True)


def _inflate(decomp, data: bytes) -> Iterator[bytes]:
    """Everything `decomp` can decode from `data`, at most STEP bytes per call.

    Small calls matter on damaged input: a decompressor that raises returns nothing from that call,
    so an unbounded call would lose all the good text it decoded before the damage (megabytes of a
    bz2 file) with it.
    """
    while True:
        out = decomp.decompress(data, max_length=STEP)
        if out:
            yield out
        if decomp.eof:
            return
        if isinstance(decomp, (bz2.BZ2Decompressor, lzma.LZMADecompressor)):
            if decomp.needs_input:  # bz2 and xz keep unread input inside and say when they want more
                return
            data = b""
        else:
            data = decomp.unconsumed_tail  # zlib hands unread input back
            if not data and len(out) < STEP:
                return


def _coalesced(pieces: Iterator[bytes]) -> Iterator[bytes]:
    """`pieces` joined into chunks of about CHUNK bytes (parsers copy their buffer once per chunk,
    and a small first gzip member must not be all the format sniffer sees), each yielded only once
    HOLD more bytes have decoded after it. When `pieces` raises, the held bytes are dropped."""
    held: collections.deque[bytes] = collections.deque()
    size = 0
    try:
        for piece in pieces:
            held.append(piece)
            size += len(piece)
            while size - CHUNK >= HOLD:
                out = _take(held, CHUNK)
                size -= len(out)
                yield out
    except CorruptStream as err:
        if not err.truncated:
            raise CorruptStream(f"{err}; the last {size:,} bytes decoded before it were dropped: they may be "
                                "garbled") from err
        while held:  # cut short, not damaged: everything decoded is the file's own text
            yield _take(held, CHUNK)
        raise
    while held:
        yield _take(held, CHUNK)


def _take(held: collections.deque[bytes], n: int) -> bytes:
    """The first `n` bytes (or all) of the pieces in `held`, removed from it."""
    out, size = [], 0
    while held and size < n:
        piece = held.popleft()
        if size + len(piece) > n:
            piece, rest = piece[: n - size], piece[n - size :]
            held.appendleft(rest)
        out.append(piece)
        size += len(piece)
    return b"".join(out)
