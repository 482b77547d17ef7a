"""Tasks from JSONL files (`--task path/to/items.jsonl`): reading, bad input, panels, end to end.

A bad file is refused before any work with a one-line error naming the file and the line; a
run records the file's sha256, so resuming it on a changed file is refused.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
from pathlib import Path

import numpy as np
import pytest
from helpers import copy_fixture, rewrite_safetensors, run_cli, with_tokenizer

from cel_numpy.errors import OptionError
from cel_numpy.localize.evaluate import LMEvaluator
from cel_numpy.localize.routine import test_heads
from cel_numpy.tasks import EXAMPLES, FileTask, get_task, make_panels

CHOICE = [
    {"options": {"name": "colours", "separator": " "}},
    {"id": "a", "prompt": "The sky is", "choices": ["blue", "green"], "answer": 0},
    {"id": "b", "prompt": "Grass is", "choices": ["blue", "green"], "answer": 1, "cluster": "g"},
    {"id": 3, "prompt": "Snow is", "choices": ["white", "black", "red"], "answer": 0},
]


def write(tmp_path, rows, name="items.jsonl"):
    path = tmp_path / name
    path.write_text("".join((r if isinstance(r, str) else json.dumps(r)) + "\n" for r in rows))
    return path


def test_choice_items_with_options_and_clusters(tmp_path):
    task = FileTask(write(tmp_path, CHOICE))
    assert (task.name, task.scoring, task.normalize) == ("colours", "choice", "none")
    first = task.items[0]
    assert first.choices == (" blue", " green") and first.answer == " blue"
    assert [it.cluster for it in task.items] == ["a", "g", "3"]  # default: the item's id
    assert task.is_correct(first, " blue") and not task.is_correct(first, " green")
    assert task.identity()["file_sha256"] == task.sha256 and len(task.sha256) == 64


def test_generate_items_accept_several_answers_and_a_stop_text(tmp_path):
    rows = [
        {"options": {"stop_text": ";", "max_new_tokens": 5}},
        {"id": 1, "prompt": "2 + 2 =", "answer": "4", "answers": ["four"]},
    ]
    task = FileTask(write(tmp_path, rows, "sums.jsonl"))
    assert (task.name, task.scoring, task.max_new_tokens, task.stop) == (
        "sums",
        "generate",
        5,
        "text",
    )
    item = task.items[0]
    assert task.is_correct(item, " 4 ") and task.is_correct(item, "four")
    assert not task.is_correct(item, "5")

    from cel_numpy.localize.scoring import stop_rule

    class Tok:
        eos_id = 0

    rule = stop_rule(task, Tok())
    assert rule.text == ";" and rule.max_new_tokens == 5


Z = {"id": "z", "prompt": "x", "choices": ["a", "b"], "answer": 0}
BAD = [  # (the third line of a file, what its error says)
    ('{"id": "z", "prompt": "x"', "not valid JSON"),
    (CHOICE[1], "duplicate id 'a' (first on line 1)"),
    (dict(CHOICE[1], id="copy"), "the same prompt and answer as line 1"),
    (dict(Z, prompt="  "), "the prompt must be a non-empty string"),
    (dict(Z, answer=2), "answer index 2 is out of range for 2 choices"),
    (dict(Z, answer="a"), "answer must be the index of the correct choice"),
    (dict(Z, choices=["a", "a"]), "two choices are the same text"),
    ({"id": "z", "prompt": "x", "choices": ["a", "b"]}, "missing key 'answer'"),
    (dict(Z, clster=1), "unknown key 'clster'"),
    ({"id": "z", "prompt": "x", "answer": "y"}, "a generate item in a file of choice items"),
    ([1, 2], "a line must be a JSON object"),
    (
        '{"id": "z", "prompt": "x", "id": "y", "choices": ["a", "b"], "answer": 0}',
        "key 'id' is given twice in one object",
    ),  # fmt: skip
    ({"options": {"normalize": "chars"}}, "the options line must be the file's first line"),
    (json.dumps(Z) + "\u2028", "not valid JSON"),  # JSON allows no U+2028 outside a string
]


@pytest.mark.parametrize("bad, message", BAD, ids=[m for _, m in BAD])
def test_a_bad_line_is_one_line_naming_file_and_line(tmp_path, bad, message):
    path = write(tmp_path, [CHOICE[1], CHOICE[2], bad])
    with pytest.raises(OptionError) as err:
        FileTask(path)
    text = str(err.value)
    assert text.startswith(f"{path}:3: ") and message in text and "\n" not in text, text


def test_a_byte_order_mark_before_the_first_line_is_no_part_of_it(tmp_path):
    """Editors on Windows may save UTF-8 with a byte-order mark: the items are the same, and
    the recorded sha256 is still the file's own bytes."""
    plain = write(tmp_path, [CHOICE[1], CHOICE[2]], "plain.jsonl")
    marked = tmp_path / "marked.jsonl"
    marked.write_bytes(b"\xef\xbb\xbf" + plain.read_bytes())
    a, b = FileTask(plain), FileTask(marked)
    assert [(it.prompt, it.choices, it.answer) for it in a.items] == [
        (it.prompt, it.choices, it.answer) for it in b.items
    ]
    assert b.sha256 == hashlib.sha256(marked.read_bytes()).hexdigest() != a.sha256


