"""Committed notebooks never drift from their tutorial scripts, and tutorials run from anywhere.

tutorials/notebooks/NN_name.ipynb is written by `make notebooks` (scripts/make_notebooks.py:
jupytext pairs, nbclient executes). Here the notebooks are read as plain JSON and the scripts by a
small percent-format reader of our own, so the check needs neither jupytext nor nbformat.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

import cel_numpy as cn

ROOT = Path(__file__).resolve().parent.parent
TUTORIALS = sorted((ROOT / "tutorials").glob("[0-9]*.py"))
NOTEBOOKS = ROOT / "tutorials" / "notebooks"
MARKER = re.compile(r"^# %%(?P<rest>.*)$")


def script_cells(path: Path) -> list[tuple[str, str]]:
    """(kind, text) per cell of a percent-format script; markdown with its '# ' prefixes removed."""
    cells: list[tuple[str, list[str]]] = []
    for line in path.read_text().splitlines():
        match = MARKER.match(line)
        if match:
            kind = "markdown" if "[markdown]" in match["rest"] else "code"
            cells.append((kind, []))
        elif cells:
            cells[-1][1].append(line)
    out = []
    for kind, lines in cells:
        if kind == "markdown":
            lines = [re.sub(r"^# ?", "", line) for line in lines]
        out.append((kind, "\n".join(lines).strip("\n")))
    return out


def notebook_cells(path: Path) -> list[dict]:
    nb = json.loads(path.read_text())
    assert nb["nbformat"] == 4, f"{path.name}: not an nbformat 4 notebook"
    return nb["cells"]


def source(cell: dict) -> str:
    text = cell["source"]
    return ("".join(text) if isinstance(text, list) else text).strip("\n")


def test_every_tutorial_has_a_notebook():
    assert TUTORIALS, "no tutorials found"
    expected = {p.stem for p in TUTORIALS}
    present = {p.stem for p in NOTEBOOKS.glob("*.ipynb")}
    assert expected <= present, f"missing notebooks (run `make notebooks`): {expected - present}"
    assert present <= expected, f"notebooks without a tutorial script: {present - expected}"


@pytest.mark.parametrize("script", TUTORIALS, ids=[p.stem for p in TUTORIALS])
def test_notebook_cells_equal_the_script(script):
    path = NOTEBOOKS / f"{script.stem}.ipynb"
    assert path.exists(), f"{path} missing: run `make notebooks`"
    cells = notebook_cells(path)
    expected = script_cells(script)
    got = [(c["cell_type"], source(c)) for c in cells]
    assert [k for k, _ in got] == [k for k, _ in expected], (
        f"{path.name}: cell kinds differ from {script.name}: rerun `make notebooks`"
    )
    for i, ((kind, want), (_, have)) in enumerate(zip(expected, got)):
        if kind == "code":
            assert have == want, f"{path.name}: code cell {i} differs from {script.name}"
        else:  # markdown: compare the words (jupytext may re-wrap nothing, but spacing can differ)
            assert have.split() == want.split(), f"{path.name}: markdown cell {i} differs"
    code = [c for c in cells if c["cell_type"] == "code"]
    assert all(c.get("execution_count") for c in code), f"{path.name}: not executed"
    assert sum(len(c.get("outputs", [])) for c in code) > 0, f"{path.name}: no outputs"
    errors = [o for c in code for o in c.get("outputs", []) if o.get("output_type") == "error"]
    assert not errors, f"{path.name}: a cell raised {errors[0].get('ename')}"


def test_the_reader_splits_cells_like_the_format(tmp_path):
    text = (
        "# %% [markdown]\n# # Title\n#\n# Some *text*.\n\n# %%\nx = 1\n\ny = 2\n\n"
        "# %% [markdown]\n# More\n\n# %%\nprint(x)\n"
    )
    path = tmp_path / "t.py"
    path.write_text(text)
    assert script_cells(path) == [
        ("markdown", "# Title\n\nSome *text*."),
        ("code", "x = 1\n\ny = 2"),
        ("markdown", "More"),
        ("code", "print(x)"),
    ]


def test_package_fixtures_are_the_test_fixtures():
    """Tutorials load tiny models from the package; they are byte-identical to tests/fixtures."""
    shipped = cn.fixtures_dir()
    for name in ("tiny_gpt2", "tiny_llama"):
        for f in ("config.json", "model.safetensors"):
            ours, tests = shipped / name / f, ROOT / "tests" / "fixtures" / name / f
            assert ours.read_bytes() == tests.read_bytes(), f"{ours} differs from {tests}"


def test_a_tutorial_runs_from_a_copy_in_a_temporary_directory(tmp_path):
    """A tutorial copied out of the repo (as into a course's folder) finds its model."""
    script = tmp_path / "elsewhere" / "03_gpt2_in_numpy.py"
    script.parent.mkdir()
    shutil.copy(ROOT / "tutorials" / script.name, script)
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "CEL_NUMPY_GPT2")}
    env.update(CEL_NUMPY_FAST="1", MPLBACKEND="Agg")
    proc = subprocess.run(
        [sys.executable, str(script)],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    assert "all checks passed" in proc.stdout
    assert (tmp_path / "attention_L0H1.png").exists()  # written where it ran, not in the repo
