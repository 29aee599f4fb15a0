"""The `text` reader on Project Gutenberg books: classic Mac line endings, several books in one file."""

from __future__ import annotations

import io

from pipeline.readers import RawDocument, ReadStats, Skip, read_file


def read(data: bytes, fmt: str = "auto", source: str = "mem/f.txt", max_bytes: int = 16_000_000):
    """One file's documents, skips and counts, as `test_readers.read` gives them."""
    stats = ReadStats()
    records = list(read_file(io.BytesIO(data), source, fmt, max_bytes, stats))
    return ([r for r in records if isinstance(r, RawDocument)], [r for r in records if isinstance(r, Skip)],
            stats.counts)


# A real header and licence, shortened: neither is part of the book. The licence's own "*** START: FULL
# LICENSE ***" line is not a START marker: it must not open a body.
HEADER = ("The Project Gutenberg eBook of {title}, by Jane Austen\n\nThis eBook is for the use of anyone anywhere "
          "in the United States and most other parts of the world at no cost.\n\nTitle: {title}\n\n"
          "*** START OF THE PROJECT GUTENBERG EBOOK {title} ***\n\n")
LICENCE = ("\n\n*** END OF THE PROJECT GUTENBERG EBOOK {title} ***\n\nUpdated editions will replace the previous "
           "one--the old editions will be renamed.\n\n*** START: FULL LICENSE ***\n\nTHE FULL PROJECT GUTENBERG "
           "LICENSE\nPLEASE READ THIS BEFORE YOU DISTRIBUTE OR USE THIS WORK\n")
NOT_THE_BOOK = ("Project Gutenberg", "This eBook is for the use", "Updated editions", "FULL LICENSE", "*** ")


def gutenberg(data_dir, book: str) -> str:
    """A bundled book (which carries no markers) wrapped in its header and licence, as gutenberg.org serves it."""
    title = book.upper()
    return HEADER.format(title=title) + (data_dir / "books" / f"{book}.txt").read_text() + LICENCE.format(title=title)


def paragraphs(data: bytes, **kwargs) -> list[str]:
    docs, skips, counts = read(data, **kwargs)
    assert not skips and counts == {"files_text": 1}
    (doc,) = docs  # one document per file, named by the file, as for a single book
    assert doc.doc_id == "f.txt"
    return doc.segments


def test_classic_mac_line_endings_read_like_unix_ones_header_and_licence_removed(data_dir):
    # A lone \r ends a line: the markers (^...$) and the blank lines between paragraphs were not seen, so the
    # header and licence stayed and the whole book became one paragraph.
    book = gutenberg(data_dir, "persuasion")
    unix = paragraphs(book.encode(), fmt="text")
    assert len(unix) > 500 and unix[0] == "Persuasion" and unix[-1] == "Finis"
    assert not any(bit in p for p in unix for bit in NOT_THE_BOOK)
    assert paragraphs(book.replace("\n", "\r").encode(), fmt="text") == unix
    assert paragraphs(book.replace("\n", "\r").encode()) == unix  # sniffed as text too


def test_every_book_of_a_concatenated_file_is_kept_without_headers_or_licences(data_dir):
    # Several books in one .txt kept the first only: all after its END (the other books too) went as licence.
    first, second = gutenberg(data_dir, "persuasion"), gutenberg(data_dir, "northangerabbey")
    alone = [paragraphs(book.encode(), fmt="text") for book in (first, second)]
    both = paragraphs((first + second).encode(), fmt="text")
    assert both == alone[0] + alone[1]  # nothing lost, nothing glued across the join
    assert alone[1][0] == "NORTHANGER ABBEY" and not any(bit in p for p in both for bit in NOT_THE_BOOK)
    # The same in the older books' words ("THIS PROJECT GUTENBERG"), with Windows line endings.
    older = (first + second).replace("OF THE PROJECT", "OF THIS PROJECT").replace("\n", "\r\n")
    assert paragraphs(older.encode(), fmt="text") == both