@pytest.mark.parametrize(
    "options, message",
    [
        ({"normalise": "chars"}, "unknown option 'normalise'"),
        ({"normalize": "tokens"}, "option normalize = 'tokens' is not allowed"),
        ({"max_new_tokens": 0}, "option max_new_tokens = 0"),
        ({"scoring": "generate"}, "the options say scoring 'generate'"),
        ({"name": "two\nlines"}, "option name = 'two"),  # a report's header is one line
    ],
)
def test_bad_options_name_the_line(tmp_path, options, message):
    path = write(tmp_path, [{"options": options}, CHOICE[1]])
    with pytest.raises(OptionError, match=message) as err:
        FileTask(path)
    assert str(err.value).startswith(f"{path}:1: ")


def test_cli_refuses_a_bad_file_with_exit_2_before_any_work(tmp_path):
    bad = write(
        tmp_path, [CHOICE[1], {"id": "b", "prompt": "", "choices": ["x", "y"], "answer": 0}]
    )
    out = tmp_path / "run"
    for command in ("localize", "test-heads"):
        argv = [command, "--model", "smollm2", "--task", str(bad), "--out", str(out)]
        argv += ["--heads", "L0H0"] if command == "test-heads" else []
        status, err = run_cli(argv)
        assert status == 2 and f"{bad}:2: the prompt must be a non-empty string" in err, err
        assert len(err.strip().splitlines()) == 1 and not out.exists()
    status, err = run_cli(
        ["localize", "--model", "smollm2", "--task", "nothere.jsonl", "--out", str(out)]
    )
    assert status == 2 and "nothere.jsonl: cannot read the task file" in err


def test_example_files_parse_and_split_into_cluster_disjoint_panels():
    opposites, plurals = (
        get_task(str(EXAMPLES / "opposites.jsonl")),
        FileTask(EXAMPLES / "plurals.jsonl"),
    )
    assert (opposites.scoring, len(opposites.items)) == ("choice", 24)
    assert (plurals.scoring, len(plurals.items)) == ("generate", 12)
    d, h = make_panels(opposites, 8, 12, seed=0)
    assert not {it.cluster for it in d} & {it.cluster for it in h}
    assert all(sum(it.cluster == c for it in d + h) in (1, 2) for c in {it.cluster for it in d})
    with pytest.raises(OptionError, match="too few for 20 \\+ 5 items"):
        make_panels(opposites, 20, 5, seed=0)  # 24 items, but clusters of two stay whole


