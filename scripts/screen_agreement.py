"""The gradient pre-filter against the exact screen, from two run directories on one panel.

    python scripts/screen_agreement.py EXACT_RUN GRADIENT_RUN [--json FILE]

EXACT_RUN: a `cel-numpy localize --screen exact` run whose screen stage is finished (every head
screened exactly). GRADIENT_RUN: a run holding gradient.json (`--screen gradient`, or
`--gradient-agreement`) with the same model and the same discovery panel (both are checked:
model identity and panel hash from the manifests). Prints the numbers of
`cel_numpy.localize.agreement.screen_agreement` over every head: Spearman of the estimate with
the exact log-probability change and with the exact accuracy gain, top-10 overlaps, and how many
of the exact nominees the estimate's top N would have kept.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from cel_numpy.errors import UserError
from cel_numpy.localize import rundir as rd
from cel_numpy.localize.agreement import fmt_agreement, screen_agreement


def load(exact_run: Path, gradient_run: Path) -> dict:
    exact_m, grad_m = rd.read_manifest(exact_run), rd.read_manifest(gradient_run)
    strip = lambda m: {k: v for k, v in m["model"].items() if k not in rd.LOCATION_KEYS}
    if strip(exact_m) != strip(grad_m):
        raise UserError(f"{exact_run} and {gradient_run} ran different models")
    if exact_m["panel_hashes"]["discovery"] != grad_m["panel_hashes"]["discovery"]:
        raise UserError(
            f"{exact_run} and {gradient_run} have different discovery panels (same task, "
            "--discovery, --heldout and --seed give the same panel)"
        )
    if exact_m.get("screen", {}).get("method", "exact") != "exact":
        raise UserError(f"{exact_run} did not screen every head exactly (--screen exact)")
    screen = rd.read_json_object(exact_run / "screen.done.json", "finish its screen stage")
    grad = rd.read_json_object(gradient_run / "gradient.json", "run it with --screen gradient")
    summary = screen["summary"]
    return screen_agreement(grad["estimate"], summary["conditions"], summary["nominees"])


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("exact_run", type=Path)
    ap.add_argument("gradient_run", type=Path)
    ap.add_argument("--json", type=Path, metavar="FILE")
    args = ap.parse_args(argv)
    try:
        agreement = load(args.exact_run, args.gradient_run)
    except UserError as err:
        print(f"screen_agreement: error: {err}", file=sys.stderr)
        return 2
    print(fmt_agreement(agreement))
    if args.json:
        args.json.write_text(json.dumps(agreement, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
