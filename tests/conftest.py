"""Shared fixtures: paths to the bundled real data, and one real corpus built once per session."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
DATA = REPO / "data"
VOCAB = DATA / "vocab" / "bert-base-uncased-vocab.txt"
WIKI_DUMP = DATA / "wiki" / "enwiki-latest-pages-articles1.xml-p000000010p000030302-shortened.bz2"
BOOKS = sorted((DATA / "books").glob("*.txt"))
GLUE = DATA / "glue"

# DeepSpeed JIT-builds a CPU comm op on first use; cache it inside the project, as `make` does.
os.environ.setdefault("TORCH_EXTENSIONS_DIR", str(REPO / ".cache" / "torch_extensions"))
os.environ.setdefault("OMP_NUM_THREADS", "1")


@pytest.fixture(scope="session")
def repo() -> Path:
    return REPO


@pytest.fixture(scope="session")
def data_dir() -> Path:
    return DATA


@pytest.fixture(scope="session")
def small_corpus(tmp_path_factory) -> Path:
    """A real corpus (seq 64) from one bundled book and the bundled Wikipedia dump, built by the CLI.

    Shared by the loader, trainer, export and demo tests so the Beam job runs once per session.
    """
    from launch import cli

    out = tmp_path_factory.mktemp("corpus") / "small"
    argv = [
        "corpus",
        "--input", str(DATA / "books" / "persuasion.txt"), str(WIKI_DUMP),
        "--vocab", str(VOCAB),
        "--out", str(out),
        "--seq-len", "64",
        "--max-predictions", "10",
        "--dupe-factor", "1",
        "--seed", "1234",
        "--num-shards", "2",
    ]
    assert cli.main(argv) == 0
    return out
