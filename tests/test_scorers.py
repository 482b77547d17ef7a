"""Fair scorers: lookups accept every listed answer, and a change of verdict is classified as
valid / format / echo / shot / genuine on hand-made cases (cel_numpy.tasks.changes)."""

import pytest

from cel_numpy.tasks import Item, get_task
from cel_numpy.tasks.base import AnswerContext, answer_context
from cel_numpy.tasks.changes import CATEGORIES, classify_change, classify_changes, normalize

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
