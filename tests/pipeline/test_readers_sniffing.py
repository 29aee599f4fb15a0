"""What `--format auto` makes of a file's start: markup that no reader takes is a counted skip, not a book of
tags; a blank run before the text, however long, neither empties the file nor hides its format."""

from __future__ import annotations

import gzip
import io
import json
import tracemalloc

import pytest

from launch import cli
from pipeline.decompress import CHUNK
from pipeline.manifest import read_manifest
from pipeline.readers import RawDocument, ReadStats, Skip, read_file

MAX = 16_000_000
PROSE = "The quick brown fox jumps over the lazy dog. It was a very sunny day in the valley."
BOOK = "\n\n".join(f"Chapter {i}. {PROSE} Nobody had seen anything like it before." for i in range(3000)) + "\n"
MARKUP_DETAIL = "XML/HTML that is not a MediaWiki export; convert it to text, or pass --format text"

RSS_ITEMS = "".join(f"<item><title>Story {i}</title><link>https://example.com/{i}</link>"
                    f"<description>{PROSE}</description></item>\n" for i in range(40))
RSS = f'<?xml version="1.0" encoding="UTF-8"?>\n<rss version="2.0"><channel><title>News</title>\n{RSS_ITEMS}</channel></rss>\n'
ATOM = f'<feed xmlns="http://www.w3.org/2005/Atom">\n<title>News</title>\n{RSS_ITEMS}</feed>\n'  # no prolog: a root tag
HTML = f"<!DOCTYPE html>\n<html><head><title>Page</title></head><body>\n<p>{PROSE}</p>\n" * 5 + "</body></html>\n"
WIKI = ('<?xml version="1.0" encoding="utf-8"?>\n<mediawiki xmlns="http://www.mediawiki.org/xml/export-0.10/">\n'
        + "".join(f'<page><title>T{i}</title><ns>0</ns><id>{i}</id><revision><id>1</id><text xml:space="preserve">'
                  f"{PROSE}</text></revision></page>\n" for i in (1, 2)) + "</mediawiki>\n")


def read(data: bytes, fmt: str = "auto", source: str = "mem/f.txt"):
    return _records(io.BytesIO(data), fmt, source)


def _records(raw, fmt: str = "auto", source: str = "mem/f.txt"):
    stats = ReadStats()
    records = list(read_file(raw, source, fmt, MAX, stats))
    return ([r for r in records if isinstance(r, RawDocument)], [r for r in records if isinstance(r, Skip)], stats.counts)


@pytest.mark.parametrize("markup", [RSS, ATOM, HTML, "<html>\n<body>" + HTML.split("<body>", 1)[1],
                                    "\ufeff\n\n  " + RSS, "<!-- a feed -->\n" + ATOM])
def test_xml_or_html_that_is_not_a_wiki_export_is_a_counted_skip_not_a_book_of_tags(markup):
    # An RSS feed was read as a book: "< / description > < / item > < item > < title > ..." trained on.
    docs, skips, counts = read(markup.encode())
    assert not docs and [(s.reason, s.detail) for s in skips] == [("unsupported_format", MARKUP_DETAIL)]
    assert not any(name.startswith("files_") for name in counts)  # not counted as read in some format


def test_markup_is_read_as_a_book_when_asked_and_a_wiki_export_with_a_prolog_is_still_a_dump():
    docs, skips, _ = read(RSS.encode(), fmt="text")
    assert len(docs) == 1 and not skips and "<item>" in " ".join(docs[0].segments)
    docs, skips, counts = read(WIKI.encode())
    assert [d.doc_id for d in docs] == ["f.txt#1", "f.txt#2"] and not skips and counts["files_wiki_xml"] == 1


@pytest.mark.parametrize("start", ["<i>Preface</i>\n\n", "<3 from the author.\n\n", "< a remark >\n\n", ""])
def test_prose_that_opens_with_or_mentions_a_tag_is_still_a_book(start):
    book = start + PROSE + "\n\nWrite <html> and </html> around a page, and <br/> for a break.\n\n" + PROSE + "\n"
    docs, skips, counts = read(book.encode())
    assert len(docs) == 1 and not skips and counts["files_text"] == 1


