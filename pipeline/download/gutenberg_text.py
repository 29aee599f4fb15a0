"""Project Gutenberg plain-text files: decoding and exact header/footer stripping.

Every Project Gutenberg ebook wraps the book between two marker lines (since the 2000s):

    *** START OF THE PROJECT GUTENBERG EBOOK PERSUASION ***        (since ~2020)
    *** START OF THIS PROJECT GUTENBERG EBOOK PERSUASION ***       (2000s-2010s)
    ***START OF THE PROJECT GUTENBERG EBOOK ...                    (some 2000s files)
    ...the book...
    *** END OF THE PROJECT GUTENBERG EBOOK PERSUASION ***           (and THIS / ***END variants)

Everything before the START line (title block, licence summary, credits) and from the END line on
(the full Project Gutenberg licence) is not the book. Older files add a "Produced by ..." credit
paragraph right after START and an "End of the Project Gutenberg EBook of ..." line right before
END; both are removed too. The 1990s "small print" texts end their header with
`*END*THE SMALL PRINT! FOR PUBLIC DOMAIN ETEXTS*...` and have only an "End of ..." line as footer.

Unlike heuristic cleaners that delete any line *containing* a known phrase anywhere near the ends,
this strips at the markers only, so the book's own text is never touched: the result is exactly
the lines between the markers, minus the credit paragraph and surrounding blank lines, with `\\n`
line endings. A file with no START or no END marker is refused (`FormatError`): a missing END
marker usually means a truncated file, and a "COPYRIGHTED" marker means the book is not public
domain.
"""

from __future__ import annotations

import codecs
import re
from dataclasses import dataclass

from pipeline.download.errors import FormatError

_START = re.compile(r"^\s*\*{3}\s*START OF (?:THE|THIS) PROJECT GUTENBERG E-?BOOK\b", re.IGNORECASE)
_START_COPYRIGHTED = re.compile(r"^\s*\*{3}\s*START OF (?:THE|THIS) COPYRIGHTED PROJECT GUTENBERG", re.IGNORECASE)
_LEGACY_START = re.compile(r"^\s*\*END\*?\s*THE SMALL PRINT!", re.IGNORECASE)
_END = re.compile(r"^\s*\*{3}\s*END OF (?:THE|THIS) PROJECT GUTENBERG E-?BOOK\b", re.IGNORECASE)
_LEGACY_END = re.compile(r"^\s*End of (?:the |this )?Project Gutenberg(?:'s|’s)?\b", re.IGNORECASE)
_CREDIT = re.compile(
    r"^\s*(?:Produced by|E-?text prepared by|This e-?text was (?:prepared|produced) by|Transcribed from the)\b",
    re.IGNORECASE,
)
_DECLARED_CHARSET = re.compile(r"^Character set encoding:\s*([A-Za-z0-9_.:-]+)", re.IGNORECASE | re.MULTILINE)


@dataclass(frozen=True)
class StrippedBook:
    text: str  # the book only, "\n" line endings, ending in one newline
    start_marker: str
    end_marker: str
    header_lines: int  # lines removed before the book (marker and credits included)
    footer_lines: int  # lines removed after it


def decode_gutenberg(raw: bytes) -> str:
    """UTF-8 (with or without BOM), else the encoding the header declares ("Character set encoding: ...")."""
    try:
        return raw.decode("utf-8-sig")
    except UnicodeDecodeError:
        pass
    declared = _DECLARED_CHARSET.search(raw[:20000].decode("latin-1"))
    if declared:
        name = declared.group(1).rstrip(".")
        try:
            codecs.lookup(name)
            return raw.decode(name)
        except (LookupError, UnicodeDecodeError):
            raise FormatError(f"not valid UTF-8 and not valid in its declared encoding {name!r}") from None
    raise FormatError("not valid UTF-8 and declares no 'Character set encoding'")


def _marker_end(lines: list[str], i: int) -> int:
    """Index of the last line of a marker starting at line i (a long title can wrap the closing ***)."""
    if lines[i].rstrip().endswith("***") or _LEGACY_START.match(lines[i]):
        return i
    for j in range(i + 1, min(i + 3, len(lines))):
        if lines[j].rstrip().endswith("***"):
            return j
    return i


def strip_gutenberg(text: str) -> StrippedBook:
    """The book between Project Gutenberg's START and END markers (see the module docstring)."""
    lines = text.replace("\r\n", "\n").replace("\r", "\n").split("\n")
    start = next((i for i, line in enumerate(lines) if _START.match(line)), None)
    if start is None:
        if any(_START_COPYRIGHTED.match(line) for line in lines):
            raise FormatError("a copyrighted Project Gutenberg ebook (START OF THE COPYRIGHTED ...), not public domain")
        start = next((i for i, line in enumerate(lines) if _LEGACY_START.match(line)), None)
    if start is None:
        raise FormatError("no Project Gutenberg '*** START OF THE PROJECT GUTENBERG EBOOK' marker")
    start_last = _marker_end(lines, start)
    end = next((i for i in range(start_last + 1, len(lines)) if _END.match(lines[i])), None)
    if end is None:
        end = next((i for i in range(start_last + 1, len(lines)) if _LEGACY_END.match(lines[i])), None)
    if end is None:
        raise FormatError("no '*** END OF THE PROJECT GUTENBERG EBOOK' marker (a truncated file?)")

    lo, hi = start_last + 1, end
    # Older files: "End of the Project Gutenberg EBook of X" as the body's last line, before END.
    last = hi - 1
    while last >= lo and not lines[last].strip():
        last -= 1
    if last >= lo and _LEGACY_END.match(lines[last]):
        hi = last
    while lo < hi and not lines[lo].strip():
        lo += 1
    # Older files: a "Produced by ..." credit paragraph right after START.
    if lo < hi and _CREDIT.match(lines[lo]):
        while lo < hi and lines[lo].strip():
            lo += 1
    while lo < hi and not lines[lo].strip():
        lo += 1
    while hi > lo and not lines[hi - 1].strip():
        hi -= 1
    if lo == hi:
        raise FormatError("nothing between the START and END markers")
    body = "\n".join(lines[lo:hi]) + "\n"
    return StrippedBook(
        text=body,
        start_marker="\n".join(lines[start : start_last + 1]).strip(),
        end_marker=lines[end].strip(),
        header_lines=lo,
        footer_lines=len(lines) - hi,
    )
