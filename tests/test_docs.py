"""The docs name real files: every path in backticks under one of the repository's top folders in
README.md and docs/*.md exists, and every `tests/...py::test_name` names a test that is there (files
move; docs drift unless checked). Dotted module names (`launch.x.y`) are not checked here."""

from __future__ import annotations

import re

from repo_paths import REPO as ROOT

DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
TOP = ("pipeline", "model", "launch", "k8s", "tests", "bench", "tools", "docs", "data", "docker", "deploy", ".ci")
PATH = re.compile(r"`((?:%s)/[\w./*-]*)(?:::(\w+))?" % "|".join(re.escape(t) for t in TOP))
# README's list of where modules used to live ("`launch/cli/` (was `launch/cli.py` ...)").
MOVED = {"launch/cli.py", "launch/commands/", "launch/trainer.py", "launch/export.py"}


def _named_paths() -> list[tuple[str, str, str | None]]:
    found = []
    for doc in DOCS:
        for n, line in enumerate(doc.read_text(encoding="utf-8").splitlines(), 1):
            for m in PATH.finditer(line):
                path = m.group(1).rstrip(".")
                if path not in MOVED and "*" not in path:
                    found.append((f"{doc.relative_to(ROOT)}:{n}", path, m.group(2)))
    return found


def test_every_path_the_docs_name_exists():
    named = _named_paths()
    assert len(named) > 100  # the pattern still finds the docs' paths
    missing = [f"{where}: {path}" for where, path, _ in named if not (ROOT / path).exists()]
    assert not missing, "docs name files that are not there:\n" + "\n".join(missing)


def test_every_test_the_docs_name_exists():
    named = [(where, path, test) for where, path, test in _named_paths() if test]
    assert named
    missing = [f"{where}: {path}::{test}" for where, path, test in named
               if not re.search(rf"^\s*(?:async )?def {test}\(", (ROOT / path).read_text(encoding="utf-8"), re.M)]
    assert not missing, "docs name tests that are not there:\n" + "\n".join(missing)
