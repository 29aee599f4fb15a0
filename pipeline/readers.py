"""Streaming readers: bytes of one input file -> documents, or counted skips with reasons.

Pure functions over a binary stream (Beam's `FileSystems.open` in the job, a plain file in tests).
Compression (bz2, gzip, xz) is sniffed from magic bytes, not the file name (`pipeline.decompress`);
other archive formats are skipped as `unsupported_compression`; a truncated or
corrupt stream ends the file with a `corrupt_compression` skip after the complete documents before
the damage have been emitted. A UTF-8 byte order mark at the start of a file is dropped. Memory per
file is bounded by `max_document_bytes`: a larger document is skipped, never held.

Formats:
- `wiki-xml`: MediaWiki `pages-articles` dump; each `<page>` is cut out and parsed on its own, so
  one malformed page costs that page only.
- `text`: a book; the whole file is one document, paragraphs separated by blank lines, hard-wrapped
  lines joined. Project Gutenberg headers and licence footers are removed.
- `lines`: google-research/bert's layout: one sentence per line, blank lines between documents.
- `jsonl`: one JSON object per line with a `text` field (WikiExtractor `--json`, HF dataset exports);
  `id` (if present) names the document.
- `wikiextractor`: WikiExtractor's default output: `<doc id=.. url=.. title=..>` blocks, the title
  on the first line, then one paragraph per line, up to `</doc>`.
Under `--format auto` each file's format is sniffed (`pipeline.format_sniffing`).
"""

from __future__ import annotations

import json
import logging
import re
from dataclasses import dataclass, field
from typing import BinaryIO, Iterator, Union

from pipeline.decompress import CHUNK, CorruptStream, TrailingBytes, decompressed_chunks, unsupported_compression
from pipeline.format_sniffing import (DOC_OPEN, JSON_ARRAY, MARKUP, MARKUP_DETAIL, named_jsonl, sniff_format,
                                      why_not_text)
from pipeline.wikitext import parse_page, wikitext_to_paragraphs

log = logging.getLogger(__name__)

FORMATS = ("auto", "wiki-xml", "text", "lines", "jsonl", "wikiextractor")
BOM = b"\xef\xbb\xbf"  # UTF-8 byte order mark, written by Notepad and some exporters
SNIFF_BYTES = 1 << 16  # text read before the format is sniffed (`sniff_format` looks at as much)


@dataclass(frozen=True)
class RawDocument:
    """`segments` are paragraphs to be split into sentences, or sentences if `presplit`. `source` is the
    input file's path, for a dead letter only (a document that tokenizes to nothing): nothing written from
    the document depends on it, so the same file read from another folder gives the same shards."""

    doc_id: str
    segments: list[str]
    presplit: bool = False
    source: str = ""


@dataclass(frozen=True)
class Skip:
    """A record (or file) left out, with the reason counted in the manifest."""

    source: str
    record_id: str
    reason: str
    detail: str = ""


@dataclass
class ReadStats:
    """Non-skip events worth counting (documents repaired rather than dropped)."""

    counts: dict[str, int] = field(default_factory=dict)

    def inc(self, name: str, n: int = 1) -> None:
        self.counts[name] = self.counts.get(name, 0) + n


Record = Union[RawDocument, Skip]


_LONE_SURROGATE = re.compile("[\ud800-\udfff]")


def _paragraphs_without_lone_surrogates(paragraphs: list[str], stats: ReadStats) -> list[str]:
    """JSON's `\\ud83d` escapes and a wiki page's `&#55357;` entities (mwparserfromhell's) decode to lone
    surrogates (an emoji cut in half), which no UTF-8 encoder takes: repaired to U+FFFD like invalid UTF-8
    bytes, where they stopped the whole job; counted once per document."""
    if not any(_LONE_SURROGATE.search(p) for p in paragraphs):
        return paragraphs
    stats.inc("documents_invalid_utf8_repaired")
    return [_LONE_SURROGATE.sub("\ufffd", p) for p in paragraphs]


def _decode(data: bytes, stats: ReadStats) -> str:
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError:
        # Repaired, not dropped: one bad byte should not cost a whole book.
        stats.inc("documents_invalid_utf8_repaired")
        return data.decode("utf-8", errors="replace")


