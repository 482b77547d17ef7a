"""Fair scorers: lookups accept every listed answer, and a change of verdict is classified as
valid / format / echo / shot / genuine on hand-made cases (cel_numpy.tasks.changes)."""

import numpy as np
import pytest

from cel_numpy.localize.scoring import (
    LOGPROB_ROWS,
    continuation_log_softmax,
    continuation_logprob,
)
from cel_numpy.tasks import Item, get_task
from cel_numpy.tasks.base import AnswerContext, answer_context
from cel_numpy.tasks.changes import CATEGORIES, classify_change, classify_changes, normalize
from tests.test_localize import trained_theory  # noqa: F401

ANT = get_task("antonyms")
CAP = get_task("capitals")
NARROW = Item(
    "antonyms", "lookup", "hot -> cold\nrich -> poor\nday -> night\nnarrow ->", "wide",
    cluster="wide/narrow",
)  # fmt: skip
SOUTH_AFRICA = Item(
    "capitals", "lookup", "France: Paris\nCuba: Havana\nEgypt: Cairo\nSouth Africa:", "Pretoria"
)


def test_antonyms_accept_every_listed_answer():
    """narrow -> broad was scored wrong against the single reference "wide"; WordNet lists broad
    (the synset "wide, broad") as narrow's antonym, so it counts now. Exact match still."""
    assert ANT.accepted(NARROW)[0] == "wide" and "broad" in ANT.accepted(NARROW)
    for right in (" wide", " broad\nhot -> cold", " broad"):
        assert ANT.is_correct(NARROW, right), right
    for wrong in (" Broad", " broad.", " narrow", " cold", ""):
        assert not ANT.is_correct(NARROW, wrong), wrong


def test_capitals_accept_every_listed_capital_and_spelling():
    for right in (" Pretoria", " Cape Town", " Bloemfontein"):
        assert CAP.is_correct(SOUTH_AFRICA, right)
    assert not CAP.is_correct(SOUTH_AFRICA, " Johannesburg")
    bogota = CAP.item_at("lookup", [c for c, _ in CAP.pairs].index("Colombia"))
    assert bogota.answer == "Bogota"  # the shot shows plain ASCII
    assert CAP.is_correct(bogota, " Bogotá") and CAP.is_correct(bogota, " Bogota")


def test_answer_context_of_a_lookup():
    ctx = answer_context(ANT, NARROW)
    assert ctx.query == "narrow" and ctx.shot_answers == ("cold", "poor", "night")
    assert ctx.accepted == ANT.accepted(NARROW)
    plain = answer_context(get_task("arithmetic"), Item("arithmetic", "2+", "1 + 1 =", "2"))
    assert plain == AnswerContext("", (), ("2",))


@pytest.mark.parametrize(
    "wrong, category",
    [
        (" narrow", "echo"),  # "narrow -> narrow"
        (" Narrow.", "echo"),
        (" poor", "shot"),  # the second shot's answer
        (" Night", "shot"),
        (" Wide", "format"),
        (" wide.", "format"),
        (' "broad"', "format"),
        (" broad", "valid"),  # right under the list: a stricter scorer's verdict
        (" tall", "genuine"),
        (" hot", "genuine"),  # a shot's query, not its answer
        ("", "genuine"),
    ],
)
def test_classify_change_hand_made(wrong, category):
    assert classify_change(answer_context(ANT, NARROW), wrong) == category


def test_classify_change_capitals_and_order():
    ctx = answer_context(CAP, SOUTH_AFRICA)
    assert classify_change(ctx, " South Africa") == "echo"
    assert classify_change(ctx, " Havana") == "shot"
    assert classify_change(ctx, " Cape Town") == "valid"
    assert classify_change(ctx, " cape  town") == "format"
    assert classify_change(ctx, " Johannesburg") == "genuine"
    # a query that is also a shot's answer is an echo first (the order of CATEGORIES)
    both = AnswerContext("Paris", ("Paris",), ("Lyon",))
    assert classify_change(both, "Paris") == "echo"


def test_normalize():
    assert normalize("  Rome.") == "rome" and normalize("Bogotá") == "bogota"
    assert normalize('"Cape  Town"') == "cape town" and normalize("N'Djamena") == "n'djamena"


