"""Summarise finished localization runs as the README's markdown table.

    python scripts/results_table.py RUN_DIR [RUN_DIR ...]

One row per run directory (each must hold a report.json written by `cel-numpy localize`):
intact accuracy on both panels, the rank-1 head set, its discovery and held-out gains (95%
Newcombe interval, exact McNemar p), and its effect on every cross task. The wall time of a run
is read from the modification times of its first and last record files.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path


def wall_minutes(run: Path) -> float:
    times = [p.stat().st_mtime for p in run.glob("*.json*")]
    return (max(times) - min(times)) / 60.0


def gain(s: dict) -> str:
    return f"{s['gain']:+d}/{s['n']} ({s['gain_rate']:+.3f})"


def row(run: Path) -> str:
    r = json.loads((run / "report.json").read_text())
    p = r["primary"]
    fin = r["finalists"][0]
    d, h = fin["discovery"], p["heldout"]
    intact = r["intact"]
    cross = "; ".join(
        f"{name} {s['gain_rate']:+.3f} (p {s['p_value']:.2g})"
        for name, s in sorted(p["crosstask"].items())
    )
    return (
        f"| {r['task']['name']} | {intact['discovery']['correct']}/{intact['discovery']['n']}, "
        f"{intact['heldout']['correct']}/{intact['heldout']['n']} | {p['name']} | {gain(d)} | "
        f"{gain(h)} [{h['ci_low']:+.3f}, {h['ci_high']:+.3f}] | {h['p_value']:.2g} | "
        f"{cross or '-'} | {wall_minutes(run):.0f} min |"
    )


def main(argv: list[str]) -> int:
    if not argv:
        print(__doc__, file=sys.stderr)
        return 2
    print(
        "| task | intact (discovery, held-out) | rank-1 heads | discovery gain "
        "| held-out gain [95% CI] | McNemar p | effect on other tasks (held-out gain) | wall |"
    )
    print("|---|---|---|---|---|---|---|---|")
    for arg in argv:
        print(row(Path(arg)))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