def read_file(raw: BinaryIO, source: str, fmt: str, max_document_bytes: int, stats: ReadStats) -> Iterator[Record]:
    """Documents and skips of one input file, streaming."""
    try:
        first, blank_lines, chunks = _first_text(decompressed_chunks(raw))
    except CorruptStream as err:
        yield Skip(source, source, "corrupt_compression", str(err))
        return
    if not first:
        yield Skip(source, source, "empty_file")
        return
    packed = unsupported_compression(first)
    if packed:
        yield Skip(source, source, "unsupported_compression", f"{packed}: decompress it, or recompress it as "
                   "bz2, gzip or xz")
        return
    not_text = why_not_text(first)
    if not_text:
        yield Skip(source, source, "binary_file", not_text)
        return
    how = "--format"
    if fmt == "auto" and JSON_ARRAY.match(first[:4096].lstrip(BOM)):
        # `Dataset.to_json(lines=False)`, a JSON export: read as prose it became "} , { " id " ..." text.
        yield Skip(source, source, "json_array", "a JSON array of records: write it as JSON Lines, one object a line "
                   "(jq -c '.[]' FILE, or Dataset.to_json(path, lines=True))")
        return
    if fmt == "auto" and named_jsonl(source):
        fmt, how = "jsonl", "by its name"
    elif fmt == "auto":
        fmt, how = sniff_format(first), "sniffed"
        if fmt == MARKUP:  # an RSS feed, a web page: read as a book, its tags became the text
            yield Skip(source, source, "unsupported_format", MARKUP_DETAIL)
            return
    log.info("reading %s as %s (%s)", source, fmt, how)
    stats.inc(f"files_{fmt.replace('-', '_')}")

    def stream() -> Iterator[bytes]:
        for done in range(0, blank_lines, CHUNK):  # the blank run's line breaks: JSON Lines ids count lines
            yield b"\n" * min(CHUNK, blank_lines - done)
        yield first
        yield from chunks

    parsers = {"wiki-xml": _wiki_pages, "text": _book, "lines": _sentence_lines, "jsonl": _jsonl,
               "wikiextractor": _extracted_docs}
    name = source.rsplit("/", 1)[-1]
    records = 0
    try:
        for record in parsers[fmt](stream(), name, source, max_document_bytes, stats):
            records += 1
            yield record
    except CorruptStream as err:
        records += 1
        yield Skip(source, f"{name}@end", "corrupt_compression", str(err))
    if not records:  # e.g. a book under `--format wiki-xml`: nothing in it has that format's shape
        yield Skip(source, source, "no_document_in_format", f"nothing in it reads as {fmt} ({how})")


def _first_text(chunks: Iterator[bytes]) -> tuple[bytes, int, Iterator[bytes]]:
    """The file's text from its first non-blank byte, at least `SNIFF_BYTES` of it where the file holds as
    much; the line breaks of the blank run before it (counted, not held); the chunks after it. Decided on the
    first chunk alone, a file opening with 1 MiB of blank lines was skipped as empty, its book lost, and a
    chunk whose text starts near its end gave the format sniffing almost nothing to go on. Damage met after
    some text is raised again by the chunks returned, after that text: its documents are kept."""
    head, blank_lines, at_start = b"", 0, True
    try:
        for chunk in chunks:
            if at_start and chunk.startswith(BOM):
                chunk = chunk[len(BOM) :]  # json.loads refuses it; in text it would glue itself to the first word
            at_start = False
            if not head:
                text = chunk.lstrip()
                blank_lines += chunk.count(b"\n", 0, len(chunk) - len(text))
                chunk = text
            head += chunk
            if len(head) >= SNIFF_BYTES:
                break
    except CorruptStream as err:
        if not head:
            raise
        return head, blank_lines, _raising(err)
    return head, blank_lines, chunks


def _raising(err: Exception) -> Iterator[bytes]:
    raise err
    yield b""  # a generator: raises where the next chunk would have come


def _lines(stream: Iterator[bytes], max_line: int) -> Iterator[bytes | None]:
    """Lines without their newline; `None` for a line longer than `max_line` (skipped unread)."""
    buf = b""
    overlong = False
    for chunk in stream:
        buf += chunk
        # Scan with an offset and cut the buffer once per chunk: slicing the rest off after every
        # line would copy the chunk once per line (quadratic in lines per chunk).
        pos = 0
        while True:
            nl = buf.find(b"\n", pos)
            if nl < 0:
                break
            # Over the cap within one chunk too, not only when a chunk ends inside it.
            yield None if overlong or nl - pos > max_line else buf[pos:nl].rstrip(b"\r")
            overlong = False
            pos = nl + 1
        buf = buf[pos:]
        if len(buf) > max_line:
            overlong, buf = True, b""
    if overlong:
        yield None
    elif buf:
        yield buf.rstrip(b"\r")