def test_test_heads_end_to_end_and_a_changed_file_refuses_resume(tmp_path):
    """On the tiny Llama fixture with a character vocabulary: the CLI runs a task file, records
    its sha256, resumes on the same file and refuses a changed one."""
    model = with_tokenizer(copy_fixture(tmp_path, "tiny_llama"))
    rows = [{"options": {"separator": " "}}]
    rows += [
        {"id": k, "prompt": f"Item {k} says", "choices": ["yes", "no", "maybe"], "answer": k % 3}
        for k in range(16)
    ]
    path = write(tmp_path, rows, "tiny.jsonl")
    out = tmp_path / "run"
    argv = ["test-heads", "--model", str(model), "--task", str(path), "--heads", "L0H1",
            "--discovery", "4", "--heldout", "10", "--out", str(out), "--quiet"]  # fmt: skip
    status, err = run_cli(argv)
    assert status == 0, err
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["task"]["file_sha256"] == FileTask(path).sha256
    assert manifest["task_file"] == str(path) and manifest["task"]["name"] == "tiny"
    assert run_cli(argv)[0] == 0  # the same file: resumes
    write(tmp_path, rows[:-1], "tiny.jsonl")  # one item fewer
    status, err = run_cli(argv)
    assert status == 2 and "describes a different run (task.file_sha256" in err, err


def test_python_api_takes_a_task_file_path(tmp_path):
    """`test_heads(..., task="path.jsonl")`: the evaluator gets the FileTask (fast engine)."""
    from helpers import planted_model

    model = planted_model(np.random.default_rng(0))
    alphabet_ok = [{"id": k, "prompt": "ab" * (k + 1), "choices": ["a", "b"], "answer": k % 2}
                   for k in range(12)]  # fmt: skip
    path = write(tmp_path, alphabet_ok, "ab.jsonl")
    seen = []

    def make(task, ref):
        seen.append(task)
        return LMEvaluator(model, task, batch_size=4)

    res = test_heads(tmp_path / "run", make, str(path), "L1H1", n_discovery=4, n_heldout=6,
                     seed=0, progress=False, command="test")  # fmt: skip
    assert isinstance(seen[0], FileTask) and seen[0].name == "ab"
    assert res["heldout"]["heldout"]["finalists"][0]["name"] == "L1H1"


def test_folds_of_an_item_list_share_no_cluster(tmp_path):
    """Independent replications on a file task: the panels of fold 0 and fold 1 of 2 share no
    cluster, whatever the panel seeds; each fold holds only its own clusters; fold counts
    that leave a fold fewer than two clusters are refused."""
    rows = [
        {"id": f"q{i}", "prompt": f"Item {i} is", "answer": f"a{i}", "cluster": f"c{i // 2}"}
        for i in range(80)
    ]
    task = FileTask(write(tmp_path, rows))
    clusters = []
    for k, seed in ((0, 0), (1, 7)):
        d, h = make_panels(task, 8, 12, seed, fold=(k, 2))
        assert not {it.cluster for it in d} & {it.cluster for it in h}
        clusters.append({it.cluster for it in d + h})
    assert not clusters[0] & clusters[1], "two folds drew the same cluster"
    again = make_panels(task, 8, 12, 3, fold=(0, 2))
    assert {it.cluster for it in again[0] + again[1]} <= {
        it.cluster for it in task.items if it.cluster not in clusters[1]
    }
    with pytest.raises(OptionError, match="folds leave fold"):
        make_panels(task, 1, 1, 0, fold=(0, 80))