def test_classify_changes_counts_only_changed_verdicts():
    ctx = answer_context(ANT, NARROW)
    intact = [(False, " narrow"), (True, " wide"), (False, " poor"), (True, " wide"), (False, "x")]
    ablated = [(True, " wide"), (False, " Wide"), (True, " broad"), (True, " broad"), (False, "y")]
    counts = classify_changes([ctx] * 5, intact, ablated)
    assert counts["rescued"] == dict.fromkeys(CATEGORIES, 0) | {"echo": 1, "shot": 1}
    assert counts["damaged"] == dict.fromkeys(CATEGORIES, 0) | {"format": 1}


def test_recurrence_counts_independent_searches_only():
    """summarize: recurrence over searches whose panels share no cluster with the searches kept
    before them (in table order); overlapping runs and test-heads runs are left out."""
    from cel_numpy.localize.summary import head_recurrence

    def row(primary, clusters, kind="localize"):
        return {"kind": kind, "model": "m", "task": "capitals", "primary": primary,
                "finalists": [primary], "clusters": clusters}  # fmt: skip

    rows = [
        row("L1H1+L2H2", ["France", "Peru"]),  # fold 0
        row("L1H1", ["Chile", "Japan"]),  # fold 1
        row("L1H1", ["Japan", "Cuba"]),  # shares Japan with the second: left out
        row("L1H1", ["France"]),  # nested in the first: left out
        row("L1H1", ["Oman"], kind="test-heads"),  # a given set: never counted
        row("L2H2", ["Cuba"]),  # the third was left out, so Cuba is free
    ]
    rec = head_recurrence(rows)["capitals"]
    assert rec["runs"] == 3 and rec["not_independent"] == 2
    assert rec["primary"] == {"L1H1": 2, "L2H2": 2}


# --------------------------------------------------------------------------- resample ablation


def test_resample_donors_are_a_seeded_derangement_across_clusters():
    from cel_numpy.errors import UserError
    from cel_numpy.localize.resample import resample_donors

    clusters = ["a"] * 3 + ["b"] * 2 + ["c"] * 4 + ["d"] * 5 + [f"s{i}" for i in range(6)]
    for seed in range(20):
        d = resample_donors(clusters, seed)
        assert sorted(d.tolist()) == list(range(len(clusters)))  # a permutation
        assert all(clusters[i] != clusters[j] for i, j in enumerate(d))  # never its own cluster
    assert resample_donors(clusters, 1).tolist() == resample_donors(clusters, 1).tolist()
    assert resample_donors(clusters, 1).tolist() != resample_donors(clusters, 2).tolist()
    assert resample_donors(["x", "y"], 0).tolist() == [1, 0]
    with pytest.raises(UserError, match="largest cluster 3"):
        resample_donors(["a", "a", "a", "b", "c"], 0)


def test_theory_resample_takes_the_donors_head_outputs(trained_theory):  # noqa: F811
    """TheoryEvaluator: a removed head outputs what it outputs on the donor sample."""
    import numpy as np

    from cel_numpy.localize.evaluate import TheoryEvaluator, TheoryTask, items_to_batch
    from cel_numpy.localize.resample import resample_donors
    from cel_numpy.theory.model import theory_forward

    params, world = trained_theory
    task = TheoryTask("A", world)
    items = task.sample(np.random.default_rng(0), 40)
    ev = TheoryEvaluator(params, task, ablation="resample", resample_seed=4)
    _, cache = theory_forward(ev.params, items_to_batch(items))
    o = cache.head_outputs  # (B, H)
    donors = resample_donors([it.cluster for it in items], 4)
    expected = o.sum(axis=1) - o[:, 1] + o[donors, 1]
    np.testing.assert_allclose(ev.predict(items, ((0, 1),)), expected, atol=1e-12)
    np.testing.assert_allclose(ev.predict(items, ()), o.sum(axis=1), atol=1e-12)
    # a slice of the panel (`rows`, as the routine asks for a large one) keeps the panel's donors
    whole = ev.evaluate_many(items, [((0, 1),)])[0]
    parts = [ev.evaluate_many(items, [((0, 1),)], rows=r)[0] for r in (range(15), range(15, 40))]
    assert parts[0] + parts[1] == whole
    assert ev.evaluate_many(items[:15], [((0, 1),)])[0] != parts[0]  # its own donors differ


