"""Classify the rescued and damaged examples shown in the committed capitals and antonyms
reports (docs/results/**/report.json, `examples`) with `cel_numpy.tasks.changes`, under the
scorer that accepts every listed answer. Prints one line per example and the totals.

    python scripts/classify_committed_examples.py

Only the few examples a report shows (up to three of each kind) are available: runs of that
time committed no per-item records, so this is a sample, not every change of a run.
"""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path

from cel_numpy.tasks import Item, get_task
from cel_numpy.tasks.base import answer_context
from cel_numpy.tasks.changes import CATEGORIES, classify_change

ROOT = Path(__file__).resolve().parent.parent


def main() -> None:
    totals = {"rescued": Counter(), "damaged": Counter()}
    reports = 0
    for path in sorted((ROOT / "docs" / "results").glob("**/report.json")):
        report = json.loads(path.read_text())
        task_name = report.get("task", {}).get("name")
        if task_name not in ("capitals", "antonyms") or not report.get("examples"):
            continue
        reports += 1
        task = get_task(task_name)
        for kind in ("rescued", "damaged"):
            for e in report["examples"][kind]:
                item = Item(task_name, "lookup", e["prompt"], e["answer"])
                wrong = e["intact"] if kind == "rescued" else e["ablated"]
                category = classify_change(answer_context(task, item), wrong)
                totals[kind][category] += 1
                query = e["prompt"].rsplit("\n", 1)[-1]
                print(f"{path.parent.relative_to(ROOT)}  {kind}  {query!r} {e['answer']!r}: "
                      f"intact {e['intact'].strip()!r}, removed {e['ablated'].strip()!r} -> "
                      f"{category}")  # fmt: skip
    print(f"{reports} reports")
    for kind, counts in totals.items():
        shown = ", ".join(f"{c} {counts[c]}" for c in CATEGORIES)
        print(f"{kind} {sum(counts.values())}: {shown}")


if __name__ == "__main__":
    main()
