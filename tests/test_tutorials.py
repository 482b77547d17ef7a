"""Run every tutorial as a script in fast mode (CEL_NUMPY_FAST=1); each ends with its own asserts.

New tutorials are picked up automatically: anything matching tutorials/*.py.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
TUTORIALS = sorted((ROOT / "tutorials").glob("*.py"))


def needs_download(path: Path) -> bool:
    """A tutorial that loads a model by a fetched name (e.g. `cn.load_model("smollm2")`)."""
    from cel_numpy.models.fetch import KNOWN

    text = path.read_text()
    return any(f'load_model("{name}"' in text for name in KNOWN)


CASES = [
    pytest.param(p, id=p.name, marks=[pytest.mark.download] if needs_download(p) else [])
    for p in TUTORIALS
]


@pytest.mark.parametrize("path", CASES)
def test_tutorial_runs(path, tmp_path):
    env = dict(os.environ, CEL_NUMPY_FAST="1", MPLBACKEND="Agg")
    env["PYTHONPATH"] = str(ROOT) + os.pathsep + env.get("PYTHONPATH", "")
    proc = subprocess.run(
        [sys.executable, str(path)],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert proc.returncode == 0, (
        f"{path.name} failed (exit {proc.returncode}):\n"
        f"{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}"
    )