def test_measure_benchmarks_two_processes_merge_and_refuse_other_settings(tmp_path):
    """scripts/measure_benchmarks.py accuracy from both ends of one order: a process with
    `--from-end --merge` computes only the items the other's file lacks, and both files end
    with every item once, equal to one process's; files with other settings are refused."""
    import runpy

    script = runpy.run_path(str(Path(__file__).parents[1] / "scripts" / "measure_benchmarks.py"))
    model = with_tokenizer(copy_fixture(tmp_path, "tiny_llama"))
    rows = [{"id": k, "prompt": f"Item {k} says", "choices": ["yes", "no"], "answer": k % 2}
            for k in range(13)]  # fmt: skip
    task = tmp_path / "tiny.jsonl"
    task.write_text("".join(json.dumps(r) + "\n" for r in rows))
    base = ["accuracy", "--model", str(model), "--task", str(task), "--chunk", "4"]
    a, b, single = (tmp_path / name for name in ("a.jsonl", "b.jsonl", "single.jsonl"))
    script["main"]([*base, "--out", str(single)])
    read = lambda p: [json.loads(line) for line in p.read_text().splitlines()]
    # the first process stopped after one chunk (the order's first 4 items)
    a.write_text("".join(json.dumps(r) + "\n" for r in read(single)[:4]))
    script["settings_path"](a).write_text(script["settings_path"](single).read_text())
    script["main"]([*base, "--out", str(b), "--merge", str(a), "--from-end"])
    computed = [r["id"] for r in read(b)[:9]]  # b's own rows come first, a's are appended
    assert computed == [r["id"] for r in read(single)[4:]][::-1]
    script["main"]([*base, "--out", str(a), "--merge", str(b)])  # takes in b's rows
    by_id = lambda p: {r["id"]: r for r in read(p)}
    assert by_id(a) == by_id(b) == by_id(single) and len(read(a)) == len(read(b)) == 13
    with pytest.raises(SystemExit, match=r"seed 0 there, 1 here\): check --merge"):
        script["main"]([*base, "--out", str(tmp_path / "c.jsonl"), "--merge", str(a),
                        "--seed", "1"])  # fmt: skip
    assert not script["settings_path"](tmp_path / "c.jsonl").exists()  # a refused run writes none
    with pytest.raises(SystemExit, match=r"model .* there, 'smollm2' here\): check --out"):
        script["main"](["accuracy", "--task", str(task), "--out", str(a)])
    (tmp_path / "old.jsonl").write_text(a.read_text())  # results without a settings file
    with pytest.raises(SystemExit, match=r"has results but no old.jsonl.settings.json"):
        script["main"]([*base, "--out", str(tmp_path / "d.jsonl"), "--merge",
                        str(tmp_path / "old.jsonl")])  # fmt: skip


def test_lines_end_at_newlines_only(tmp_path):
    """U+2028, U+0085 and a form feed inside a JSON string are text, not line ends (Python's
    str.splitlines cuts at them): the prompts keep them, and a later bad line is still named by
    its own number, as `grep -n` and editors count."""
    odd = dict(Z, id="odd", prompt="one\u2028two\x85three\x0cfour")
    path = tmp_path / "items.jsonl"
    lines = [json.dumps(CHOICE[1]), json.dumps(odd, ensure_ascii=False), json.dumps(CHOICE[2])]
    path.write_text("\r\n".join(lines) + "\r\n", encoding="utf-8")
    task = FileTask(path)
    assert [it.prompt for it in task.items][1] == odd["prompt"] and len(task.items) == 3
    path.write_text("\n".join([*lines, json.dumps(dict(Z, answer=5))]) + "\n", encoding="utf-8")
    with pytest.raises(OptionError, match="answer index 5") as err:
        FileTask(path)
    assert str(err.value).startswith(f"{path}:4: "), err.value


def test_a_byte_that_is_not_utf8_is_named_by_its_line(tmp_path):
    path = tmp_path / "items.jsonl"
    good = (json.dumps(CHOICE[1]) + "\n" + json.dumps(CHOICE[2]) + "\n").encode()
    before = b'{"id": "c", "prompt": "caf'  # then a Latin-1 e-acute, which UTF-8 never is
    path.write_bytes(good + before + b'\xe9", "choices": ["a", "b"], "answer": 0}\n')
    with pytest.raises(OptionError) as err:
        FileTask(path)
    byte = len(good) + len(before)
    said = f"{path}:3: not UTF-8 text (byte {byte}); save the file as UTF-8"
    assert str(err.value) == said


