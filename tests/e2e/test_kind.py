"""The kind end-to-end run (tests/e2e/kind.sh), when this machine can run it.

It needs a running Docker engine and kind; without them it is skipped, with the
reason. Run it alone with `make e2e-kind`.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
TOOLS = ROOT / ".tools" / "bin"


def _docker_engine_running() -> bool:
    if shutil.which("docker") is None:
        return False
    done = subprocess.run(["docker", "info"], capture_output=True, timeout=60)
    return done.returncode == 0


@pytest.mark.slow
@pytest.mark.timeout(1800)
def test_rota_end_to_end_on_kind() -> None:
    if not _docker_engine_running():
        pytest.skip("no Docker engine here: the kind end-to-end run needs one (make e2e-kind)")
    if shutil.which("kind") is None:
        pytest.skip("kind is not on PATH: the end-to-end run needs it (make e2e-kind)")
    fetched = subprocess.run(["make", "--no-print-directory", "helm", "kubectl"], cwd=ROOT)
    assert fetched.returncode == 0, "could not fetch the pinned helm and kubectl"
    env = {**os.environ, "PATH": f"{TOOLS}{os.pathsep}{os.environ.get('PATH', '')}"}
    done = subprocess.run(["bash", str(ROOT / "tests" / "e2e" / "kind.sh")], cwd=ROOT, env=env)
    assert done.returncode == 0, "tests/e2e/kind.sh failed; its output says where"
