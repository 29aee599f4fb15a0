"""Paths to the repository and its bundled real data, for tests and their fixtures.

One place for them, importable from any test (pytest puts `tests/` on the path, see pyproject.toml),
so no test does `Path(__file__).parents[N]` arithmetic that breaks when a file moves.
"""

from __future__ import annotations

from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
DATA = REPO / "data"
VOCAB = DATA / "vocab" / "bert-base-uncased-vocab.txt"
WIKI_DUMP = DATA / "wiki" / "enwiki-latest-pages-articles1.xml-p000000010p000030302-shortened.bz2"
BOOKS = sorted((DATA / "books").glob("*.txt"))
GLUE = DATA / "glue"
CONLL = DATA / "conll2003"
FIXTURES = REPO / "tests" / "fixtures"