def test_cli_test_heads_three_ablations_on_the_theory_model(tmp_path, trained_theory, capsys):  # noqa: F811
    """--ablation zero|mean|resample on one held-out panel; the manifest records the kind."""
    import json

    import numpy as np

    from cel_numpy.cli import main

    params, _ = trained_theory
    np.savez(tmp_path / "params.npz", K=params["K"], V=params["V"])
    gains = {}
    for kind in ("zero", "mean", "resample"):
        out = tmp_path / kind
        argv = ["test-heads", "--model", f"theory:{tmp_path / 'params.npz'}", "--task", "A",
                "--heads", "L0H0", "--heldout", "120", "--seed", "2", "--ablation", kind,
                "--out", str(out), "--quiet"]  # fmt: skip
        assert main(argv) == 0
        manifest = json.loads((out / "manifest.json").read_text())
        assert manifest["model"]["ablation"] == kind
        assert ("resample_seed" in manifest["model"]) == (kind == "resample")
        report = json.loads((out / "report.json").read_text())
        gains[kind] = report["primary"]["heldout"]["gain"]
        assert set(report["primary"]["changes"]) == {"rescued", "damaged"}
    capsys.readouterr()
    assert len(set(gains.values())) > 1, gains  # three interventions, not one


# --------------------------------------------------------------------------- answer balance


def _yes_no(answer: str, k: int) -> Item:
    return Item("boolq", "all", f"passage {k}\nQuestion: q{k}?\nAnswer:", answer, (" no", " yes"))


def test_answer_balance_hand_made():
    """Two "yes" and two "no" items; the intact model always says " no", the ablated one says
    " yes" three times: both "yes" items gained, one "no" item lost -- a bias shift, by hand."""
    from cel_numpy.tasks.changes import answer_balance

    items = [_yes_no(" yes", 0), _yes_no(" yes", 1), _yes_no(" no", 2), _yes_no(" no", 3)]
    intact = [(False, " no"), (False, " no"), (True, " no"), (True, " no")]
    ablated = [(True, " yes"), (True, " yes"), (False, " yes"), (True, " no")]
    assert answer_balance(items, intact, ablated) == [
        {"label": " no", "items": 2, "intact_correct": 2, "ablated_correct": 1,
         "intact_picked": 4, "ablated_picked": 1},
        {"label": " yes", "items": 2, "intact_correct": 0, "ablated_correct": 2,
         "intact_picked": 0, "ablated_picked": 3},
    ]  # fmt: skip


def test_answer_balance_only_for_a_fixed_choice_set():
    from cel_numpy.tasks.changes import answer_balance

    endings = (
        Item("hellaswag", "all", "ctx", " b", (" a", " b")),
        Item("hellaswag", "all", "x", " c", (" c", " d")),
    )
    both = [(True, " b"), (True, " c")]
    assert answer_balance(endings, both, both) is None  # choices differ per item: no labels
    assert answer_balance([NARROW], [(False, "narrow")], [(True, "wide")]) is None  # generate
    assert answer_balance([], [], []) is None
    yes_no = [_yes_no(" yes", 0), _yes_no(" no", 1)]
    right = [(True, " yes"), (True, " no")]
    assert answer_balance(yes_no, right, right) is not None
    assert answer_balance(yes_no[:1], right[:1], right[:1]) is None  # one item: no label set
    # a task scoring by its own rule may accept a pick outside the choices: no balance, no crash
    assert answer_balance(yes_no, right, [(True, " maybe"), (True, " no")]) is None
    assert answer_balance([_yes_no("yes", 0), yes_no[1]], right, right) is None  # reference too


@pytest.mark.parametrize("A", [1, 31, 32, 33, 100])
@pytest.mark.parametrize("V", [7, 1001])
def test_continuation_logprob_in_row_chunks_equals_the_whole_log_softmax(A, V):
    """continuation_logprob computes LOGPROB_ROWS rows at a time; its total is the whole
    (A, V) log-softmax's bit for bit, and log-sum-exp by np.logaddexp.reduce agrees."""
    assert LOGPROB_ROWS == 32  # the sizes above straddle one chunk
    rng = np.random.default_rng(A * V)
    logits = (rng.standard_normal((A + 3, V)) * 4).astype(np.float32)  # (N, V), right-aligned
    targets = rng.integers(0, V, size=A)
    got = continuation_logprob(logits, targets)
    assert got == continuation_log_softmax(logits, targets)[1]
    rows = logits[2 : 2 + A].astype(np.float64)  # rows N-1-A .. N-2 predict the targets
    ref = sum(r[t] - np.logaddexp.reduce(r) for r, t in zip(rows, targets))
    assert abs(got - ref) < 1e-9 * A
    with pytest.raises(ValueError, match="continuation tokens need"):
        continuation_logprob(logits[:A], targets)
