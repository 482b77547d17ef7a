"""Capability enhancement localization: which heads, removed together, improve a task?

    from cel_numpy.localize import localize, LMEvaluator, TheoryEvaluator, TheoryTask

The two-stage routine (`routine.py`), its resumable run directory (`rundir.py`), ranking
(`ranking.py`), paired statistics (`stats.py`), the report (`report.py`) and the evaluators that
connect it to models (`evaluate.py`, on the vocabulary of `conditions.py`). `cel-numpy localize`
is the command line (`cli.py`).
"""

from cel_numpy.localize.conditions import (
    INTACT,
    ExampleResult,
    check_heads,
    condition_name,
    normalize_condition,
)
from cel_numpy.localize.evaluate import (
    Evaluator,
    LMEvaluator,
    TheoryEvaluator,
    TheoryTask,
    evaluate_naive,
)
from cel_numpy.localize.ranking import (
    Scored,
    joint_enumeration,
    joint_key,
    rank_joint,
    rank_singletons,
    singleton_key,
)
from cel_numpy.localize.routine import STAGES, Localizer, build_panels, localize, test_heads
from cel_numpy.localize.stats import (
    mcnemar_exact,
    newcombe_paired_interval,
    paired_summary,
    wilson_interval,
)

__all__ = [
    "INTACT",
    "Evaluator",
    "ExampleResult",
    "check_heads",
    "LMEvaluator",
    "TheoryEvaluator",
    "TheoryTask",
    "condition_name",
    "evaluate_naive",
    "test_heads",
    "normalize_condition",
    "Scored",
    "joint_enumeration",
    "joint_key",
    "rank_joint",
    "rank_singletons",
    "singleton_key",
    "STAGES",
    "Localizer",
    "build_panels",
    "localize",
    "mcnemar_exact",
    "newcombe_paired_interval",
    "paired_summary",
    "wilson_interval",
]