def test_the_bundled_books_and_dump_read_as_before(data_dir):
    for book in sorted((data_dir / "books").glob("*.txt")):
        docs, skips, counts = read(book.read_bytes(), source=str(book))
        assert len(docs) == 1 and not skips and counts["files_text"] == 1, book
    dump = next((data_dir / "wiki").glob("*.bz2"))
    docs, _, counts = read(dump.read_bytes(), source=str(dump))
    assert docs and counts["files_wiki_xml"] == 1


@pytest.mark.parametrize("blank", [b"\n" * CHUNK, b" \r\n" * CHUNK, b"\n" * (3 * CHUNK + 5)])
def test_a_book_after_a_blank_run_longer_than_a_read_is_read_not_skipped_as_empty(blank):
    # 1 MiB of "\n" before a 300 kB book: "skipped_empty_file 1", the book lost.
    alone, _, _ = read(BOOK.encode())
    for data in (blank + BOOK.encode(), gzip.compress(blank + BOOK.encode())):
        docs, skips, counts = read(data)
        assert not skips and [d.segments for d in docs] == [alone[0].segments] and counts["files_text"] == 1


def test_the_format_is_sniffed_from_the_first_text_after_a_blank_run():
    # The text began near the end of the first 1 MiB read: sniffed from blanks, JSON Lines became a book of JSON.
    blank = b"\n" * (CHUNK - 100)
    lines = "".join(json.dumps({"text": f"{PROSE} Record {i}."}) + "\n" for i in range(50)).encode()
    docs, skips, counts = read(blank + lines)
    # ids still count the file's lines: the blank run's line breaks are kept, not its bytes
    assert not skips and counts["files_jsonl"] == 1
    assert [d.doc_id for d in docs] == [f"f.txt:{len(blank) + 1 + i}" for i in range(50)]
    docs, skips, _ = read(blank + RSS.encode())
    assert not docs and [s.reason for s in skips] == ["unsupported_format"]


def test_a_file_of_blanks_only_is_still_empty():
    for data in (b"", b"\xef\xbb\xbf", b"\n" * (2 * CHUNK + 3), b" \t\r\n" * CHUNK):
        docs, skips, _ = read(data)
        assert not docs and [s.reason for s in skips] == ["empty_file"]


class _Blanks:
    """A file of `size` spaces, then `tail`, produced as it is read: none of it held by the test."""

    def __init__(self, size: int, tail: bytes):
        self.left, self.tail = size, tail

    def read(self, n: int) -> bytes:
        if self.left:
            n = min(n, self.left)
            self.left -= n
            return b" " * n
        out, self.tail = self.tail[:n], self.tail[n:]
        return out


def test_a_long_blank_run_is_not_held_while_looking_for_the_text():
    tracemalloc.start()
    try:
        docs, skips, _ = _records(_Blanks(64 * CHUNK, (PROSE + "\n\n" + PROSE + "\n").encode()))
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert len(docs) == 1 and not skips
    assert peak < 8 * CHUNK, f"held {peak} bytes reading 64 MiB of blanks"


def test_the_cli_counts_markup_and_reads_the_book_after_a_blank_run(tmp_path, data_dir):
    inputs = tmp_path / "in"
    inputs.mkdir()
    (inputs / "rss.xml").write_text(RSS)
    (inputs / "page.html").write_text(HTML)
    (inputs / "late_book.txt").write_bytes(b"\n" * CHUNK + (data_dir / "books" / "persuasion.txt").read_bytes()[:300_000])
    out = tmp_path / "out"
    assert cli.main(["corpus", "--input", str(inputs), "--vocab", str(data_dir / "vocab" / "bert-base-uncased-vocab.txt"),
                     "--out", str(out), "--seq-len", "64", "--dupe-factor", "1", "--heldout-fraction", "0"]) == 0
    counters = read_manifest(out)["counters"]
    assert counters["skipped_unsupported_format"] == 2 and "skipped_empty_file" not in counters
    assert counters["documents_read"] == 1 and counters["files_text"] == 1
    dead = [json.loads(line) for p in (out / "dead_letter").glob("*.jsonl") for line in p.read_text().splitlines()]
    assert sorted((d["record_id"].rsplit("/", 1)[-1], d["reason"]) for d in dead) == [
        ("page.html", "unsupported_format"), ("rss.xml", "unsupported_format")]
