"""Readers on real and deliberately broken input: formats, compression, skips by reason."""

from __future__ import annotations

import bz2
import gzip
import io
import json
import logging
import lzma
import os
import random
import re
import subprocess
import sys

import pytest

from pipeline.readers import RawDocument, ReadStats, Skip, read_file, sniff_format
from pipeline.sources import expand_inputs
from pipeline.wikitext import wikitext_to_paragraphs
from repo_paths import REPO

MAX = 16_000_000


def read(data: bytes, fmt: str = "auto", source: str = "mem/f.txt", max_bytes: int = MAX):
    stats = ReadStats()
    records = list(read_file(io.BytesIO(data), source, fmt, max_bytes, stats))
    docs = [r for r in records if isinstance(r, RawDocument)]
    skips = [r for r in records if isinstance(r, Skip)]
    return docs, skips, stats.counts


PAGE = """<page><title>{title}</title><ns>{ns}</ns><id>{id}</id>{redirect}<revision><id>1</id>
<text xml:space="preserve">{text}</text></revision></page>
"""


def wiki(*pages: str) -> bytes:
    return ("<mediawiki xmlns=\"http://www.mediawiki.org/xml/export-0.10/\">\n" + "".join(pages) + "</mediawiki>\n").encode()


def page(id_: int, text: str, ns: int = 0, redirect: bool = False) -> str:
    return PAGE.format(title=f"T{id_}", ns=ns, id=id_, redirect='<redirect title="X" />' if redirect else "", text=text)


PROSE = "The quick brown fox jumps over the lazy dog. It was a very sunny day in the valley."


def test_real_wiki_dump_articles_only(data_dir):
    path = data_dir / "wiki" / "enwiki-latest-pages-articles1.xml-p000000010p000030302-shortened.bz2"
    with open(path, "rb") as f:
        records = list(read_file(f, str(path), "auto", MAX, ReadStats()))
    docs = [r for r in records if isinstance(r, RawDocument)]
    reasons = [r.reason for r in records if isinstance(r, Skip)]
    assert len(docs) == 106 and reasons.count("wiki_redirect") == 100
    text = "\n".join(docs[0].segments)
    assert docs[0].doc_id.endswith("#12") and text.startswith("Anarchism is a political philosophy")
    # No templates, tables, references or category links survive.
    for doc in docs:
        joined = "\n".join(doc.segments)
        for markup in ("{{", "}}", "{|", "<ref", "[[Category:", "Category:", "[[File:", "thumb|"):
            assert markup not in joined, (doc.doc_id, markup)


def test_wikitext_markup_removed():
    text = ("{{Infobox person|name=X}}'''Ada''' was a [[mathematician|maths person]].<ref>cite</ref> "
            "She wrote notes on the [[Analytical Engine]] in 1843.\n{| class=wikitable\n|a||b\n|}\n"
            "[[Category:Mathematicians]]\n== References ==\nSome reference text that is long enough.")
    assert wikitext_to_paragraphs(text) == [
        "Ada was a maths person. She wrote notes on the Analytical Engine in 1843."
    ]


def test_unclosed_tags_and_comments_keep_their_text_and_parse_in_linear_time():
    # The parser searched the rest of the page for each unclosed tag's closing tag (and the comment
    # regex for each `<!--`'s end): 2,000 of one kind in a 300 KB page took 5-20 s, and a page's time
    # grew with its square. Their text stays, as it did; the closed ones still go.
    import time

    prose = "The quick brown fox jumps over the lazy dog near the river bank."
    page = "\n".join(f"{prose} {tag}" for _ in range(2000) for tag in ("<ref name=x>", "<div>", "<!--", "<span>"))
    start = time.perf_counter()
    assert wikitext_to_paragraphs(page) == [prose] * 8000
    assert time.perf_counter() - start < 10
    assert wikitext_to_paragraphs(
        "A first <!-- hidden --> line <b><b>that is</b> long enough.\n<div>Dropped division text here.</div>\n"
        "A second <ref>note</ref>line <!-- unclosed, so kept as it was, long enough.\n<br>"
    ) == ["A first line that is long enough.", "A second line unclosed, so kept as it was, long enough."]


@pytest.mark.parametrize("broken", ["{{a|b ", "[[a|b ", "[[File:x.jpg|thumb|[[a]] ", "[http://example.com/a b ", "{|\n| a\n"])
def test_a_page_of_thousands_of_unclosed_spans_is_a_counted_skip_not_minutes_of_parsing(broken):
    # The parser searched the rest of the page for each one's end: 4,000 `{{a|b` in 24 KB took 15 s, and a
    # larger page's time grew with the square of their number. Real articles hold a handful at most.
    import time

    spans = [page(1, PROSE + " " + broken * 4000), page(2, (PROSE + "\n") + (broken + PROSE + "\n") * 150)]
    start = time.perf_counter()
    docs, skips, _ = read(wiki(*spans))
    assert time.perf_counter() - start < 30
    assert [(s.record_id, s.reason) for s in skips] == [("f.txt#1", "wikitext_parse_error")]
    assert "4,000 unclosed '{{', '[[', '{|' or '[http' spans, over 200" in skips[0].detail
    assert [d.doc_id for d in docs] == ["f.txt#2"]  # 150 of them: parsed as before


