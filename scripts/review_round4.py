"""The limits of the round-3/4 evidence, recomputed from the committed reports.

    python scripts/review_round4.py

Prints the mean Spearman correlation between discovery and held-out gain among each search's
ten finalists (searches whose finalists all tie on discovery have none), how many finalists gain
on held-out, and per (model, task) the share of random (null) head sets that gain on held-out,
and that gain with cluster p < 0.05. docs/results.md ("What the evidence does not show yet")
quotes it.
"""

import json
import warnings
from pathlib import Path

from scipy.stats import ConstantInputWarning, spearmanr

ARCHIVE = Path(__file__).resolve().parents[1] / "docs" / "results" / "archive"


def finalist_agreement(reports: list[dict]) -> tuple[list[float], int, int]:
    """Spearman(discovery gain, held-out gain) per search; finalists gaining; finalists."""
    rhos, gaining, total = [], 0, 0
    for r in reports:
        finalists = r.get("finalists") or []
        if r["kind"] != "localize" or not all("heldout" in f for f in finalists):
            continue
        discovery = [f["discovery"]["gain"] for f in finalists]
        heldout = [f["heldout"]["gain"] for f in finalists]
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", ConstantInputWarning)
            rho = spearmanr(discovery, heldout).statistic
        if rho == rho:  # not NaN: the discovery gains are not all tied
            rhos.append(float(rho))
        gaining += sum(g > 0 for g in heldout)
        total += len(heldout)
    return rhos, gaining, total


def null_gains(reports: list[dict]) -> dict[tuple[str, str], tuple[int, int, int]]:
    """(model, task) -> (random sets, gaining on held-out, gaining with cluster p < 0.05)."""
    out: dict[tuple[str, str], tuple[int, int, int]] = {}
    for r in reports:
        key = (r["model"]["spec"], r["task"]["name"])
        n, gaining, significant = out.get(key, (0, 0, 0))
        for s in (r.get("nulls") or {}).get("sets", []):
            n += 1
            gaining += s["gain"] > 0
            significant += s["gain"] > 0 and s["p_value"] < 0.05
        out[key] = (n, gaining, significant)
    return out


def main() -> None:
    paths = sorted(ARCHIVE.glob("round[34]/*/*/report.json"))
    reports = [json.loads(p.read_text()) for p in paths]
    rhos, gaining, total = finalist_agreement(reports)
    mean_rho = sum(rhos) / len(rhos)
    print(f"{len(paths)} reports; {len(rhos)} searches with a defined finalist Spearman")
    print(f"mean Spearman(discovery gain, held-out gain) among finalists: {mean_rho:+.3f}")
    print(f"finalists gaining on held-out: {gaining} of {total}")
    for (model, task), (n, up, sig) in sorted(null_gains(reports).items()):
        if n:
            print(
                f"{model} {task}: random sets gaining {up}/{n} = {up / n:.0%}, "
                f"significantly {sig}/{n} = {sig / n:.0%}"
            )


if __name__ == "__main__":
    main()
