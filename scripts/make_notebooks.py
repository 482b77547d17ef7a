"""Write an executed notebook of every tutorial into tutorials/notebooks/
(what `make notebooks` runs).

    python scripts/make_notebooks.py [--fast] [--only 04_smollm2] [--timeout 3600]

Each percent-format script (tutorials/NN_name.py) is paired with a notebook by jupytext, executed
by nbclient in a fresh temporary working directory (so nothing it writes lands in the repo, and a
tutorial that looked for files beside itself would fail here), and written with its outputs and
figures to tutorials/notebooks/NN_name.ipynb. tests/test_notebooks.py checks that every committed
notebook's cells equal its script's, so a notebook never drifts from the script it shows.

Needs the `notebooks` extra: pip install -e '.[notebooks]'
(jupytext, nbclient, nbformat, ipykernel).
--fast runs the tutorials as the test suite does (CEL_NUMPY_FAST=1: fewer heads, fewer steps).
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from pathlib import Path

import jupytext
import nbformat
from nbclient import NotebookClient

ROOT = Path(__file__).resolve().parent.parent
TUTORIALS = ROOT / "tutorials"
NOTEBOOKS = TUTORIALS / "notebooks"
KERNEL = {"name": "python3", "display_name": "Python 3 (ipykernel)", "language": "python"}


def build(script: Path, timeout: int) -> nbformat.NotebookNode:
    """The script as a notebook, executed in a temporary working directory."""
    nb = jupytext.read(script)
    nb.metadata = {"kernelspec": KERNEL, "language_info": {"name": "python"}}
    with tempfile.TemporaryDirectory(prefix=f"cel-numpy-{script.stem}-") as cwd:
        client = NotebookClient(
            nb,
            timeout=timeout,
            kernel_name=KERNEL["name"],
            record_timing=False,  # no timestamps: a rerun changes only what the code prints
            resources={"metadata": {"path": cwd}},
        )
        client.execute()
    return nb


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0].replace("\n", " "))
    parser.add_argument("--fast", action="store_true", help="run with CEL_NUMPY_FAST=1")
    parser.add_argument("--only", action="append", help="tutorial stem(s) to (re)build")
    parser.add_argument("--timeout", type=int, default=3600, help="seconds per cell")
    args = parser.parse_args(argv)
    os.environ.pop("MPLBACKEND", None)  # the kernel's inline backend puts figures in the outputs
    if args.fast:
        os.environ["CEL_NUMPY_FAST"] = "1"
    else:
        os.environ.pop("CEL_NUMPY_FAST", None)
    NOTEBOOKS.mkdir(exist_ok=True)
    scripts = sorted(TUTORIALS.glob("[0-9]*.py"))
    if args.only:
        scripts = [s for s in scripts if s.stem in args.only]
        if not scripts:
            parser.error(f"no tutorial named {', '.join(args.only)} in {TUTORIALS}")
    for script in scripts:
        start = time.perf_counter()
        print(f"{script.name} ...", end=" ", flush=True)
        nb = build(script, args.timeout)
        out = NOTEBOOKS / f"{script.stem}.ipynb"
        nbformat.write(nb, out)
        print(f"{time.perf_counter() - start:.0f} s -> {out.relative_to(ROOT)}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