def test_redirects_namespaces_and_malformed_pages_are_counted():
    data = wiki(
        page(1, PROSE),
        page(2, "#REDIRECT [[Foo]]", redirect=True),
        page(3, PROSE, ns=10),
        "<page><title>Broken</title><ns>0</ns><id>4</id><revision><text>unclosed <b></text></page>\n",
        page(5, "{{stub}}"),
        page(6, PROSE + " Second & last."),  # a bare '&' is malformed XML
        page(7, PROSE),
    )
    docs, skips, _ = read(data)
    assert [d.doc_id for d in docs] == ["f.txt#1", "f.txt#7"]
    assert {(s.record_id, s.reason) for s in skips} == {
        ("f.txt#2", "wiki_redirect"), ("f.txt#3", "wiki_non_article_namespace"), ("f.txt#4", "malformed_xml"),
        ("f.txt#5", "empty_document"), ("f.txt#6", "malformed_xml"),
    }


def test_the_beam_reader_counts_redirects_but_dead_letters_only_real_problems(tmp_path):
    # A dump is half redirects: dead-lettering them would bury the malformed pages among millions of rows.
    import apache_beam as beam

    from pipeline.sources import DEAD_LETTER, _ReadFileFn

    path = tmp_path / "w.xml"
    path.write_bytes(wiki(page(1, "#REDIRECT [[Foo]]", redirect=True), page(2, PROSE), page(3, PROSE, ns=10),
                          page(4, "{{stub}}")))
    out = list(_ReadFileFn("auto", MAX).process(str(path)))
    dead = [o for o in out if isinstance(o, beam.pvalue.TaggedOutput)]
    assert [d.tag for d in dead] == [DEAD_LETTER] and [d.value.reason for d in dead] == ["empty_document"]
    assert [o.doc_id for o in out if isinstance(o, RawDocument)] == ["w.xml#2"]


def test_multistream_bz2_and_gzip_read_fully():
    pages = [page(i, PROSE) for i in range(1, 7)]
    # Wikipedia's multistream dumps: one bz2 stream per block of pages, concatenated.
    multi = b"".join(bz2.compress(wiki(*pages[i : i + 2]).decode().encode()) for i in range(0, 6, 2))
    docs, skips, _ = read(multi)
    assert [d.doc_id for d in docs] == [f"f.txt#{i}" for i in range(1, 7)] and not skips
    gz = gzip.compress(b"one.\n\n") + gzip.compress(("\n".join([PROSE] * 3) + "\n").encode())
    docs, skips, _ = read(gz, fmt="lines")
    assert len(docs) == 2 and not skips


@pytest.mark.parametrize("compress,split", [(gzip.compress, 1), (bz2.compress, 1), (bz2.compress, 2),
                                            (lzma.compress, 3)], ids=["gzip-1", "bz2-1", "bz2-2", "xz-3"])
def test_a_read_ending_inside_the_next_members_magic_bytes_loses_nothing(compress, split, monkeypatch):
    # gzip -t passed the file; when a 1 MiB raw read ended `split` bytes into the next member (b"\x1f" of
    # gzip's b"\x1f\x8b", b"B" or b"BZ" of bz2's b"BZh"), those bytes were called trailing garbage and
    # every document after them was lost (9,800 of 30,000). A read ends there here after 1 kB or so.
    from pipeline import decompress

    originals = _lines_docs(30)
    members = [compress(("\n".join(d) + "\n\n").encode()) for d in originals]
    monkeypatch.setattr(decompress, "CHUNK", len(members[0]) + split)
    docs, skips, _ = read(b"".join(members), fmt="lines")
    assert not skips and [d.segments for d in docs] == originals
    # The same bytes at the very end of the file are a fragment, not a member: counted, the text all kept.
    docs, skips, _ = read(b"".join(members) + members[0][:split], fmt="lines")
    assert [d.segments for d in docs] == originals and [s.reason for s in skips] == ["corrupt_compression"]
    assert "ignored, the text before them is complete" in skips[0].detail


