"""One head notation: every spelling cel-numpy accepts, every one it refuses (in one line), and the
same notation through the Python API, the localization vocabulary and the command line."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pytest

import cel_numpy as cn
from cel_numpy.cli import main as run_cli
from cel_numpy.errors import InvalidHeadError, OptionError
from cel_numpy.heads import check_heads, head_name, heads_name, parse_head, parse_heads
from cel_numpy.localize.conditions import condition_name, normalize_condition

FIXTURES = Path(__file__).parent / "fixtures"

ACCEPTED = [
    ("L3H1", ((3, 1),)),
    ("l3h1", ((3, 1),)),
    ("  L3H1 ", ((3, 1),)),
    ("L10H11", ((10, 11),)),
    ("L3H1+L5H0", ((3, 1), (5, 0))),
    ("L5H0+L3H1", ((3, 1), (5, 0))),  # sorted
    ("L3H1,L5H0", ((3, 1), (5, 0))),
    ("L3H1 + L5H0", ((3, 1), (5, 0))),
    ("intact", ()),
    ("INTACT", ()),
    ((3, 1), ((3, 1),)),
    ([3, 1], ((3, 1),)),
    ((np.int64(3), np.int32(1)), ((3, 1),)),
    ([(3, 1)], ((3, 1),)),
    ([(5, 0), (3, 1)], ((3, 1), (5, 0))),
    ([[3, 1], [5, 0]], ((3, 1), (5, 0))),  # as JSON stores them
    (((3, 1), (5, 0)), ((3, 1), (5, 0))),
    (["L3H1", (5, 0)], ((3, 1), (5, 0))),
    (["L3H1+L5H0", "L7H2"], ((3, 1), (5, 0), (7, 2))),
    (np.array([[3, 1], [5, 0]]), ((3, 1), (5, 0))),
    (np.array([3, 1]), ((3, 1),)),
    ({(5, 0), (3, 1)}, ((3, 1), (5, 0))),  # any iterable of pairs
    ((), ()),
    ([], ()),
    (None, ()),
]

HOW = r"write heads as L3H1 \(layer 3, head 1, counted from 0\), several as L3H1\+L5H0"
REJECTED = [
    ("", r"an empty head list: " + HOW),
    ("   ", r"an empty head list"),
    ("3.1", r"'3\.1' is not a head name: write L3H1 for layer 3, head 1$"),
    ("3.1,5.0", r"'3\.1' is not a head name: write L3H1 for layer 3, head 1$"),
    ("L3", r"'L3' is not a head name: " + HOW),
    ("H1", r"'H1' is not a head name"),
    ("L3H", r"'L3H' is not a head name"),
    ("L3 H1", r"'L3 H1' is not a head name"),
    ("L3.H1", r"'L3\.H1' is not a head name"),
    ("L3H1H2", r"'L3H1H2' is not a head name"),
    ("L-1H0", r"'L-1H0' is not a head name"),
    ("L3H1+", r"'L3H1\+' has an empty name \(a \+ or , at an end, or two in a row\)"),
    ("L3H1++L5H0", r"'L3H1\+\+L5H0' has an empty name"),
    ("L0H0+" * 3000, r"'L0H0\+L0H0\+.{47}\.\.\.' has an empty name"),  # shown in 60 characters
    ("L\u0663H1", r"'L\u0663H1' is not a head name"),  # digits are ASCII digits
    ("1-2", r"'1-2' is not a head name"),
    ("head 3", r"'head 3' is not a head name"),
    ("L3H1+L3H1", r"L3H1 is given twice$"),
    ("L3H1,l3h1", r"L3H1 is given twice$"),
    ([(3, 1), "L3H1"], r"L3H1 is given twice$"),
    ((3,), r"\(3,\) is not a head: " + HOW + r", or as \(layer, head\) pairs$"),
    ((3, 1, 2), r"\(3, 1, 2\) is not a head"),
    ((3, 1.0), r"\(3, 1\.0\) is not a head"),
    ((True, 1), r"\(True, 1\) is not a head"),
    ((-1, 0), r"head \(-1, 0\) has a negative index"),
    ([(3, 1, 2)], r"\(3, 1, 2\) is not a head"),
    ([(3, 1), (4,)], r"\(4,\) is not a head"),
    ([3], r"\[3\] is not a head"),
    (5, r"5 is not a head"),
    (3.1, r"3\.1 is not a head"),
    ([("3", "1")], r"\('3', '1'\) is not a head"),
]


@pytest.mark.parametrize(("spec", "expected"), ACCEPTED, ids=lambda x: repr(x)[:30])
def test_every_accepted_spelling(spec, expected):
    assert parse_heads(spec) == expected
    assert normalize_condition(spec) == expected  # the localization vocabulary is the same parser


@pytest.mark.parametrize(("spec", "message"), REJECTED, ids=lambda x: repr(x)[:30])
def test_every_rejected_spelling_is_one_line(spec, message):
    with pytest.raises(OptionError, match=r"^--ablate: " + message) as err:
        parse_heads(spec, what="--ablate")
    assert "\n" not in str(err.value)
    with pytest.raises(ValueError):  # OptionError is a ValueError: older callers keep working
        normalize_condition(spec)


def test_names_round_trip():
    assert head_name((3, 1)) == "L3H1"
    assert heads_name(()) == "intact" == condition_name(())
    assert heads_name([(7, 1), (3, 5)]) == "L3H5+L7H1" == condition_name([(7, 1), (3, 5)])
    for spec, expected in ACCEPTED:
        if isinstance(spec, np.ndarray) or not hasattr(spec, "__len__"):
            continue
        assert parse_heads(heads_name(spec)) == expected
    assert parse_heads([(3, 1), (3, 1)], repeats=True) == ((3, 1),)


def test_parse_head_takes_exactly_one():
    assert parse_head("L3H1") == parse_head((3, 1)) == parse_head([(3, 1)]) == (3, 1)
    with pytest.raises(OptionError, match=r"^--head: takes one head, got L3H1\+L5H0"):
        parse_head("L3H1+L5H0", what="--head")
    with pytest.raises(OptionError, match=r"takes one head, got no head"):
        parse_head("intact")


def test_check_heads_names_the_missing_head():
    check_heads("L1H3", 2, 4)
    with pytest.raises(
        InvalidHeadError,
        match=r"^head L2H0 is not in the model: it has 2 layers x 4 heads, L0H0 to L1H3 "
        r"\(counted from 0\)$",
    ):
        check_heads([(1, 3), (2, 0)], 2, 4)
    with pytest.raises(InvalidHeadError, match=r"head L0H4 is not in the model"):
        check_heads("L0H4", 2, 4)


def test_model_api_takes_every_spelling():
    model = cn.load_model(FIXTURES / "tiny_llama")
    ids = [[1, 2, 3, 4]]
    expected = model.logits(ids, ablate=[(1, 2), (0, 1)])
    assert not np.array_equal(expected, model.logits(ids))
    for spec in ("L0H1+L1H2", "L1H2,L0H1", ["L1H2", (0, 1)], ((0, 1), (1, 2))):
        np.testing.assert_array_equal(model.logits(ids, ablate=spec), expected)
    single = model.logits(ids, ablate=[(1, 2)])
    np.testing.assert_array_equal(model.logits(ids, ablate=(1, 2)), single)
    np.testing.assert_array_equal(model.logits(ids, ablate="L1H2"), single)
    _, cache = model.run_with_cache(ids, ablate="L1H2")
    assert np.all(cache["blocks.1.attn.z_ablated"][:, 2] == 0)
    mz = model.mean_z(ids)
    np.testing.assert_array_equal(
        model.logits(ids, ablate="L1H2", ablation="mean", mean_z=mz),
        model.logits(ids, ablate=[(1, 2)], ablation="mean", mean_z=mz),
    )
    assert model.generate_ids(ids, 3, ablate="L0H1+L1H2") == model.generate_ids(
        ids, 3, ablate=[(0, 1), (1, 2)]
    )
    with pytest.raises(OptionError, match=r"^ablate: '3\.1' is not a head name"):
        model.logits(ids, ablate="3.1")
    with pytest.raises(InvalidHeadError, match=r"^ablate: head L2H0 is not in the model"):
        model.logits(ids, ablate="L2H0")


def test_localize_api_takes_names():
    from cel_numpy.localize import TheoryEvaluator, TheoryTask
    from cel_numpy.theory import TrainConfig, train

    config = TrainConfig(steps=50, log_every=50)
    params = train(config, np.random.default_rng(0)).params
    task = TheoryTask("A", config.world)
    ev = TheoryEvaluator(params, task)
    items = task.sample(np.random.default_rng(1), 16)
    by_pair = ev.evaluate_condition(items, ((0, 2),))
    assert ev.evaluate_condition(items, "L0H2") == by_pair
    assert ev.evaluate_many(items, ["L0H2", ((0, 2),)]) == [by_pair, by_pair]
    with pytest.raises(InvalidHeadError, match="head L1H0 is not in the model"):
        ev.evaluate_condition(items, "L1H0")


def test_cli_ablate_takes_names_and_prints_them(tmp_path, capsys):
    from cel_numpy.models.tokenizer import bytes_to_unicode

    folder = tmp_path / "tiny_gpt2_tok"  # tiny_gpt2 with a byte-level vocabulary, no merges
    shutil.copytree(FIXTURES / "tiny_gpt2", folder)
    b2u = bytes_to_unicode()
    (folder / "vocab.json").write_text(json.dumps({b2u[b]: b - 32 for b in range(32, 128)}))
    (folder / "merges.txt").write_text("#version: 0.2\n")
    assert run_cli(["generate", "--model", str(folder), "hi", "--ablate", "L1H2,L0H1"]) == 0
    out = capsys.readouterr().out
    assert "[ablated L0H1+L1H2 (zero)]" in out
    assert run_cli(["generate", "--model", str(folder), "hi", "--ablate", "3.1"]) == 2
    err = capsys.readouterr().err
    assert err == (
        "cel-numpy generate: error: --ablate: '3.1' is not a head name: "
        "write L3H1 for layer 3, head 1\n"
    )
