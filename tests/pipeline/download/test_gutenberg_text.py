"""Gutenberg header/footer stripping on real Gutenberg-formatted texts (the bundled Austen novels)."""

from __future__ import annotations

from pathlib import Path
from typing import Callable

import pytest

from pipeline.download.errors import FormatError
from pipeline.download.gutenberg_text import decode_gutenberg, strip_gutenberg

from repo_paths import DATA


@pytest.mark.parametrize("book_id,original", [(105, "persuasion.txt"), (121, "northangerabbey.txt")])
def test_strip_returns_exactly_the_book(book_id: int, original: str, gutenberg_file: Callable[[int], str]) -> None:
    wrapped = gutenberg_file(book_id)
    book = (DATA / "books" / original).read_text(encoding="utf-8")
    assert len(wrapped) > len(book) + 3000  # the header and licence really are there
    stripped = strip_gutenberg(wrapped)
    assert stripped.text == book
    assert stripped.start_marker.startswith("*** START OF TH")
    assert stripped.end_marker.startswith("*** END OF TH")
    assert "Gutenberg" not in stripped.text and "Produced by" not in stripped.text


def test_strip_handles_bom_and_crlf_bytes_as_served(gutenberg_file: Callable[[int], str]) -> None:
    raw = b"\xef\xbb\xbf" + gutenberg_file(105).replace("\n", "\r\n").encode("utf-8")
    book = (DATA / "books" / "persuasion.txt").read_text(encoding="utf-8")
    assert strip_gutenberg(decode_gutenberg(raw)).text == book


def test_book_text_that_mentions_project_gutenberg_is_kept() -> None:
    # Heuristic cleaners drop any line with "Project Gutenberg" near the ends; stripping at the
    # markers must keep the book's own lines, whatever they say.
    text = (
        "header\n*** START OF THE PROJECT GUTENBERG EBOOK X ***\n\nThe Project Gutenberg of my heart.\n"
        "Produced by nobody, this line is the book.\n\nEnd.\n*** END OF THE PROJECT GUTENBERG EBOOK X ***\nlicence\n"
    )
    assert strip_gutenberg(text).text == "The Project Gutenberg of my heart.\nProduced by nobody, this line is the book.\n\nEnd.\n"


def test_wrapped_start_marker_and_legacy_small_print_header() -> None:
    wrapped = "h\n*** START OF THE PROJECT GUTENBERG EBOOK A VERY LONG\nTITLE INDEED ***\nBody.\n*** END OF THE PROJECT GUTENBERG EBOOK A ***\n"
    assert strip_gutenberg(wrapped).text == "Body.\n"
    legacy = "small print...\n*END*THE SMALL PRINT! FOR PUBLIC DOMAIN ETEXTS*Ver.04.29.93*END*\n\nOld body.\n\nEnd of Project Gutenberg's Etext of Old\n"
    assert strip_gutenberg(legacy).text == "Old body.\n"


@pytest.mark.parametrize("text,reason", [
    ("no markers at all\n", "START"),
    ("*** START OF THE PROJECT GUTENBERG EBOOK X ***\nthe file was cut off here", "END"),
    ("*** START OF THE COPYRIGHTED PROJECT GUTENBERG EBOOK X ***\nbody\n*** END OF THE COPYRIGHTED ... ***\n", "copyrighted"),
    ("*** START OF THE PROJECT GUTENBERG EBOOK X ***\n\n\n*** END OF THE PROJECT GUTENBERG EBOOK X ***\n", "nothing between"),
])
def test_files_not_in_gutenberg_format_are_refused(text: str, reason: str) -> None:
    with pytest.raises(FormatError, match=reason):
        strip_gutenberg(text)


def test_decode_uses_the_declared_charset_when_not_utf8() -> None:
    raw = "Character set encoding: ISO-8859-1\n\n*** START OF THE PROJECT GUTENBERG EBOOK X ***\nCaf\xe9\n".encode("latin-1")
    assert decode_gutenberg(raw).endswith("Caf\xe9\n")
    with pytest.raises(FormatError, match="declares no"):
        decode_gutenberg(b"caf\xe9 without a declaration")