def test_a_prompt_too_long_for_the_context_names_its_line_and_item(tmp_path):
    """The tiny Llama's context is 64 tokens: a prompt of 3 million characters is refused by
    its length alone, and a generate item whose prompt fits but whose max_new_tokens does not
    is refused naming max_new_tokens; both name the item's line and id, exit 2, before any
    work."""
    model = with_tokenizer(copy_fixture(tmp_path, "tiny_llama"))
    rows = [
        {"id": k, "prompt": f"Item {k} is", "choices": ["a", "b"], "answer": 0} for k in range(12)
    ]
    rows[5] = dict(rows[5], prompt="x" * 3_000_000)
    path = write(tmp_path, rows, "long.jsonl")
    argv = ["test-heads", "--model", str(model), "--task", str(path), "--heads", "L0H1",
            "--discovery", "4", "--heldout", "8", "--out", str(tmp_path / "refused")]  # fmt: skip
    status, err = run_cli(argv)
    assert status == 2 and re.search(
        rf"error: {re.escape(str(path))}:6: item '5' \((discovery|heldout) panel\): its prompt "
        r"is 3,000,001 characters",  # with its longest choice
        err,
    ), err
    gen = [{"options": {"max_new_tokens": 1000}}]
    gen += [{"id": k, "prompt": f"Item {k} says", "answer": "ab"} for k in range(12)]
    write(tmp_path, gen, "long.jsonl")
    status, err = run_cli(argv)
    assert status == 2 and re.search(
        rf"error: {re.escape(str(path))}:[0-9]+: item '[0-9]+' \((discovery|heldout) panel\): "
        r"a prompt "
        r"needs [0-9]+ tokens with its answer \([0-9]+ for the prompt, max_new_tokens 1000 for "
        r"the answer\), more than the model's context of 64 tokens: lower max_new_tokens in the "
        r"file's options line",
        err,
    ), err
    assert "\n" not in err.strip() and not (tmp_path / "refused").exists()


def test_a_device_or_fifo_is_refused_before_it_is_read(tmp_path):
    """/dev/zero never ends and a FIFO blocks forever: both are refused by their file kind."""
    fifo = tmp_path / "items.jsonl"
    os.mkfifo(fifo)
    for path, kind in ((fifo, "a FIFO"), (Path("/dev/zero"), "a character device")):
        with pytest.raises(OptionError) as err:
            FileTask(path)
        assert str(err.value).startswith(f"{path}: {kind}, not a regular file"), err.value


def test_a_task_file_over_the_size_cap_is_refused(tmp_path, monkeypatch):
    from cel_numpy.tasks import filetask

    path = write(tmp_path, CHOICE)
    monkeypatch.setattr(filetask, "MAX_TASK_FILE_BYTES", path.stat().st_size - 1)
    with pytest.raises(OptionError, match=r"bytes, more than a task file can be"):
        FileTask(path)


@pytest.mark.parametrize(
    "line, message",
    [
        ("[" * 100_000 + "]" * 100_000, "JSON nested too deeply"),
        (
            '{"id": 1, "prompt": "x", "choices": ["a", "b"], "answer": ' + "9" * 5000 + "}",
            "an integer of more than 4,300 digits",
        ),
        (
            '{"id": 1, "prompt": "\\ud800", "choices": ["a", "b"], "answer": 0}',
            "half of a surrogate pair",
        ),
    ],
    ids=["nesting", "huge integer", "lone surrogate"],
)
def test_json_the_parser_refuses_is_one_line_naming_file_and_line(tmp_path, line, message):
    path = tmp_path / "items.jsonl"
    path.write_text(json.dumps(CHOICE[1]) + "\n" + line + "\n")
    with pytest.raises(OptionError) as err:
        FileTask(path)
    text = str(err.value)
    assert text.startswith(f"{path}:2: ") and message in text and "\n" not in text, text


