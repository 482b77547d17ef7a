"""Template-generated tasks (no downloads); see `cel_numpy.tasks.base` for the contract.

    TASKS["arithmetic"]    "Question: What is 48 plus 76?\\nAnswer:" -> " 124"      generate
    TASKS["arithmetic_chat"]  the released protocol: instruction + question as one chat user
                           message in the model's template -> "124" then end of turn  generate
    TASKS["arithmetic_2shot"]  the same after two fixed solved examples of the same subtask
    TASKS["ioi"]           "When Mary and John went to the store, John gave a drink to"
                           -> " Mary"                                                choice
    TASKS["greater_than"]  "The war lasted from the year 1732 to the year 17"
                           -> any YY > 32                                           generate
    TASKS["capitals"]      "France: Paris\\nJapan: Tokyo\\nEgypt: Cairo\\nItaly:"
                           -> " Rome"                                               generate
    TASKS["antonyms"]      "hot -> cold\\nrich -> poor\\nday -> night\\nwet ->"
                           -> " dry"                                                generate
    TASKS["agreement"]     "The key near the cabinets" -> " is" (vs " are")          choice
    TASKS["induction"]     "river lamp horse cloud stone apple\\nriver lamp horse"
                           -> " cloud"                                              generate

Tasks with a `roles(item)` method name the character spans of their prompts' token roles (the
query, the shots' answers, separators...), which `cel_numpy.explain` reads.

Each module's docstring gives the templates, scoring decisions and template-space sizes.
"""

from cel_numpy.errors import OptionError
from cel_numpy.tasks.agreement import Agreement
from cel_numpy.tasks.arithmetic import Arithmetic
from cel_numpy.tasks.arithmetic_chat import ArithmeticChat
from cel_numpy.tasks.base import Item, Scoring, Task
from cel_numpy.tasks.fewshot import antonyms, capitals
from cel_numpy.tasks.greater_than import GreaterThan
from cel_numpy.tasks.induction import Induction
from cel_numpy.tasks.ioi import IndirectObject
from cel_numpy.tasks.panels import make_panels, max_panel_items, panel_hash
from cel_numpy.tasks.template import TemplateTask

TASKS: dict[str, Task] = {
    task.name: task
    for task in (
        Arithmetic(),
        Arithmetic(n_shots=2),
        ArithmeticChat(),
        IndirectObject(),
        GreaterThan(),
        capitals(),
        antonyms(),
        Agreement(),
        Induction(),
    )
}


def get_task(name: str) -> Task:
    """The registered task called `name`; OptionError (a ValueError) listing the known
    names otherwise."""
    if name not in TASKS:
        raise OptionError(f"unknown task {name!r}; known tasks: {', '.join(sorted(TASKS))}")
    return TASKS[name]


__all__ = [
    "TASKS", "Item", "Scoring", "Task", "TemplateTask",
    "get_task", "make_panels", "max_panel_items", "panel_hash",
]  # fmt: skip
