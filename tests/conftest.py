"""Shared fixtures: the bundled real data, one real corpus built once per session, the real MiniLM
checkpoint, a tiny random checkpoint with the real vocab, a WordPiece tokenizer."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest
import torch

from built_once import built_once
from repo_paths import DATA, REPO, VOCAB, WIKI_DUMP

# Should DeepSpeed JIT-build a C++ op (bertpipe runs build none), it is cached inside the project, as `make` does.
os.environ.setdefault("TORCH_EXTENSIONS_DIR", str(REPO / ".cache" / "torch_extensions"))
os.environ.setdefault("OMP_NUM_THREADS", "1")


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Longest first: on several workers (`make test` runs two), the long tests start early and the short
    ones fill the gaps at the end, instead of one worker idling while the other finishes a 5-minute test.
    `slow(longest=True)` tests come first, then the other `slow` ones, then the rest, each group in
    collection order (the same on every worker, as xdist requires)."""

    def rank(item: pytest.Item) -> int:
        mark = item.get_closest_marker("slow")
        return 2 if mark is None else 0 if mark.kwargs.get("longest") else 1

    items.sort(key=rank)


@pytest.fixture(scope="session")
def repo() -> Path:
    return REPO


@pytest.fixture(scope="session")
def data_dir() -> Path:
    return DATA


@pytest.fixture(scope="session")
def small_corpus(tmp_path_factory) -> Path:
    """A real corpus (seq 64) from one bundled book and the bundled Wikipedia dump, built by the CLI.

    Shared by the loader, trainer, export and demo tests so the Beam job runs once per test run.
    """
    from launch import cli

    def build(out: Path) -> None:
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

    return built_once(tmp_path_factory, "small_corpus", build)

SENTENCES = [
    "It is a truth universally acknowledged, that a single man in possession of a good fortune, must be in want of a wife.",
    "Sir Walter Elliot, of Kellynch Hall, in Somersetshire, was a man who, for his own amusement, never took up any book but the Baronetage.",
    "Anarchism is a political philosophy.",
    "Yes.",
    "The Eiffel Tower, completed in 1889, was the tallest man-made structure in the world for 41 years.",
    "No one who had ever seen Catherine Morland in her infancy would have supposed her born to be an heroine.",
]


@pytest.fixture(scope="session")
def sentences() -> list[str]:
    return list(SENTENCES)


@pytest.fixture(scope="session")
def minilm_dir() -> Path:
    from launch.finetune.reference_model import INSTALL_HINT, minilm_dir

    path = minilm_dir()
    assert path is not None, f"the real pre-trained weights the parity tests need are missing: {INSTALL_HINT}"
    return path


@pytest.fixture(scope="session")
def minilm_batch(minilm_dir):
    """Real sentences of varied length, tokenized by the checkpoint's tokenizer, in one padded batch."""
    from tokenizers import Tokenizer

    tok = Tokenizer.from_file(str(minilm_dir / "tokenizer.json"))
    tok.enable_padding(pad_id=0)
    enc = tok.encode_batch(SENTENCES)
    ids = torch.tensor([e.ids for e in enc])
    mask = torch.tensor([e.attention_mask for e in enc])
    types = torch.tensor([e.type_ids for e in enc])
    lengths = mask.sum(1)
    assert lengths.min() < lengths.max() // 3, "the batch must mix short and long sentences"
    return ids, types, mask


@pytest.fixture(scope="session")
def hf_minilm(minilm_dir):
    import transformers

    model = transformers.BertModel.from_pretrained(str(minilm_dir), attn_implementation="sdpa")
    return model.eval()


@pytest.fixture(scope="session")
def tiny_checkpoint(tmp_path_factory) -> Path:
    """A randomly initialised 2-layer BERT (hidden 32) with the real uncased vocab, in HF format.

    Random weights learn little in a few steps; tests with it check plumbing, files and formats.
    """
    import torch

    from model.bert import BertForPreTraining
    from model.config import BertConfig
    from model.hf import save_pretrained

    torch.manual_seed(0)
    cfg = BertConfig(vocab_size=30522, hidden_size=32, num_hidden_layers=2, num_attention_heads=2,
                     intermediate_size=64, max_position_embeddings=256)
    path = tmp_path_factory.mktemp("ckpt") / "tiny"
    save_pretrained(BertForPreTraining(cfg), path, vocab_file=VOCAB)
    return path



@pytest.fixture(scope="session")
def tokenizer():
    from tokenizers import BertWordPieceTokenizer

    tok = BertWordPieceTokenizer(str(VOCAB), lowercase=True)
    tok.no_padding()
    tok.no_truncation()
    return tok


@pytest.fixture
def tmpfs(tmp_path):
    """`mount(size_bytes) -> path`: a fresh tmpfs of that size (a real full disk for the disk-full tests);
    `mount.resize(path, size_bytes)` grows it. Needs root (CI and the dev machines); skips elsewhere."""
    mounted: list[Path] = []

    def mount(size: int) -> Path:
        point = tmp_path / f"tmpfs{len(mounted)}"
        point.mkdir()
        done = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(point)],
                              capture_output=True, text=True)
        if done.returncode != 0:
            pytest.skip(f"cannot mount a tmpfs here (needs root): {done.stderr.strip()}")
        mounted.append(point)
        return point

    def resize(point: Path, size: int) -> None:
        subprocess.run(["mount", "-o", f"remount,size={size}", str(point)], check=True)

    mount.resize = resize
    yield mount
    for point in mounted:
        subprocess.run(["umount", "-l", str(point)], capture_output=True)