def _wiki_pages(stream, name, source, max_bytes, stats) -> Iterator[Record]:
    buf = b""
    for chunk in stream:
        buf += chunk
        pos = 0  # an offset, not a slice per page: the rest of the buffer is copied once per chunk
        while True:
            start = buf.find(b"<page>", pos)
            if start < 0:
                buf = buf[-8:]  # keep a possible partial "<page>" tag
                break
            end = buf.find(b"</page>", start)
            if end < 0:
                buf = buf[start:]
                if len(buf) > max_bytes:
                    # A page larger than the cap: drop what is held and resync at the next page.
                    yield Skip(source, f"{name}@page", "document_too_large")
                    buf = b""
                break
            pos = end + len(b"</page>")
            if pos - start > max_bytes:  # whole within one chunk, but over the cap all the same
                yield Skip(source, f"{name}@page", "document_too_large", f"over {max_bytes} bytes")
                continue
            yield from _wiki_page(buf[start:pos], name, source, stats)
    if b"<page>" in buf:
        # An uncompressed file cut off inside a page (a damaged archive raises CorruptStream instead).
        match = re.search(rb"<id>\s*(\d+)\s*</id>", buf)
        ident = match.group(1).decode() if match else "?"
        yield Skip(source, f"{name}#{ident}", "malformed_xml", "the file ends inside this <page>")


def _wiki_page(page_xml: bytes, name: str, source: str, stats: ReadStats) -> Iterator[Record]:
    try:
        # Decoded here, not by the XML parser, which drops a whole page over one invalid byte.
        page = parse_page(_decode(page_xml, stats))
    except Exception as err:  # ElementTree raises ParseError and, on odd input, ValueError
        match = re.search(rb"<id>\s*(\d+)\s*</id>", page_xml)
        ident = match.group(1).decode() if match else "?"
        yield Skip(source, f"{name}#{ident}", "malformed_xml", str(err)[:200])
        return
    doc_id = f"{name}#{page.page_id}"
    if page.is_redirect:
        yield Skip(source, doc_id, "wiki_redirect")
    elif page.namespace != 0:
        yield Skip(source, doc_id, "wiki_non_article_namespace")
    else:
        try:
            paragraphs = wikitext_to_paragraphs(page.text)
        except Exception as err:  # mwparserfromhell's ParserError, RecursionError on pathological nesting
            yield Skip(source, doc_id, "wikitext_parse_error", f"{type(err).__name__}: {str(err)[:200]}")
            return
        if paragraphs:
            yield RawDocument(doc_id, _paragraphs_without_lone_surrogates(paragraphs, stats), source=source)
        else:
            yield Skip(source, doc_id, "empty_document")


_GUTENBERG_MARKER = re.compile(r"^\*\*\*\s*(START|END) OF (THE|THIS) PROJECT GUTENBERG.*$", re.M | re.I)


def _gutenberg_bodies(text: str) -> str:
    """Each book's body: the text between every START marker and the END after it, joined by a blank line.
    Several books concatenated into one file kept the first only, the rest dropped with its licence. Text
    before the first marker is a header when that marker is a START, and the book when it is an END (a file
    with its footer only); text after an END up to the next START (a licence, then a header) is dropped."""
    markers = list(_GUTENBERG_MARKER.finditer(text))
    body_from = None if markers and markers[0].group(1).lower() == "start" else 0
    bodies = []
    for marker in markers:
        if body_from is not None:  # a START with no END before the next START: its body is kept, not lost
            bodies.append(text[body_from : marker.start()])
        body_from = marker.end() if marker.group(1).lower() == "start" else None
    if body_from is not None:  # a last START with no END after it (or no marker at all): the rest is book
        bodies.append(text[body_from:])
    return "\n\n".join(bodies)  # a blank line: the last paragraph of one book never joins the next's first


def _book(stream, name, source, max_bytes, stats) -> Iterator[Record]:
    parts, size, cut, too_large = [], 0, None, False
    try:
        for chunk in stream:
            size += len(chunk)
            if size > max_bytes:
                too_large = True
                break
            parts.append(chunk)
    except CorruptStream as err:
        if not err.truncated:  # damaged: the book is not read at all
            raise
        cut = err  # a compressed book cut short is still most of a book: kept, its skip counted after it
    if too_large:  # none of it is read; the drain below (outside the try) still raises a damaged tail
        parts.clear()
        yield Skip(source, name, "document_too_large", f"over {max_bytes} bytes")
        for _ in stream:  # drain without holding
            pass
        return
    # A lone \r (classic Mac) ends a line too: the ^...$ markers and the blank lines between paragraphs need \n,
    # and without it the header and licence stayed and the whole book became one paragraph.
    text = _gutenberg_bodies(re.sub(r"\r\n?", "\n", _decode(b"".join(parts), stats)))
    paragraphs = [" ".join(p.split()) for p in re.split(r"\n\s*\n", text)]
    paragraphs = [p for p in paragraphs if p]
    if cut is not None and not isinstance(cut, TrailingBytes):
        paragraphs = paragraphs[:-1]  # it may stop mid-sentence
    if paragraphs:
        yield RawDocument(name, paragraphs, source=source)
    elif cut is None:
        yield Skip(source, name, "empty_document")
    if cut is not None:
        raise cut


