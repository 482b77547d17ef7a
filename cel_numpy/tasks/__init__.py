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

Tasks that run model-written code are kept apart (`CODE_TASKS`: never among the default cross
tasks, and only with the user's consent; `get_task` finds them by name):

    CODE_TASKS["mbpp"]     the released MBPP protocol: three solved problems, then one asked,
                           in the chat template with a "[BEGIN]" prefill -> a program, correct
                           iff it passes the problem's three tests in the sandbox   generate

Each module's docstring gives the templates, scoring decisions and template-space sizes.

Beside them (`get_task`): "hellaswag" and "boolq", the benchmarks' validation splits fetched by
`cel_numpy.datasets`, and any JSONL task file (`cel_numpy.tasks.filetask`, docs/tasks.md).
"""

from pathlib import Path

from cel_numpy.errors import OptionError
from cel_numpy.tasks.agreement import Agreement
from cel_numpy.tasks.arithmetic import Arithmetic
from cel_numpy.tasks.arithmetic_chat import ArithmeticChat
from cel_numpy.tasks.base import Item, Scoring, Task
from cel_numpy.tasks.fewshot import antonyms, capitals
from cel_numpy.tasks.filetask import FileTask, is_task_file
from cel_numpy.tasks.greater_than import GreaterThan
from cel_numpy.tasks.induction import Induction
from cel_numpy.tasks.ioi import IndirectObject
from cel_numpy.tasks.mbpp import Mbpp
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

# Tasks whose scoring runs model-written code (`executes_code = True`); data loaded on first use.
CODE_TASKS: dict[str, Task] = {task.name: task for task in (Mbpp(),)}


# Worked example task files (docs/tasks.md): opposites.jsonl (choice), plurals.jsonl (generate).
EXAMPLES = Path(__file__).resolve().parent / "examples"

# Tasks on fetched benchmark data (`cel_numpy.datasets`): loaded, and fetched, on first use.
DATA_TASKS = ("hellaswag", "boolq")


def get_task(name: str) -> Task:
    """The task called `name`: a registered template task, a task that runs model-written code
    (`CODE_TASKS`), a benchmark on fetched data (`DATA_TASKS`, fetched if needed), or a JSONL
    task file (a name ending in .jsonl or holding a path separator; `FileTask`). OptionError (a
    ValueError) listing the known names otherwise."""
    if name in TASKS:
        return TASKS[name]
    if name in CODE_TASKS:
        return CODE_TASKS[name]
    if name in DATA_TASKS:
        from cel_numpy.datasets import path_of

        return FileTask(path_of(name))
    if is_task_file(name):
        return FileTask(name)
    known = ", ".join([*sorted(TASKS), *DATA_TASKS, *CODE_TASKS])
    raise OptionError(
        f"unknown task {name!r}; known tasks: {known}, or a .jsonl task file (docs/tasks.md)"
    )


__all__ = [
    "CODE_TASKS",
    "DATA_TASKS",
    "EXAMPLES",
    "TASKS",
    "FileTask",
    "Item",
    "Scoring",
    "Task",
    "TemplateTask",
    "get_task",
    "make_panels",
    "max_panel_items",
    "panel_hash",
]
