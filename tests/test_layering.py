"""model/ stays plain nn.Modules: no distributed, launcher, Ray, Beam or argparse imports (STYLE.md 2)."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

from repo_paths import REPO
FORBIDDEN = ("torch.distributed", "deepspeed", "ray", "apache_beam", "argparse")


def _imports(path: Path) -> list[str]:
    names = []
    for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
        if isinstance(node, ast.Import):
            names += [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names.append(node.module)
            names += [f"{node.module}.{a.name}" for a in node.names]
    return names


def test_model_package_imports_nothing_forbidden():
    files = sorted((REPO / "model").rglob("*.py"))
    assert len(files) >= 5
    bad = [
        f"{f.relative_to(REPO)}: {name}"
        for f in files
        for name in _imports(f)
        if any(name == x or name.startswith(x + ".") for x in FORBIDDEN)
    ]
    assert not bad, "model/ must not import these (apply them from launch/): " + "; ".join(bad)


def test_scanner_catches_a_forbidden_import(tmp_path):
    sample = tmp_path / "m.py"
    sample.write_text("import torch\nfrom torch.distributed import all_reduce\nimport deepspeed.zero\n")
    assert [n for n in _imports(sample) if n.startswith(("torch.distributed", "deepspeed"))]


def test_importing_model_loads_no_heavy_framework():
    code = (
        "import sys, model; "
        "bad = [m for m in ('deepspeed', 'ray', 'apache_beam', 'transformers') if m in sys.modules]; "
        "print(','.join(bad))"
    )
    out = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "", f"importing model pulled in: {out.stdout.strip()}"
