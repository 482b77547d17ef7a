"""The README's promises: its Python example runs as written, and CI runs the
README's test command."""

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
README = (ROOT / "README.md").read_text()


@pytest.mark.download
def test_readme_python_example_runs(capsys):
    blocks = [
        b
        for b in re.findall(r"```python\n(.*?)```", README, flags=re.S)
        if "import cel_numpy as cn" in b
    ]
    assert blocks, "README has no ```python example that imports cel_numpy as cn"
    namespace: dict = {}
    exec(compile(blocks[0], "README.md", "exec"), namespace)
    out = capsys.readouterr().out.splitlines()
    assert out[0].startswith(" Paris"), (
        f"README example should continue with ' Paris', got {out[0]!r}"
    )
    logits = namespace["logits"]
    assert logits.shape[:2] == namespace["ids_batch"].shape
    assert "blocks.3.attn.pattern" in namespace["cache"].names()


def test_ci_runs_the_readme_test_command():
    commands = re.findall(r"^(make \w+)\s+#", README, flags=re.M)
    assert "make test" in commands and "make demo" in commands, commands
    ci = [line.strip() for line in (ROOT / ".ci" / "run").read_text().splitlines()]
    steps = [line for line in ci if line and not line.startswith("#") and line not in ("set -e",)]
    assert steps[-1] == "make test", (
        f".ci/run must end by running the README's test command, got {steps}"
    )
    assert all(s.startswith("cd ") for s in steps[:-1]), (
        f".ci/run runs more than the README says: {steps}"
    )
    makefile = (ROOT / "Makefile").read_text()
    assert re.search(r"^test:.*\blint\b", makefile, flags=re.M), (
        "make test must run make lint first"
    )
    assert "ruff check" in makefile and "ruff format --check" in makefile
