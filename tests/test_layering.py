"""The layering the project promises, checked on the source:

- `model/` is plain nn.Modules: no distributed, launcher, Ray, Beam or argparse imports,
  and nothing of ours (it is the bottom layer);
- `pipeline/` imports nothing from `launch/` (data flows up: launch uses pipeline, never back);
- no import cycles between our modules;
- no two modules under `launch/` share a file name; no Python file in `pipeline/`, `model/`, `launch/` over 450 lines.
"""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import pytest

from repo_paths import REPO

PACKAGES = ("pipeline", "model", "launch")
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


def _our_modules() -> dict[str, Path]:
    """Dotted module name -> file, for every module of our three packages."""
    modules = {}
    for package in PACKAGES:
        for path in sorted((REPO / package).rglob("*.py")):
            parts = path.relative_to(REPO).with_suffix("").parts
            modules[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    return modules


def _our_imports(path: Path, modules: dict[str, str]) -> set[str]:
    """Our modules that `path` imports (at any depth: lazy imports inside functions count too)."""
    found = set()
    for name in _imports(path):
        while name and name not in modules:
            name = name.rpartition(".")[0]
        if name:
            found.add(name)
    return found


@pytest.mark.parametrize("lower, upper", [("model", "pipeline"), ("model", "launch"), ("pipeline", "launch")])
def test_lower_layers_do_not_import_upper_ones(lower, upper):
    modules = _our_modules()
    bad = [
        f"{path.relative_to(REPO)} imports {name}"
        for module, path in modules.items() if module.split(".")[0] == lower
        for name in _our_imports(path, modules) if name.split(".")[0] == upper
    ]
    assert not bad, f"{lower}/ must not import {upper}/: " + "; ".join(bad)


def _first_cycle(graph: dict[str, set[str]]) -> list[str] | None:
    """The first import cycle found in `graph` (module -> the modules it imports), as a path back to its
    start, or None."""
    state: dict[str, int] = {}  # 1: on the current path, 2: done
    stack: list[str] = []

    def visit(node: str) -> list[str] | None:
        state[node] = 1
        stack.append(node)
        for nxt in sorted(graph.get(node, ())):
            if state.get(nxt) == 1:
                return stack[stack.index(nxt):] + [nxt]
            if nxt not in state and (cycle := visit(nxt)):
                return cycle
        stack.pop()
        state[node] = 2
        return None

    for start in sorted(graph):
        if start not in state and (cycle := visit(start)):
            return cycle
    return None


def test_no_import_cycles():
    modules = _our_modules()
    # Package __init__ files are skipped as edges' sources: importing a.b runs a/__init__ first, which
    # is not a dependency of a.b's own code.
    graph = {m: {n for n in _our_imports(p, modules) if n != m} for m, p in modules.items() if p.name != "__init__.py"}
    cycle = _first_cycle(graph)
    assert cycle is None, "import cycle: " + " -> ".join(cycle)


def test_cycle_finder_and_layer_scan_can_fail(tmp_path):
    """The scanners above see what they must: an upward import, including one inside a function, and a
    cycle however long (a diamond is not one)."""
    sample = tmp_path / "m.py"
    sample.write_text("def f():\n    from launch.cli import main\n")
    assert _our_imports(sample, {"launch.cli": "x", "launch": "y"}) == {"launch.cli"}
    diamond = {"a": {"b", "c"}, "b": {"d"}, "c": {"d"}, "d": set()}
    assert _first_cycle(diamond) is None
    assert _first_cycle({**diamond, "d": {"e"}, "e": {"b"}}) == ["b", "d", "e", "b"]


def test_module_names_unique_under_launch_and_files_small():
    names: dict[str, list[str]] = {}
    for path in (REPO / "launch").rglob("*.py"):
        if path.name not in ("__init__.py", "__main__.py"):
            names.setdefault(path.name, []).append(str(path.relative_to(REPO)))
    assert not {n: p for n, p in names.items() if len(p) > 1}, "two modules with one name under launch/"
    big = [f"{p.relative_to(REPO)} ({n})" for package in PACKAGES for p in (REPO / package).rglob("*.py")
           if (n := len(p.read_text().splitlines())) > 450]
    assert not big, "files over 450 lines (split them): " + ", ".join(big)