def _sentence_lines(stream, name, source, max_bytes, stats) -> Iterator[Record]:
    sentences: list[str] = []
    size, index, too_large = 0, 0, False

    def flush() -> Iterator[Record]:
        doc_id = f"{name}:{index}"
        if too_large:
            yield Skip(source, doc_id, "document_too_large", f"over {max_bytes} bytes")
        elif sentences:
            yield RawDocument(doc_id, list(sentences), presplit=True, source=source)

    for line in _lines(stream, max_bytes):
        if line is None:
            too_large = True
            continue
        if not line.strip():
            if sentences or too_large:
                yield from flush()
                index += 1
            sentences, size, too_large = [], 0, False
            continue
        size += len(line)
        if size > max_bytes:
            too_large, sentences = True, []
        if not too_large:
            sentences.append(_decode(line, stats).strip())
    if sentences or too_large:
        yield from flush()


def _jsonl(stream, name, source, max_bytes, stats) -> Iterator[Record]:
    # This file's ids. One given to many records (a source name in every one) made them one document id:
    # all in one NSP bucket, which one worker holds, and all in the same split (none held out).
    seen: set[str] = set()
    for line_no, line in enumerate(_lines(stream, max_bytes), start=1):
        fallback_id = f"{name}:{line_no}"
        if line is None:
            yield Skip(source, fallback_id, "document_too_large", f"over {max_bytes} bytes")
            continue
        if not line.strip():
            continue
        try:
            obj = json.loads(_decode(line, stats))
        except (ValueError, RecursionError) as err:  # RecursionError: pathologically nested JSON
            yield Skip(source, fallback_id, "malformed_json", str(err)[:200])
            continue
        if not isinstance(obj, dict) or not isinstance(obj.get("text"), str):
            yield Skip(source, fallback_id, "json_without_text")
            continue
        doc_id = f"{name}:{obj['id']}" if isinstance(obj.get("id"), (str, int)) else fallback_id
        doc_id = _LONE_SURROGATE.sub("\ufffd", doc_id)
        if doc_id in seen:
            stats.inc("jsonl_ids_repeated")
            doc_id = f"{doc_id}@{line_no}"
        seen.add(doc_id)
        paragraphs = [" ".join(p.split()) for p in obj["text"].split("\n")]
        paragraphs = [p for p in paragraphs if p]
        if paragraphs:
            yield RawDocument(doc_id, _paragraphs_without_lone_surrogates(paragraphs, stats), source=source)
        else:
            yield Skip(source, doc_id, "empty_document")


_DOC_TITLE = re.compile(rb'\btitle="(.*?)"(?:\s+[\w-]+="|\s*>)')  # unescaped: a title may hold quotes


def _extracted_docs(stream, name, source, max_bytes, stats) -> Iterator[Record]:
    """WikiExtractor's default output: one document per `<doc ...>` ... `</doc>` block."""
    doc_id, title, lines, size = None, b"", [], 0
    for line in _lines(stream, max_bytes):
        opened = DOC_OPEN.match(line or b"")
        if opened and doc_id is not None:  # its `</doc>` is missing: it would swallow this article, tag and all
            yield Skip(source, doc_id, "malformed_doc", "a new <doc> starts before this one's </doc>")
            doc_id = None
        if doc_id is None:
            if opened:
                doc_id, lines, size = f"{name}#{opened.group(1).decode(errors='replace')}", [], 0
                found = _DOC_TITLE.search(line)
                title = found.group(1) if found else b""
            elif line is None or line.strip():
                stats.inc("wikiextractor_lines_outside_doc")  # counted, not read: no article holds them
        elif line is not None and line.strip() == b"</doc>":
            yield _extracted_doc(doc_id, title, lines, size, source, max_bytes, stats)
            doc_id = None
        else:
            # An overlong line (None) or too many: the document will be skipped, so hold none of it.
            size += max_bytes + 1 if line is None else len(line)
            if size <= max_bytes:
                lines.append(line)
            else:
                lines = []
    if doc_id is not None:
        yield Skip(source, doc_id, "malformed_doc", "the file ends inside this <doc>")


def _extracted_doc(doc_id, title, lines, size, source, max_bytes, stats) -> Record:
    if size > max_bytes:
        return Skip(source, doc_id, "document_too_large", f"over {max_bytes} bytes")
    paragraphs = [" ".join(_decode(line, stats).split()) for line in lines]
    paragraphs = [p for p in paragraphs if p]
    if paragraphs and title and paragraphs[0] == " ".join(_decode(title, stats).split()):
        paragraphs = paragraphs[1:]  # WikiExtractor repeats the title as the first line
    return RawDocument(doc_id, paragraphs, source=source) if paragraphs else Skip(source, doc_id, "empty_document")
