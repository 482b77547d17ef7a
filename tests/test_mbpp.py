"""The mbpp task: the released prompt (checked against lm-eval's rendering), the chat text with
the "[BEGIN]" prefill, the "[DONE]" stop, scoring by running the tests, panels by problem.

Fixture: tests/fixtures/mbpp_sample.json (six real MBPP test problems, the three prompt problems
and lm-eval's rendered prompts; written by scripts/write_mbpp_fixture.py).
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from cel_numpy import sandbox
from cel_numpy.errors import OptionError
from cel_numpy.tasks.mbpp import Mbpp, extract_program

FIXTURE = Path(__file__).parent / "fixtures" / "mbpp_sample.json"


@pytest.fixture(scope="module")
def mbpp_sample():
    return json.loads(FIXTURE.read_text())


# --------------------------------------------------------------------------- the mbpp task


def test_mbpp_prompt_equals_lm_evals_rendering(mbpp_sample):
    """The user message + the "[BEGIN]\\n" prefill is the context lm-eval's mbpp.yaml renders
    (the released code's prompt text), for every fixture problem."""
    task = Mbpp(mbpp_sample["rows"], mbpp_sample["prompt_rows"])
    for i, row in enumerate(mbpp_sample["rows"]):
        item = task.item_at("mbpp", i)
        assert item.prompt + task.prefill == mbpp_sample["contexts"][str(row["task_id"])]
        assert item.cluster == f"mbpp/{row['task_id']}"


def test_mbpp_default_prompt_is_the_released_one(mbpp_sample):
    """Without prompt rows, the task uses the shipped problems 2, 3, 4 (the released code's
    fewshot.py); its prompts equal lm-eval's rendering, an independent copy of those problems."""
    task = Mbpp(mbpp_sample["rows"])
    assert [r["task_id"] for r in task.prompt_rows()] == [2, 3, 4]
    for i, row in enumerate(mbpp_sample["rows"]):
        item = task.item_at("mbpp", i)
        assert item.prompt + task.prefill == mbpp_sample["contexts"][str(row["task_id"])]


def test_mbpp_scores_completions_by_running_their_tests(mbpp_sample, monkeypatch):
    monkeypatch.setenv(sandbox.CONSENT_VARIABLE, "1")
    task = Mbpp(mbpp_sample["rows"], mbpp_sample["prompt_rows"])
    item, row = task.item_at("mbpp", 1), mbpp_sample["rows"][1]
    gold = row["code"].replace("    ", "\t")  # tabs become four spaces, as in the released code
    assert task.is_correct(item, gold + "\n[DONE]\nprint(1/0)")  # text after [DONE] is dropped
    assert not task.is_correct(item, "def nothing():\n    pass\n")
    assert extract_program("a\tb[DONE]c[DONE]") == "a    b"


def test_mbpp_stops_at_done_or_end_of_turn():
    from cel_numpy.localize.scoring import stop_rule

    class Tok:
        stop_ids = (7, 8)

        @staticmethod
        def decode(ids):
            return "".join({1: "x = 1\n", 2: "[DONE]", 3: "\n\nmore"}[i] for i in ids)

    rule = stop_rule(Mbpp(), Tok())  # no data needed: nothing is loaded
    assert rule.ids == {7, 8} and rule.max_new_tokens == 256
    assert rule.text_of(Tok, [1, 2, 3]) == "x = 1\n"
    assert rule.is_done(Tok)([1, 2]) and not rule.is_done(Tok)([1])


def test_mbpp_panels_are_disjoint_by_problem(mbpp_sample):
    from cel_numpy.tasks import make_panels

    task = Mbpp(mbpp_sample["rows"], mbpp_sample["prompt_rows"])
    discovery, heldout = make_panels(task, 2, 4, seed=0)
    assert {it.cluster for it in discovery}.isdisjoint({it.cluster for it in heldout})
    assert len({it.cluster for it in discovery + heldout}) == 6


def test_mbpp_rows_of_the_wrong_shape_are_one_line_errors(mbpp_sample):
    with pytest.raises(OptionError, match="mbpp prompt rows: expected 3 problems, got 2"):
        Mbpp(mbpp_sample["rows"], mbpp_sample["prompt_rows"][:2])
    with pytest.raises(OptionError, match="problem 0 lacks test_list"):
        Mbpp([{"task_id": 1, "text": "t", "code": "c"}], mbpp_sample["prompt_rows"])


def test_the_model_reads_one_chat_turn_then_the_prefill(mbpp_sample, qwen2):
    """Qwen's own template (default system prompt, one user turn, the generation prompt), then
    "[BEGIN]\n"; the reference answer's tokens start right after it."""
    from cel_numpy.localize.evaluate import LMEvaluator
    from cel_numpy.localize.scoring import reference_ids

    task = Mbpp(mbpp_sample["rows"], mbpp_sample["prompt_rows"])
    ev = LMEvaluator(qwen2, task)
    item = task.item_at("mbpp", 0)
    text = ev.model_text(item.prompt)
    assert text == qwen2.chat([{"role": "user", "content": item.prompt}]) + "[BEGIN]\n"
    assert text.startswith("<|im_start|>system\n")
    assert text.endswith(item.prompt + "<|im_end|>\n<|im_start|>assistant\n[BEGIN]\n")
    assert text.count("<|im_start|>user") == 1
    prompt, answer = reference_ids(ev, item)
    assert prompt == qwen2.encode_chat_text(text)
    assert qwen2.tokenizer.decode(answer) == item.answer


def test_a_program_is_run_once_per_problem(mbpp_sample, monkeypatch):
    monkeypatch.setenv(sandbox.CONSENT_VARIABLE, "1")
    calls = []
    real = sandbox.run_program

    def counting(*args, **kwargs):
        calls.append(args[0])
        return real(*args, **kwargs)

    monkeypatch.setattr(sandbox, "run_program", counting)
    task = Mbpp(mbpp_sample["rows"], mbpp_sample["prompt_rows"])
    first, second = task.item_at("mbpp", 0), task.item_at("mbpp", 1)
    code = mbpp_sample["rows"][0]["code"]
    assert task.is_correct(first, code) and task.is_correct(first, code + "[DONE] later")
    assert not task.is_correct(second, code)  # the same program, another problem: run again
    assert len(calls) == 2
