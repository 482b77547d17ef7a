"""arithmetic_chat: the released arithmetic protocol (items, scoring, the declared stop rule)."""

from __future__ import annotations

import numpy as np
import pytest

from cel_numpy.localize.scoring import StopRule, stop_rule
from cel_numpy.tasks import get_task
from cel_numpy.tasks.arithmetic_chat import INSTRUCTION, ArithmeticChat
from cel_numpy.tasks.base import Item


@pytest.fixture(scope="module")
def task() -> ArithmeticChat:
    return get_task("arithmetic_chat")


def test_registered_with_the_released_settings(task):
    assert task.name == "arithmetic_chat" and task.scoring == "generate"
    assert (task.max_new_tokens, task.chat, task.stop) == (32, True, "end_of_turn")
    assert task.subtasks == (
        "add2", "add3", "add4", "add5", "sub2", "sub3", "sub4", "sub5", "mul2", "comp1"
    )  # fmt: skip


def test_prompt_is_the_instruction_then_the_eleuther_question(task):
    item = task.item_at("add2", 0)
    assert item.prompt == (
        "Solve the arithmetic problem. Return only the final integer, with no words or "
        "explanation.\n\nQuestion: What is 10 plus 10?\nAnswer:"
    )
    assert item.prompt.startswith(INSTRUCTION + "\n\n")
    assert item.answer == "20"


@pytest.mark.parametrize("subtask", ArithmeticChat.subtasks)
def test_every_item_is_its_own_arithmetic(task, subtask):
    """Evaluate each question independently of the generator (Python's own arithmetic)."""
    rng = np.random.default_rng(0)
    n = task.space_size(subtask)
    for index in [0, n - 1, *rng.integers(n, size=40)]:
        item = task.item_at(subtask, int(index))
        question = item.prompt.split("Question: What is ", 1)[1].removesuffix("?\nAnswer:")
        expr = question.replace("plus", "+").replace("minus", "-").replace("times", "*")
        assert str(eval(expr, {"__builtins__": {}})) == item.answer, item.prompt
        if subtask[:-1] in ("add", "sub", "mul"):
            x, _, y = question.split(" ")
            digits = int(subtask[-1])
            assert len(x) == len(y) == digits, question


def test_space_sizes_and_ids_are_distinct(task):
    assert task.space_size("add2") == 8100 and task.space_size("sub5") == 90000**2
    assert task.space_size("comp1") == 18000
    ids = {task.item_at("comp1", i).id for i in range(task.space_size("comp1"))}
    assert len(ids) == 18000, "two indices gave the same question"


def test_subtraction_keeps_negative_answers(task):
    answers = [int(task.item_at("sub3", i).answer) for i in range(0, 810000, 997)]
    negative = np.mean([a < 0 for a in answers])
    assert 0.4 < negative < 0.6, f"{negative:.0%} negative answers"


def test_cluster_is_the_problem(task):
    item = task.item_at("mul2", 123)
    assert item.cluster == item.prompt.split("What is ", 1)[1].removesuffix("?\nAnswer:")


@pytest.mark.parametrize(
    "output, correct",
    [
        ("124", True), (" 124 ", True), ("+124", True), ("0124", True), ("\n124\n", True),
        ("124.", False), ("124 apples", False), ("The answer is 124", False), ("1,24", False),
        ("125", False), ("", False), ("12\n4", False), ("-124", False),
    ],
)  # fmt: skip
def test_correct_iff_the_stripped_completion_is_the_integer(task, output, correct):
    item = Item("arithmetic_chat", "add2", "p", "124")
    assert task.is_correct(item, output) is correct


def test_negative_answers_score(task):
    item = Item("arithmetic_chat", "sub2", "p", "-17")
    assert task.is_correct(item, "-17") and task.is_correct(item, " -017")
    assert not task.is_correct(item, "17")


class _Tok:
    """Just what StopRule reads: stop ids, eos, and a decode of one character per id."""

    eos_id, stop_ids = 2, frozenset({2, 3})

    def decode(self, ids):
        return "".join({4: "a", 5: "b", 6: "\n"}.get(i, "<E>") for i in ids)


def test_stop_rule_follows_the_task_declaration(task):
    tok = _Tok()
    chat = stop_rule(task, tok)
    assert chat == StopRule(ids=frozenset({2, 3}), text=None, max_new_tokens=32)
    assert chat.cut_ids([4, 5, 6, 4, 3, 4]) == [4, 5, 6, 4]  # cut at the first stop id
    assert chat.text_of(tok, [4, 5, 6, 4]) == "ab\na"  # newlines are part of a chat answer
    plain = stop_rule(get_task("arithmetic"), tok)
    assert plain == StopRule(ids=frozenset({2}), text="\n", max_new_tokens=8)
    assert plain.text_of(tok, [4, 5, 6, 4]) == "ab"


def test_a_chat_stop_without_stop_tokens_is_an_error(task):
    class NoStops:
        eos_id, stop_ids = None, frozenset()

    with pytest.raises(ValueError, match="declares no end-of-turn"):
        stop_rule(task, NoStops())