def test_truncated_and_corrupt_compression_keep_complete_documents():
    pages = [page(i, f"{PROSE} Page {i}. " * 30) for i in range(1, 200)]
    data = bz2.compress(wiki(*pages), compresslevel=1)  # 100 kB blocks: several in this file
    docs, skips, _ = read(data[: len(data) * 2 // 3])
    assert 0 < len(docs) < 199 and [s.reason for s in skips] == ["corrupt_compression"]
    assert [d.doc_id for d in docs] == [f"f.txt#{i}" for i in range(1, len(docs) + 1)]
    # A corrupt gzip member after a good one.
    gz = gzip.compress(("\n".join([PROSE] * 3) + "\n\n").encode()) + b"\x1f\x8b\x08\x00garbage-bytes"
    docs, skips, _ = read(gz, fmt="lines")
    assert [s.reason for s in skips] == ["corrupt_compression"]
    truncated = gzip.compress(" ".join(str(i * 7919) for i in range(100000)).encode())[:5000]
    docs, skips, _ = read(truncated, fmt="text")
    assert not docs and [s.reason for s in skips] == ["corrupt_compression"]


def test_zero_padding_and_trailing_bytes_after_the_last_member_keep_every_document():
    # gzip -t and xz -t pass these files; the reader started a decoder on the padding and lost the text
    # decoded before it (the last 4 MiB) as corrupt_compression.
    text = "\n\n".join(f"{PROSE} Paragraph {i}." for i in range(50)).encode()
    for packed, paragraphs in [(gzip.compress(text) + bytes(512), 50), (lzma.compress(text) + bytes(4), 50),
                               (gzip.compress(text + b"\n\n") + bytes(100) + gzip.compress(text), 100)]:
        docs, skips, _ = read(packed, fmt="text")
        assert not skips and len(docs[0].segments) == paragraphs
    # Bytes that are not a member: counted, and every paragraph of the complete member kept.
    docs, skips, _ = read(gzip.compress(text) + b"garbage\n", fmt="text")
    assert len(docs[0].segments) == 50 and [s.reason for s in skips] == ["corrupt_compression"]
    assert "ignored, the text before them is complete" in skips[0].detail


def test_a_compressed_book_cut_short_keeps_its_paragraphs_but_the_last():
    rng = random.Random(0)
    text = "\n\n".join(f"{PROSE} {rng.getrandbits(64)} Paragraph {i}." for i in range(2000)).encode()
    docs, skips, _ = read(gzip.compress(text)[:20_000], fmt="text")
    (doc,) = docs
    assert 100 < len(doc.segments) < 2000 and doc.segments[0].startswith(PROSE)
    assert all(p.endswith(f"Paragraph {i}.") for i, p in enumerate(doc.segments))  # none cut mid-way
    assert [s.reason for s in skips] == ["corrupt_compression"]


def test_invalid_utf8_is_repaired_not_dropped():
    docs, skips, counts = read(PROSE.encode() + b" caf\xe9 \xff\xfe end.\n\n" + PROSE.encode(), fmt="text")
    assert len(docs) == 1 and not skips and counts["documents_invalid_utf8_repaired"] == 1
    assert "\ufffd" in docs[0].segments[0]


def test_a_wiki_page_with_an_invalid_byte_is_repaired_not_dropped():
    # The XML parser took the raw bytes and dropped the page as malformed_xml ("not well-formed").
    dump = wiki(page(1, PROSE), page(2, PROSE.replace("lazy", "la\x00zy")), page(3, PROSE))
    docs, skips, counts = read(dump.replace(b"la\x00zy", b"la\xe9zy"))
    assert [d.doc_id.split("#")[1] for d in docs] == ["1", "2", "3"] and not skips
    assert counts["documents_invalid_utf8_repaired"] == 1 and "la\ufffdzy" in docs[1].segments[0]


def test_a_lone_surrogate_entity_in_a_wiki_page_is_repaired_not_fatal():
    # mwparserfromhell decodes `&#55357;` (half an emoji) to a lone surrogate, which stopped the job at the tokenizer.
    docs, skips, counts = read(wiki(page(1, PROSE + " &amp;#55357; " + PROSE), page(2, PROSE)))
    assert len(docs) == 2 and not skips and counts["documents_invalid_utf8_repaired"] == 1
    assert "\ufffd" in docs[0].segments[0]
    "".join(docs[0].segments).encode("utf-8")


def test_a_lone_surrogate_escape_in_json_lines_is_repaired_not_fatal():
    # "\ud83d" (half an emoji) decodes to a lone surrogate, which stopped the whole job at the tokenizer's encode.
    lines = [json.dumps({"id": 1, "text": PROSE}), '{"id": "x\\ud83d", "text": "A cut \\ud83d emoji. ' + PROSE + '"}']
    docs, skips, counts = read("\n".join(lines).encode(), fmt="jsonl")
    assert len(docs) == 2 and not skips and counts["documents_invalid_utf8_repaired"] == 1
    assert docs[1].doc_id.endswith(":x\ufffd") and docs[1].segments[0].startswith("A cut \ufffd emoji.")
    for doc in docs:
        "".join([doc.doc_id, *doc.segments]).encode("utf-8")  # what the tokenizer and the Arrow writer do


def test_a_compressed_book_over_the_cap_and_cut_short_is_skipped_as_too_large_not_read_in_part():
    text = "\n\n".join(f"{PROSE} Paragraph {i}." for i in range(20000)).encode()
    packed = gzip.compress(text)
    _, skips, _ = read(packed, fmt="text", max_bytes=len(text) // 2)
    assert [s.reason for s in skips] == ["document_too_large"]
    docs, skips, _ = read(packed[:-2000], fmt="text", max_bytes=len(text) // 2)
    assert docs == [] and [s.reason for s in skips] == ["document_too_large", "corrupt_compression"]


def test_nul_heavy_binaries_are_not_called_utf16():
    _, skips, _ = read(bytes(8192))
    assert skips[0].detail == "NUL bytes in its first 8 KiB"
    _, skips, _ = read(b"ustar\x00" + bytes(500) + b"a tarball header with some text" + bytes(3000))
    assert skips[0].detail == "NUL bytes in its first 8 KiB"


def test_utf16_text_is_skipped_with_how_to_convert_it():
    for encoding in ("utf-16", "utf-16-le", "utf-16-be"):
        _, skips, _ = read((PROSE + "\n\n") .encode(encoding) * 50)
        assert [s.reason for s in skips] == ["binary_file"], encoding
        assert "UTF-16" in skips[0].detail and "iconv -f utf-16 -t utf-8" in skips[0].detail


def test_binary_and_empty_files_are_skipped():
    _, skips, _ = read(bytes(range(256)) * 40)
    assert [s.reason for s in skips] == ["binary_file"] and skips[0].detail == "NUL bytes in its first 8 KiB"
    # French in Latin-1: mostly undecodable as UTF-8, skipped, and the detail says how to convert it
    _, skips, _ = read(("\u00e9t\u00e9 \u00e0 " * 800).encode("latin-1"))
    assert [s.reason for s in skips] == ["binary_file"] and "iconv -f latin1 -t utf-8" in skips[0].detail
    _, skips, _ = read(b"\n\n  \n")
    assert [s.reason for s in skips] == ["empty_file"]


def test_xz_reads_fully_and_other_archives_are_named_not_called_binary():
    pages = [page(i, PROSE) for i in range(1, 7)]
    multi = b"".join(lzma.compress(wiki(*pages[i : i + 3])) for i in (0, 3))  # `cat a.xz b.xz`
    docs, skips, _ = read(multi)
    assert [d.doc_id for d in docs] == [f"f.txt#{i}" for i in range(1, 7)] and not skips
    docs, skips, _ = read(multi[:-40])
    assert [s.reason for s in skips] == ["corrupt_compression"]
    for magic, name in ((b"\x28\xb5\x2f\xfd", "zstd"), (b"PK\x03\x04", "zip"), (b"7z\xbc\xaf\x27\x1c", "7z"),
                        (b"\x04\x22\x4d\x18", "lz4")):
        _, skips, _ = read(magic + bytes(range(256)) * 8)
        assert [(s.reason, s.detail.split(":")[0]) for s in skips] == [("unsupported_compression", name)]


def test_a_record_over_the_cap_is_skipped_even_inside_one_read_chunk():
    # --max-document-bytes was checked only when a record spanned a 1 MiB read: smaller ones passed.
    big = " ".join([PROSE] * 100)  # 8.4 kB
    jsonl = "\n".join(json.dumps({"id": i, "text": t}) for i, t in enumerate([PROSE, big, PROSE])) + "\n"
    docs, skips, _ = read(jsonl.encode(), fmt="jsonl", max_bytes=2000)
    assert [d.doc_id for d in docs] == ["f.txt:0", "f.txt:2"]
    assert [(s.record_id, s.reason) for s in skips] == [("f.txt:2", "document_too_large")]
    docs, skips, _ = read(wiki(page(1, PROSE), page(2, big), page(3, PROSE)), max_bytes=2000)
    assert [d.doc_id for d in docs] == ["f.txt#1", "f.txt#3"]
    assert [s.reason for s in skips] == ["document_too_large"]


def test_a_file_with_nothing_in_the_forced_format_is_counted():
    # A book under --format wiki-xml yielded no document and no skip: it vanished from the counts.
    for fmt in ("wiki-xml", "wikiextractor"):
        docs, skips, _ = read(("\n\n".join([PROSE] * 5)).encode(), fmt=fmt)
        assert not docs and [(s.reason, s.detail) for s in skips] == [
            ("no_document_in_format", f"nothing in it reads as {fmt} (--format)")]


def test_huge_single_line_document_is_skipped_without_losing_others():
    huge = b"word " * (10_000_000 // 5)  # a 10 MB line, no newline inside
    data = PROSE.encode() + b"\n\n" + huge + b"\n\n" + PROSE.encode() + b"\nEnd here.\n"
    docs, skips, _ = read(data, fmt="lines", max_bytes=1_000_000)
    assert [d.doc_id for d in docs] == ["f.txt:0", "f.txt:2"]
    assert [(s.record_id, s.reason) for s in skips] == [("f.txt:1", "document_too_large")]
    docs, skips, _ = read(huge, fmt="text", max_bytes=1_000_000)
    assert not docs and skips[0].reason == "document_too_large"


def test_jsonl_and_sentence_lines():
    lines = [json.dumps({"id": "a", "text": PROSE + "\n" + PROSE}), "{broken", json.dumps({"title": "no text"}),
             json.dumps({"text": "   "}), json.dumps({"text": PROSE})]
    docs, skips, _ = read("\n".join(lines).encode() + b"\n")
    assert [d.doc_id for d in docs] == ["f.txt:a", "f.txt:5"] and len(docs[0].segments) == 2
    assert [s.reason for s in skips] == ["malformed_json", "json_without_text", "empty_document"]
    # Pathologically nested JSON is one malformed record, not a crash of the job.
    nested = '{"text": "x", "a": ' + "[" * 100_000 + "]" * 100_000 + "}"
    docs, skips, _ = read((lines[0] + "\n" + nested + "\n").encode(), fmt="jsonl")
    assert [d.doc_id for d in docs] == ["f.txt:a"] and [s.reason for s in skips] == ["malformed_json"]
    # A whole book per line (an HF books export): the first record is longer than the sniffed sample.
    book_lines = [json.dumps({"id": i, "text": "\n".join([PROSE] * 2000)}) for i in (1, 2)]
    docs, skips, _ = read("\n".join(book_lines).encode() + b"\n")
    assert [d.doc_id for d in docs] == ["f.txt:1", "f.txt:2"] and len(docs[0].segments) == 2000 and not skips
    original = "First sentence here.\nSecond one.\nThird one!\n\nOther doc first.\nOther doc second.\n"
    assert sniff_format(original.encode() * 3) == "lines"
    docs, _, _ = read(original.encode())
    assert docs[0].presplit and docs[0].segments == ["First sentence here.", "Second one.", "Third one!"]


def test_an_id_that_many_records_of_a_file_share_does_not_make_them_one_document_id():
    # `"id": "enwiki"` in every record made 300 documents one id: one NSP bucket (one worker's memory) and one
    # split, so no held-out set. The first keeps the id; the others add their line.
    lines = [json.dumps({"id": "enwiki", "text": f"{PROSE} Record {i}."}) for i in range(300)]
    docs, skips, counts = read("\n".join(lines).encode() + b"\n", fmt="jsonl")
    ids = [d.doc_id for d in docs]
    assert ids[:3] == ["f.txt:enwiki", "f.txt:enwiki@2", "f.txt:enwiki@3"] and len(set(ids)) == 300 and not skips
    assert counts["jsonl_ids_repeated"] == 299
    from pipeline.nsp import heldout_score

    assert sum(heldout_score(1, i) < 0.05 for i in ids) > 0  # some of them can now be held out


def test_a_json_array_is_a_counted_skip_that_says_to_write_json_lines():
    # Read as prose, its records became instances of "} , { " id " : 23 , " text " :" with an info line only.
    records = json.dumps([{"id": i, "text": PROSE} for i in range(3)], indent=1).encode()
    docs, skips, _ = read(records)
    assert not docs and [(s.reason, s.detail.split(":")[0]) for s in skips] == [("json_array", "a JSON array of records")]
    docs, _, _ = read(b"[1] A citation opens this line. " + PROSE.encode())  # prose that starts with a bracket
    assert docs


def test_book_paragraphs_and_gutenberg_header(data_dir):
    path = data_dir / "books" / "persuasion.txt"
    docs, skips, counts = read(path.read_bytes(), source=str(path))
    assert counts == {"files_text": 1} and not skips
    (doc,) = docs
    assert doc.doc_id == "persuasion.txt" and not doc.presplit
    # Hard-wrapped lines are joined into paragraphs.
    assert any(p.startswith("Sir Walter Elliot, of Kellynch Hall, in Somersetshire, was a man who, for his own") for p in doc.segments)
    wrapped = b"*** START OF THE PROJECT GUTENBERG EBOOK X ***\n" + PROSE.encode() + b"\n*** END OF THE PROJECT GUTENBERG EBOOK X ***\nLicence text."
    docs, _, _ = read(wrapped, fmt="text")
    assert docs[0].segments == [PROSE]


def test_gutenberg_markers_of_both_eras_and_any_case_cut_the_licence():
    # Older books say "START OF THIS PROJECT GUTENBERG EBOOK"; the licence preamble before it is not the book.
    this = (b"Header licence blah, not part of the book.\n\n*** START OF THIS PROJECT GUTENBERG EBOOK X ***\n\n"
            + PROSE.encode() + b"\n\n*** END OF THIS PROJECT GUTENBERG EBOOK X ***\n\nLicence text.")
    docs, _, _ = read(this, fmt="text")
    assert docs[0].segments == [PROSE]
    # Some footers are in mixed case ("End of the Project Gutenberg EBook"): the licence after it still goes.
    mixed = PROSE.encode() + b"\n\n*** End of the Project Gutenberg EBook of X ***\n\nLicence text."
    docs, _, _ = read(mixed, fmt="text")
    assert docs[0].segments == [PROSE]


def test_expand_inputs_directory_recursive(tmp_path, data_dir):
    (tmp_path / "wiki").mkdir()
    (tmp_path / "wiki" / "part1.bz2").write_bytes(b"x")
    (tmp_path / "books" / "deep").mkdir(parents=True)
    (tmp_path / "books" / "deep" / "a.txt").write_text("a")
    for ignored in ("download.json", "b.txt.part", "c.partial", "sums.sha1", "x.md5", ".hidden.txt",
                    "enwiki-20260101-sha1sums.txt", "enwiki-20260101-pages-articles-multistream-index.txt.bz2",
                    "b.txt.123.partial", "x.bz2.part.json"):
        (tmp_path / "books" / ignored).write_text("ignored")
    files = expand_inputs([str(tmp_path), str(data_dir / "books" / "*.txt")])
    assert files == sorted(files)
    mine = [os.path.relpath(f, tmp_path) for f in files if f.startswith(str(tmp_path))]
    assert mine == ["books/deep/a.txt", "wiki/part1.bz2"]
    assert sorted(os.path.basename(f) for f in files if not f.startswith(str(tmp_path))) == [
        "northangerabbey.txt", "persuasion.txt"]
    with pytest.raises(ValueError, match="matches no file"):
        expand_inputs([str(tmp_path / "missing.txt")])
    (tmp_path / "empty").mkdir()
    with pytest.raises(ValueError, match="holds no input files"):
        expand_inputs([str(tmp_path / "empty")])


def test_a_file_name_that_is_not_utf8_is_named_with_a_fix(tmp_path):
    # It stopped the whole job with "'utf-8' codec can't encode character '\\udce9' ...", naming no file.
    os.mkdir(os.fsencode(tmp_path / "books"))
    with open(os.fsencode(tmp_path / "books") + b"/caf\xe9.txt", "wb") as f:
        f.write(PROSE.encode())
    with pytest.raises(ValueError, match=r"input file .*books/caf\\xe9.txt has a name that is not UTF-8 .*rename it"):
        expand_inputs([str(tmp_path / "books")])


def test_a_checksum_list_in_a_folder_is_not_read_as_text(tmp_path):
    # `sha256sum * > sha256sums.txt` next to the books: its hex lines would become "sentences".
    (tmp_path / "a.txt").write_text(PROSE)
    (tmp_path / "sha256sums.txt").write_text("0" * 64 + "  a.txt\n")
    assert expand_inputs([str(tmp_path)]) == [str(tmp_path / "a.txt")]


def test_an_unreadable_input_is_refused_before_the_job_starts(tmp_path, monkeypatch):
    # The tests run as root, who can read a chmod 000 file: os.access stands in for a file the user cannot read.
    (tmp_path / "a.txt").write_text(PROSE)
    monkeypatch.setattr(os, "access", lambda path, mode: False)
    with pytest.raises(ValueError, match="is not readable"):
        expand_inputs([str(tmp_path / "a.txt")])


def test_a_directory_walk_skips_what_bertpipe_wrote_and_what_is_not_a_file_and_follows_links(tmp_path, caplog):
    # A sibling corpus's vocab.txt was read as a book; a named pipe hung the job; a symlinked folder of books
    # was skipped without a word.
    text = tmp_path / "text"
    (text / "sub").mkdir(parents=True)
    (text / "a.txt").write_text("a")
    corpus = text / "corpus1"
    corpus.mkdir()
    (corpus / "manifest.json").write_text('{"format": "bertpipe-corpus", "format_version": 1}')
    (corpus / "vocab.txt").write_text("[PAD]")
    for i, marker in enumerate((".bertpipe-run", ".bertpipe-finetune", "bertpipe_export.json")):
        (text / f"out{i}").mkdir()
        (text / f"out{i}" / marker).write_text("{}")
        (text / f"out{i}" / "config.yaml").write_text("x: 1")
    (text / "notes").mkdir()
    (text / "notes" / "manifest.json").write_text('{"theirs": true}')  # someone else's manifest: the folder is read
    (text / "notes" / "n.txt").write_text("n")
    books = tmp_path / "books"
    (books / ".bertpipe-partial").mkdir(parents=True)  # `download books` cut short: its finished books are read
    (books / ".bertpipe-partial" / "2.txt.part").write_text("half a book")
    (books / "b.txt").write_text("b")
    (text / "linked").symlink_to(books)
    (text / "sub" / "loop").symlink_to(text)  # a cycle: followed once
    os.mkfifo(text / "pipe")
    with caplog.at_level(logging.INFO, logger="pipeline.sources"):
        files = expand_inputs([str(text)])
    assert [os.path.relpath(f, text) for f in files] == ["a.txt", "linked/b.txt", "notes/n.txt"]
    assert "not reading 4 folder(s)" in caplog.text and f"not reading 1 entr(ies) under {text}" in caplog.text
    assert [os.path.relpath(f, books) for f in expand_inputs([str(books)])] == ["b.txt"]
    with pytest.raises(ValueError, match="is not a regular file"):
        expand_inputs([str(text / "pipe")])
    with pytest.raises(ValueError, match="matches no file"):  # a glob's pipe is left out, not read
        expand_inputs([str(text / "p*")])


def test_uncompressed_dump_cut_inside_a_page_is_counted_not_dropped_silently():
    data = wiki(page(1, PROSE), page(2, PROSE))
    docs, skips, _ = read(data[: data.rindex(b"</page>") - 10])
    assert [d.doc_id for d in docs] == ["f.txt#1"]
    assert [(s.record_id, s.reason) for s in skips] == [("f.txt#2", "malformed_xml")]


def test_many_short_lines_read_in_linear_time():
    # Slicing the buffer after every line made this quadratic in lines per 1 MiB chunk (~25 s here).
    import time

    data = b"One short sentence per line, as the original script's layout has it.\n" * 300_000
    start = time.perf_counter()
    docs, skips, _ = read(data, fmt="lines", max_bytes=len(data) + 1)
    assert len(docs) == 1 and len(docs[0].segments) == 300_000 and not skips
    assert time.perf_counter() - start < 10


def _lines_docs(n: int) -> list[list[str]]:
    rng = random.Random(0)
    words = "the of and a to in is was for on that with as by at from his her it an are were which".split()
    return [[" ".join(rng.choice(words) for _ in range(15)).capitalize() + "." for _ in range(20)] for _ in range(n)]


@pytest.mark.parametrize("compress", [lambda b: bz2.compress(b, 1), gzip.compress, lzma.compress],
                         ids=["bz2", "gzip", "xz"])
def test_damage_near_the_end_keeps_the_documents_before_it_and_no_garbled_one(compress, monkeypatch):
    # 4.6 MB of text. Decoding a 1 MiB read in one call lost every document decoded in it when it
    # raised; and the decoders run on through garbled text before they notice (gzip: 64 zeroed
    # bytes gave 34 wrong documents), so the last HOLD bytes before the damage go with it (1 MiB
    # here, where the garbled run is shorter, for a small file; 4 MiB by default).
    from pipeline import decompress

    HOLD = 1 << 20
    monkeypatch.setattr(decompress, "HOLD", HOLD)
    originals = _lines_docs(4000)
    text = ("\n\n".join("\n".join(d) for d in originals) + "\n").encode()
    data = bytearray(compress(text))
    damage = len(data) * 9 // 10
    data[damage : damage + 64] = bytes(64)
    docs, skips, _ = read(bytes(data), fmt="lines")
    assert [(s.source, s.reason) for s in skips] == [("mem/f.txt", "corrupt_compression")]
    assert "bytes decoded before it were dropped" in skips[0].detail
    assert [d.doc_id for d in docs] == [f"f.txt:{i}" for i in range(len(docs))]
    assert [d.segments for d in docs] == originals[: len(docs)]  # every kept document is intact
    kept = sum(len("\n".join(d.segments)) + 2 for d in docs)
    assert kept > len(text) * 0.85 - HOLD - (1 << 20) > 1_000_000, (kept, len(text))


def test_a_small_first_gzip_member_does_not_decide_the_format():
    sentences = "".join(f"Sentence number {i} ends here.\n" + ("\n" if i % 5 == 4 else "") for i in range(50))
    for first in (b"\n\n", b"Short first file.\n\n"):  # `cat a.gz b.gz`
        docs, skips, counts = read(gzip.compress(first) + gzip.compress(sentences.encode()))
        assert counts == {"files_lines": 1} and not skips and len(docs) in (10, 11)


def test_a_byte_order_mark_is_not_read_as_text():
    bom = "\ufeff".encode()
    jsonl = bom + (json.dumps({"id": 1, "text": PROSE}) + "\n" + json.dumps({"id": 2, "text": PROSE}) + "\n").encode()
    docs, skips, _ = read(jsonl)
    assert [d.doc_id for d in docs] == ["f.txt:1", "f.txt:2"] and not skips
    docs, _, _ = read(bom + PROSE.encode(), fmt="text")
    assert docs[0].segments == [PROSE]


def _extracted(id_: int, title: str, *paragraphs: str) -> str:
    # What WikiExtractor writes without --json (its `Extractor.extract`).
    return (f'<doc id="{id_}" url="https://en.wikipedia.org/wiki?curid={id_}" title="{title}">\n{title}\n\n'
            + "\n".join(paragraphs) + "\n</doc>\n")


def test_wikiextractor_output_is_one_document_per_doc_block(caplog):
    data = (_extracted(12, "Anarchism", PROSE, "Second paragraph of the article. " + PROSE)
            + _extracted(25, "Ali: Fear Eats the Soul", PROSE) + _extracted(39, "Empty"))
    with caplog.at_level(logging.INFO, logger="pipeline.readers"):
        docs, skips, counts = read(data.encode())
    assert counts == {"files_wikiextractor": 1} and "reading mem/f.txt as wikiextractor (sniffed)" in caplog.text
    assert [(d.doc_id, len(d.segments)) for d in docs] == [("f.txt#12", 2), ("f.txt#25", 1)]
    assert docs[0].segments[0] == PROSE and not any("<doc" in s or "</doc>" in s for d in docs for s in d.segments)
    assert [(s.record_id, s.reason) for s in skips] == [("f.txt#39", "empty_document")]
    cut = _extracted(12, "Anarchism", PROSE) + _extracted(13, "Autism", PROSE)[:-10]
    docs, skips, _ = read(cut.encode())
    assert [d.doc_id for d in docs] == ["f.txt#12"] and [(s.record_id, s.reason) for s in skips] == [("f.txt#13", "malformed_doc")]


def test_a_link_whose_colon_is_followed_by_a_space_is_an_article_not_interwiki():
    text = ("Fassbinder's 1974 film [[Ali: Fear Eats the Soul]] won the FIPRESCI prize at Cannes.\n"
            "The city has a long history, told in many languages.[[de:Berlin]][[zh-yue:柏林]]")
    assert wikitext_to_paragraphs(text) == [
        "Fassbinder's 1974 film Ali: Fear Eats the Soul won the FIPRESCI prize at Cannes.",
        "The city has a long history, told in many languages.",
    ]


def test_a_file_named_explicitly_is_read_whatever_its_name(tmp_path):
    # `Dataset.to_json("train.json")` writes JSON Lines; a directory still skips *.json.
    (tmp_path / "train.json").write_text(json.dumps({"id": 1, "text": PROSE}) + "\n")
    (tmp_path / "book.txt").write_text(PROSE)
    assert expand_inputs([str(tmp_path / "train.json")]) == [str(tmp_path / "train.json")]
    assert expand_inputs([str(tmp_path)]) == [str(tmp_path / "book.txt")]
    with pytest.raises(ValueError, match=r"matches no file it does not ignore \(hidden, \*\.json"):
        expand_inputs([str(tmp_path / "*.json")])


def test_one_file_reached_by_two_spellings_is_read_once(tmp_path, monkeypatch, caplog):
    (tmp_path / "books").mkdir()
    (tmp_path / "books" / "a.txt").write_text(PROSE)
    (tmp_path / "books" / "b.txt").write_text(PROSE)
    os.symlink(tmp_path / "books" / "b.txt", tmp_path / "link.txt")
    monkeypatch.chdir(tmp_path)
    with caplog.at_level(logging.INFO, logger="pipeline.sources"):
        files = expand_inputs(["./books", "books/a.txt", "link.txt", "books/a.txt"])
    assert files == ["./books/a.txt", "./books/b.txt"] and "dropped 3 repeated input file(s)" in caplog.text
    # The spelling kept names the documents (their ids seed NSP and masking): not the first one given.
    assert expand_inputs(["link.txt", "books/a.txt", "./books"]) == files


def test_a_glob_takes_the_files_under_the_directories_it_matches(tmp_path):
    # `raw/*` over docs/download.md's layout: Beam's match returns files only, and the books went unread.
    (tmp_path / "raw" / "gutenberg").mkdir(parents=True)
    (tmp_path / "raw" / "enwiki-part1.xml.bz2").write_bytes(b"x")
    (tmp_path / "raw" / "gutenberg" / "persuasion.txt").write_text(PROSE)
    (tmp_path / "raw" / "gutenberg" / "download.json").write_text("{}")
    (tmp_path / "raw" / "empty").mkdir()
    assert [os.path.relpath(f, tmp_path) for f in expand_inputs([str(tmp_path / "raw" / "*")])] == [
        "raw/enwiki-part1.xml.bz2", "raw/gutenberg/persuasion.txt"]
    assert expand_inputs([str(tmp_path / "**" / "*.txt")]) == [str(tmp_path / "raw" / "gutenberg" / "persuasion.txt")]
    with pytest.raises(ValueError, match="matches no file it does not ignore"):
        expand_inputs([str(tmp_path / "raw" / "g*" / "*.json")])
    with pytest.raises(ValueError, match="matches no file it does not ignore"):
        expand_inputs([str(tmp_path / "**" / "*.json")])


def test_a_recursive_glob_over_symlinks_back_up_the_tree_ends(tmp_path):
    # glob.glob(recursive=True) follows every link: with `parent -> ..` and `current -> .` it walked about
    # 2^depth paths and the job hung before it started. In a child process, so that a regression fails.
    (tmp_path / "d" / "books").mkdir(parents=True)
    (tmp_path / "d" / "books" / "persuasion.txt").write_text(PROSE)
    (tmp_path / "d" / "books" / "parent").symlink_to("..")
    (tmp_path / "d" / "books" / "current").symlink_to(".")
    script = (f"from pipeline.sources import expand_inputs\nprint(expand_inputs([{str(tmp_path / 'd' / '**' / '*.txt')!r}]))")
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, cwd=REPO, timeout=60)
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.strip() == repr([str(tmp_path / "d" / "books" / "persuasion.txt")])


def test_prose_with_one_paragraph_per_line_is_not_taken_for_one_sentence_per_line(data_dir):
    """Both end most lines with a full stop; a paragraph line holds several sentences. Read as `lines`,
    each paragraph became a one-sentence document (every NSP pair random-next)."""
    import blingfire

    book = (data_dir / "books" / "persuasion.txt").read_text(encoding="utf-8")
    paragraphs = [" ".join(p.split()) for p in re.split(r"\n\s*\n", book) if p.strip()][60:160]
    assert sniff_format(("\n".join(paragraphs) + "\n").encode()) == "text"
    assert sniff_format(("\n\n".join(paragraphs) + "\n").encode()) == "text"
    # The same text one sentence per line, documents apart (google-research/bert's layout): lines
    sentences = ["\n".join(blingfire.text_to_sentences(p).split("\n")) for p in paragraphs]
    assert sniff_format(("\n\n".join(sentences) + "\n").encode()) == "lines"


@pytest.mark.parametrize("first", ['{"id": 0, "text": "cut off', "null", '"a string"', "42", "{broken"])
def test_a_jsonl_export_whose_first_line_is_bad_is_read_as_jsonl_with_that_line_counted(first, caplog):
    # The sniffer parsed the first line only: a bad one made the whole export one book of JSON syntax, silently.
    records = [json.dumps({"id": i, "text": f"{PROSE} Record {i}."}) for i in range(1, 40)]
    with caplog.at_level(logging.INFO, logger="pipeline.readers"):
        docs, skips, counts = read(("\n".join([first, *records]) + "\n").encode())
    assert "reading mem/f.txt as jsonl (sniffed)" in caplog.text and counts["files_jsonl"] == 1
    assert [d.doc_id for d in docs] == [f"f.txt:{i}" for i in range(1, 40)]
    assert [(s.record_id, s.reason) for s in skips] in ([("f.txt:1", "malformed_json")], [("f.txt:1", "json_without_text")])
    # A record longer than the sample after a bad first line: the cut-off last line still counts as one.
    book_line = json.dumps({"id": 1, "text": "\n".join([PROSE] * 2000)})
    docs, skips, _ = read(f"{first}\n{book_line}\n".encode())
    assert [d.doc_id for d in docs] == ["f.txt:1"] and len(skips) == 1


def test_a_jsonl_name_decides_and_one_json_line_does_not_make_a_book_jsonl(caplog, data_dir):
    # Mostly bad lines: still JSON Lines by its name, each bad line a counted skip, not a silent "book".
    data = ("{oops\n[1, 2]\nnot json\n" + json.dumps({"id": "a", "text": PROSE}) + "\n").encode()
    for name in ("dump/export.jsonl", "dump/EXPORT.NDJSON", "dump/export.jsonl.gz"):
        caplog.clear()
        with caplog.at_level(logging.INFO, logger="pipeline.readers"):
            docs, skips, _ = read(gzip.compress(data) if name.endswith(".gz") else data, source=name)
        assert f"reading {name} as jsonl (by its name)" in caplog.text
        assert [d.doc_id for d in docs] == [f"{name.rsplit('/', 1)[-1]}:a"] and len(skips) == 3
    # A book that opens with one JSON object is a book: most of its lines are prose.
    book = json.dumps({"title": "Persuasion"}) + "\n" + (data_dir / "books" / "persuasion.txt").read_text()[:30_000]
    assert sniff_format(book.encode()) == "text"


def test_a_doc_block_missing_its_end_tag_is_counted_and_does_not_swallow_the_next():
    # Article 2 (its tag line too) became part of article 1, with no skip counted.
    data = (_extracted(1, "Alpha", PROSE)[: -len("</doc>\n")] + _extracted(2, "Beta", "Second. " + PROSE)
            + _extracted(3, "Gamma", "Third. " + PROSE) + _extracted(4, "Delta", PROSE)[: -len("</doc>\n")]
            + _extracted(5, "Epsilon", PROSE)[: -len("</doc>\n")])
    docs, skips, counts = read(data.encode())
    assert [(d.doc_id, d.segments) for d in docs] == [("f.txt#2", ["Second. " + PROSE]), ("f.txt#3", ["Third. " + PROSE])]
    assert [(s.record_id, s.reason, s.detail) for s in skips] == [
        ("f.txt#1", "malformed_doc", "a new <doc> starts before this one's </doc>"),
        ("f.txt#4", "malformed_doc", "a new <doc> starts before this one's </doc>"),
        ("f.txt#5", "malformed_doc", "the file ends inside this <doc>")]
    assert counts == {"files_wikiextractor": 1}


def test_every_document_names_its_file_for_a_dead_letter_but_not_in_its_id():
    # A document that tokenizes to nothing was dead-lettered with `"source": ""`: its file could not be found.
    src = "/data/in/f.txt"
    inputs = {"wiki-xml": wiki(page(1, PROSE)), "text": PROSE.encode(), "lines": f"{PROSE}\n\n{PROSE}\n".encode(),
              "jsonl": (json.dumps({"id": 1, "text": PROSE}) + "\n").encode(), "wikiextractor": _extracted(1, "A", PROSE).encode()}
    for fmt, data in inputs.items():
        docs, _, _ = read(data, fmt=fmt, source=src)
        assert docs and all(d.source == src and "/data/in" not in d.doc_id for d in docs), fmt