def test_an_answer_longer_than_max_new_tokens_is_refused_naming_the_item(tmp_path):
    """The tiny Llama's vocabulary is characters: an answer of 6 letters needs 6 tokens (the
    separator's space joins the prompt), more than max_new_tokens 3, unless a shorter accepted
    answer fits."""
    model = with_tokenizer(copy_fixture(tmp_path, "tiny_llama"))
    rows = [{"options": {"separator": " ", "max_new_tokens": 3}}]
    rows += [{"id": k, "prompt": f"Item {k} says", "answer": "ab"} for k in range(11)]
    rows += [{"id": "long", "prompt": "Item L says", "answer": "abcdef", "answers": ["ab"]}]
    path = write(tmp_path, rows, "gen.jsonl")
    argv = ["test-heads", "--model", str(model), "--task", str(path), "--heads", "L0H1",
            "--discovery", "4", "--heldout", "8", "--out", str(tmp_path / "ok")]  # fmt: skip
    status, err = run_cli(argv)
    assert status == 0, err  # "ab" fits
    rows[-1] = {"id": "long", "prompt": "Item L says", "answer": "abcdef"}
    write(tmp_path, rows, "gen.jsonl")
    argv[argv.index("--out") + 1] = str(tmp_path / "refused")
    status, err = run_cli(argv)
    assert status == 2 and re.search(
        r"gen\.jsonl:13: item 'long' \((discovery|heldout) panel\) of task 'gen' needs 6 tokens",
        err,
    ), err
    assert "more than max_new_tokens 3: it could never be scored correct" in err
    assert not (tmp_path / "refused").exists()


def test_a_fold_too_small_at_two_folds_does_not_advise_fewer_folds(tmp_path):
    """Three clusters in two folds leave one fold a single cluster; --folds 2 is the least, so
    the advice is to run without folds (at --folds 3 and more: fewer folds)."""
    from cel_numpy.tasks.panels import check_fold

    rows = [{"id": k, "prompt": f"Item {k} says", "choices": ["a", "b"], "answer": 0,
             "cluster": f"c{k % 3}"} for k in range(9)]  # fmt: skip
    task = FileTask(write(tmp_path, rows))
    messages = []
    for fold in [(k, 2) for k in range(2)] + [(k, 3) for k in range(3)]:
        try:
            check_fold(task, fold)
        except OptionError as err:
            messages.append((fold[1], str(err)))
    assert any(K == 2 for K, _ in messages) and any(K == 3 for K, _ in messages), messages
    for K, text in messages:
        fix = "run without --fold and --folds, or add clusters" if K == 2 else "use fewer --folds"
        assert text.endswith(fix), text


def test_an_answer_a_space_merges_into_counts_the_tokens_generation_needs(tmp_path):
    """With the merge " ta" (one token) the bare answer "ta" is two tokens but the model can
    write " ta", which is correct once stripped: one token, so max_new_tokens 1 is enough. With
    the separator " " the prompt's trailing space must not be counted as if it were free: "tt"
    after a space is " t" + "t", two tokens, more than 1."""
    from helpers import tiny_chat_model

    from cel_numpy.models.tokenizer import bytes_to_unicode

    folder = tiny_chat_model(tmp_path / "m", "x")
    spec = json.loads((folder / "tokenizer.json").read_text())
    space = bytes_to_unicode()[32]
    spec["model"]["vocab"][space + "ta"] = 96  # a 97th token: one more embedding row
    spec["model"]["merges"] += [f"{space}t a"]
    (folder / "tokenizer.json").write_text(json.dumps(spec))
    config = json.loads((folder / "config.json").read_text())
    (folder / "config.json").write_text(json.dumps({**config, "vocab_size": 97}))

    def one_more_row(w):
        for name in ("lm_head.weight", "model.embed_tokens.weight"):
            w[name] = np.concatenate([w[name], w[name][:1]])

    rewrite_safetensors(folder, one_more_row)

    def run(options, answer, out):
        rows = [{"options": {"max_new_tokens": 1, **options}}]
        rows += [{"id": k, "prompt": f"Item {k} says", "answer": answer} for k in range(12)]
        path = write(tmp_path, rows, "gen.jsonl")
        argv = ["test-heads", "--model", str(folder), "--task", str(path), "--heads", "L0H1",
                "--discovery", "4", "--heldout", "8", "--out", str(tmp_path / out)]  # fmt: skip
        return run_cli(argv)

    status, err = run({}, "ta", "merged")
    assert status == 0, err
    status, err = run({"separator": " "}, "tt", "unmerged")
    assert status == 2 and "needs 2 tokens for its shortest answer" in err, err
