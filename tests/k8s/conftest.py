"""Fixtures for the cluster-config tests: the vendored schemas and every kustomization, rendered once."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

import k8s_validate


@pytest.fixture(scope="session")
def store() -> k8s_validate.SchemaStore:
    return k8s_validate.SchemaStore()


@pytest.fixture(scope="session")
def kubectl() -> str:
    # Not a skip: without kubectl the overlays are never rendered, so nothing here would be proven.
    return k8s_validate.find_kubectl()


@pytest.fixture(scope="session")
def rendered(kubectl: str) -> dict[str, list[dict[str, Any]]]:
    """Every kustomization under k8s/ (relative path -> its rendered objects), by `kubectl kustomize`."""
    roots = k8s_validate.kustomizations()
    assert {"k8s/base", "k8s/overlays/dev", "k8s/overlays/multinode"} <= {k8s_validate.repo_relative(r) for r in roots}
    return {k8s_validate.repo_relative(root): k8s_validate.render_kustomization(root, kubectl) for root in roots}


def find(objects: list[dict[str, Any]], kind: str, name: str) -> dict[str, Any]:
    matches = [o for o in objects if o["kind"] == kind and o["metadata"]["name"] == name]
    assert len(matches) == 1, f"expected one {kind}/{name}, found {len(matches)}"
    return matches[0]


@pytest.fixture(scope="session")
def find_object():
    return find


@pytest.fixture(scope="session")
def repo_root() -> Path:
    return k8s_validate.REPO
