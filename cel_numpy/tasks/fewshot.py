"""Few-shot lookups: country capitals and antonyms.

    capitals  "France: Paris\\nJapan: Tokyo\\nEgypt: Cairo\\nItaly:"  -> " Rome"
    antonyms  "hot -> cold\\nrich -> poor\\nday -> night\\nwet ->"     -> " dry"

Each prompt is three shots (an ordered choice of three other entries, never the query's own
entry) followed by the query. Antonym queries run in both directions ("wet -> dry" and
"dry -> wet"); shots are shown in the table's direction.
Scoring ("generate"): the continuation up to the first newline, stripped, must equal the answer
exactly (case-sensitive, no trailing punctuation tolerated). The tables keep only entries with
one unambiguous answer in plain ASCII (no "New Delhi"/"Delhi", "Kyiv"/"Kiev", "Brasília").

Template space: capitals 70 queries * 69 * 68 * 67 shot arrangements = 22,005,480;
antonyms 2 * 50 directed queries * 49 * 48 * 47 = 11,054,400. Distinct items can share a query
with different shots; panels are disjoint by item, not by query.
"""

from __future__ import annotations

from cel_numpy.tasks.base import Item
from cel_numpy.tasks.template import TemplateTask, n_arrangements, unrank_arrangement

CAPITALS = (
    ("France", "Paris"), ("Japan", "Tokyo"), ("Italy", "Rome"), ("Germany", "Berlin"),
    ("Spain", "Madrid"), ("Russia", "Moscow"), ("China", "Beijing"), ("Egypt", "Cairo"),
    ("Greece", "Athens"), ("Portugal", "Lisbon"), ("Ireland", "Dublin"), ("Poland", "Warsaw"),
    ("Austria", "Vienna"), ("Hungary", "Budapest"), ("Sweden", "Stockholm"), ("Norway", "Oslo"),
    ("Finland", "Helsinki"), ("Denmark", "Copenhagen"), ("Belgium", "Brussels"),
    ("Romania", "Bucharest"), ("Bulgaria", "Sofia"), ("Serbia", "Belgrade"), ("Croatia", "Zagreb"),
    ("Turkey", "Ankara"), ("Iran", "Tehran"), ("Iraq", "Baghdad"), ("Syria", "Damascus"),
    ("Lebanon", "Beirut"), ("Jordan", "Amman"), ("Saudi Arabia", "Riyadh"),
    ("Afghanistan", "Kabul"), ("Pakistan", "Islamabad"), ("Thailand", "Bangkok"),
    ("Vietnam", "Hanoi"), ("Indonesia", "Jakarta"), ("Philippines", "Manila"),
    ("South Korea", "Seoul"), ("North Korea", "Pyongyang"), ("Kenya", "Nairobi"),
    ("Ethiopia", "Addis Ababa"), ("Nigeria", "Abuja"), ("Ghana", "Accra"), ("Morocco", "Rabat"),
    ("Algeria", "Algiers"), ("Tunisia", "Tunis"), ("Libya", "Tripoli"), ("Sudan", "Khartoum"),
    ("Senegal", "Dakar"), ("Argentina", "Buenos Aires"), ("Chile", "Santiago"), ("Peru", "Lima"),
    ("Venezuela", "Caracas"), ("Cuba", "Havana"), ("Mexico", "Mexico City"), ("Canada", "Ottawa"),
    ("Australia", "Canberra"), ("New Zealand", "Wellington"), ("United Kingdom", "London"),
    ("Nepal", "Kathmandu"), ("Bangladesh", "Dhaka"), ("Malaysia", "Kuala Lumpur"),
    ("Uganda", "Kampala"), ("Zimbabwe", "Harare"), ("Qatar", "Doha"), ("Latvia", "Riga"),
    ("Lithuania", "Vilnius"), ("Estonia", "Tallinn"), ("Armenia", "Yerevan"),
    ("Slovakia", "Bratislava"), ("Uruguay", "Montevideo"),
)  # fmt: skip

ANTONYMS = (
    ("hot", "cold"), ("big", "small"), ("fast", "slow"), ("up", "down"), ("high", "low"),
    ("happy", "sad"), ("good", "bad"), ("rich", "poor"), ("true", "false"), ("wet", "dry"),
    ("early", "late"), ("strong", "weak"), ("full", "empty"), ("inside", "outside"),
    ("win", "lose"), ("love", "hate"), ("push", "pull"), ("buy", "sell"), ("day", "night"),
    ("black", "white"), ("north", "south"), ("east", "west"), ("top", "bottom"),
    ("first", "last"), ("male", "female"), ("alive", "dead"), ("clean", "dirty"),
    ("thick", "thin"), ("wide", "narrow"), ("deep", "shallow"), ("loud", "quiet"),
    ("cheap", "expensive"), ("safe", "dangerous"), ("increase", "decrease"), ("before", "after"),
    ("above", "below"), ("always", "never"), ("remember", "forget"), ("accept", "reject"),
    ("friend", "enemy"), ("success", "failure"), ("maximum", "minimum"),
    ("positive", "negative"), ("possible", "impossible"), ("import", "export"),
    ("entrance", "exit"), ("victory", "defeat"), ("ancient", "modern"), ("asleep", "awake"),
    ("absent", "present"),
)  # fmt: skip

N_SHOTS = 3


class FewShotLookup(TemplateTask):
    """Query i of `pairs` (both directions if `both_directions`) after N_SHOTS other pairs."""

    scoring = "generate"
    subtasks = ("lookup",)

    def __init__(
        self, name: str, pairs: tuple, separator: str, both_directions: bool, max_new_tokens: int
    ):
        self.name = name
        self.pairs = pairs
        self.separator = separator  # between key and value, e.g. ":" or " ->"; a space follows it
        self.both_directions = both_directions
        self.max_new_tokens = max_new_tokens

    def _n_queries(self) -> int:
        return len(self.pairs) * (2 if self.both_directions else 1)

    def space_size(self, subtask: str) -> int:
        return self._n_queries() * n_arrangements(len(self.pairs) - 1, N_SHOTS)

    def item_at(self, subtask: str, index: int) -> Item:
        self._check_index(subtask, index)
        shot_index, q = divmod(index, self._n_queries())
        pair, reverse = divmod(q, 2) if self.both_directions else (q, 0)
        key, value = self.pairs[pair][::-1] if reverse else self.pairs[pair]
        others = self.pairs[:pair] + self.pairs[pair + 1 :]
        shots = unrank_arrangement(shot_index, others, N_SHOTS)
        lines = [f"{k}{self.separator} {v}" for k, v in shots] + [f"{key}{self.separator}"]
        return Item(self.name, subtask, "\n".join(lines), answer=value)


def capitals() -> FewShotLookup:
    return FewShotLookup("capitals", CAPITALS, ":", both_directions=False, max_new_tokens=6)


def antonyms() -> FewShotLookup:
    return FewShotLookup("antonyms", ANTONYMS, " ->", both_directions=True, max_new_tokens=4)
