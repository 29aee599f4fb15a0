"""What one input file holds, from its first uncompressed bytes (and, for JSON Lines, its name).

`why_not_text` refuses what is not UTF-8 text (NUL bytes, UTF-16, mostly undecodable bytes); `sniff_format`
tells the readers' formats apart (`pipeline.readers`) and spots XML or HTML that none reads (`MARKUP`);
`JSON_ARRAY` spots a JSON array of records, which no format reads. Used only when `--format` is `auto`,
except `why_not_text`.
"""

from __future__ import annotations

import json
import re

JSON_ARRAY = re.compile(rb"\s*\[\s*\{")
# WikiExtractor's opening tag, alone on its line (`pipeline.readers` cuts documents at it too).
DOC_OPEN = re.compile(rb'\s*<doc\s[^>]*\bid="([^"]*)"[^>]*>\s*$')
# A sentence ending inside a line, another starting: "... at Kellynch. Sir Walter ..."
_INNER_SENTENCE_END = re.compile(r"\w[.!?][\"'\u201d)]?\s+[\"\u201c(]?[A-Z]")
_OBJECT_START = re.compile(r'\s*\{\s*"')
_JSONL_NAME = re.compile(r"\.(jsonl|ndjson)(\.(gz|bz2|xz))?$", re.I)
# XML or HTML that no reader takes, from a file's start (after a BOM and blank lines): a declaration or an
# <html> tag; or a root tag whose first content is another element (<rss version="2.0"><channel>) with tags
# making up much of the text. Read as a book, an RSS feed was trained on as "< / description > < / item > ...";
# Markdown or prose that opens with a comment, a centred logo or a tag around a word is still a book.
_MARKUP_DECLARED = re.compile(r"<(?:\?xml|!doctype|html[\s>])", re.I)
_ROOT_THEN_TAG = re.compile(r"<[A-Za-z][\w:.-]*(?:\s[^<>]*)?>\s*<[A-Za-z]")
_COMMENTS = re.compile(r"^(?:<!--.*?-->\s*)+", re.S)
_TAG = re.compile(r"<[^<>]{1,500}>")
_MARKUP_SHARE = 0.35  # of the sample's non-blank characters inside tags (an RSS feed's items: 40% and more)
MARKUP = "markup"  # not a format: what `sniff_format` calls XML or HTML that no reader takes
MARKUP_DETAIL = "XML/HTML that is not a MediaWiki export; convert it to text, or pass --format text"


def named_jsonl(path: str) -> bool:
    """A `.jsonl` or `.ndjson` name, compressed or not: JSON Lines by its name, whatever its first line holds."""
    return bool(_JSONL_NAME.search(path))


def _json_object(line: str) -> bool:
    if not line.lstrip().startswith("{"):
        return False
    try:
        return isinstance(json.loads(line), dict)
    except (ValueError, RecursionError):  # RecursionError: pathologically nested JSON
        return False


def _mostly_json_objects(head: str) -> bool:
    """At least half the sample's non-blank lines are JSON objects. Decided on the first line alone, a
    first record cut off (or `null`) made a whole export one "book" of JSON syntax, silently; read as
    JSONL, a bad line is one counted `malformed_json`. The sample's last line may be cut short: it counts
    as an object when it opens like one (`{"`), as a record longer than the sample does (a book per line)."""
    *complete, tail = head.split("\n")
    lines = [ln for ln in complete if ln.strip()]
    objects = sum(map(_json_object, lines))
    if tail.strip():
        lines.append(tail)
        objects += bool(_OBJECT_START.match(tail)) or _json_object(tail)
    return bool(lines) and 2 * objects >= len(lines)


def _mostly_tags(text: str) -> bool:
    in_tags = sum(_non_blank(m.group()) for m in _TAG.finditer(text))
    return in_tags >= _MARKUP_SHARE * _non_blank(text)


def _non_blank(text: str) -> int:
    return len(text) - sum(map(text.count, " \t\r\n"))


def sniff_format(sample: bytes) -> str:
    """`wiki-xml`, `wikiextractor`, `jsonl`, `lines` or `text` from the first uncompressed bytes of a file;
    `MARKUP` for other XML or HTML, which the caller skips (under `--format text` it is read as a book)."""
    head = sample[:65536].decode("utf-8", errors="replace")
    stripped = head.lstrip("\ufeff \t\r\n")
    if stripped.startswith("<mediawiki") or ("<page>" in head and "<revision>" in head):
        return "wiki-xml"
    if DOC_OPEN.match(stripped.split("\n", 1)[0].encode()):
        return "wikiextractor"
    opening = _COMMENTS.sub("", stripped, count=1)  # a comment first says nothing either way
    if _MARKUP_DECLARED.match(opening) or _ROOT_THEN_TAG.match(opening) and _mostly_tags(opening):
        return MARKUP
    if _mostly_json_objects(stripped):
        return "jsonl"
    lines = [ln.strip() for ln in head.split("\n")[:-1] if ln.strip()]
    if len(lines) >= 5:
        # One sentence per line: almost every line ends a sentence. Hard-wrapped prose: few do.
        # Prose with one paragraph per line ends them too, but most of its lines hold several.
        enders = sum(ln.endswith((".", "!", "?", '"', "'", "\u201d", ")")) for ln in lines)
        paragraphs = sum(bool(_INNER_SENTENCE_END.search(ln)) for ln in lines)
        if enders / len(lines) >= 0.8 and paragraphs / len(lines) < 0.5:
            return "lines"
    return "text"


def _looks_utf16(head: bytes) -> bool:
    """Mostly ASCII as UTF-16 without a byte-order mark: NUL in nearly every other byte, on one side."""
    even, odd = head[0::2], head[1::2]
    low, high = sorted((even.count(0) / max(len(even), 1), odd.count(0) / max(len(odd), 1)))
    return high > 0.9 and low < 0.1  # the other side text: a tarball or zeros are NUL on both


def why_not_text(sample: bytes) -> str | None:
    """Why the first 8 KiB are not UTF-8 text (NUL bytes, or mostly undecodable bytes), or None."""
    head = sample[:8192]
    if not head:
        return None
    if head[:2] in (b"\xff\xfe", b"\xfe\xff") or (b"\x00" in head and _looks_utf16(head)):
        return "UTF-16 text (every other byte NUL); convert it to UTF-8: iconv -f utf-16 -t utf-8"
    if b"\x00" in head:
        return "NUL bytes in its first 8 KiB"
    text = head.decode("utf-8", errors="replace")
    if text.count("\ufffd") > 0.1 * len(text):
        return ("over 10% of its first 8 KiB is not UTF-8; if it is text in another encoding (e.g. Latin-1), "
                "convert it: iconv -f latin1 -t utf-8")
    return None
