"""Few-shot lookups: country capitals and antonyms.

    capitals  "France: Paris\\nJapan: Tokyo\\nEgypt: Cairo\\nItaly:"  -> " Rome"
    antonyms  "hot -> cold\\nrich -> poor\\nday -> night\\nwet ->"     -> " dry"

Each prompt is three shots (an ordered choice of three other entries, never the query's own
entry) followed by the query. Antonym queries run in both directions ("wet -> dry" and
"dry -> wet"); shots are shown in the table's direction.
Scoring ("generate"): the continuation up to the first newline, stripped, must equal the answer
exactly (case-sensitive, no trailing punctuation tolerated).

The tables keep only entries with one answer in plain ASCII: no country whose capital is split
or disputed (Bolivia, the Netherlands, South Africa, Switzerland, Israel, Sri Lanka, Benin,
Tanzania, Ivory Coast, Kazakhstan, Myanmar...), renamed or spelled two ways in English (India's
New Delhi/Delhi, Ukraine's Kyiv/Kiev, Mongolia, Yemen), written with diacritics (Brasilia,
Asuncion, Chad's N'Djamena), or equal to its country (Luxembourg, Djibouti, Singapore); no
antonym whose query has two usual answers (light: dark or heavy; short: long or tall; old: new
or young) and no word in two pairs. `tests/test_tasks.py` checks these rules.

Clusters (`Item.cluster`, the independent unit): the country; the antonym pair, both directions
together ("wet/dry"). A panel takes a cluster whole (`cel_numpy.tasks.panels`).

Template space: capitals 152 queries * 151 * 150 * 149 shot arrangements;
antonyms 2 * 184 directed queries * 183 * 182 * 181 (each cluster: 151 * 150 * 149 and
2 * 183 * 182 * 181 items).
"""

from __future__ import annotations

from cel_numpy.tasks.base import AnswerContext, Item
from cel_numpy.tasks.template import TemplateTask, first_line, n_arrangements, unrank_arrangement

CAPITALS = (
    # Europe
    ("France", "Paris"), ("Germany", "Berlin"), ("Italy", "Rome"), ("Spain", "Madrid"),
    ("Portugal", "Lisbon"), ("United Kingdom", "London"), ("Ireland", "Dublin"),
    ("Belgium", "Brussels"), ("Iceland", "Reykjavik"), ("Kosovo", "Pristina"),
    ("Austria", "Vienna"), ("Poland", "Warsaw"),
    ("Czech Republic", "Prague"), ("Slovakia", "Bratislava"), ("Hungary", "Budapest"),
    ("Slovenia", "Ljubljana"), ("Croatia", "Zagreb"), ("Bosnia and Herzegovina", "Sarajevo"),
    ("Serbia", "Belgrade"), ("Montenegro", "Podgorica"), ("Albania", "Tirana"),
    ("North Macedonia", "Skopje"), ("Bulgaria", "Sofia"), ("Romania", "Bucharest"),
    ("Belarus", "Minsk"), ("Lithuania", "Vilnius"), ("Latvia", "Riga"), ("Estonia", "Tallinn"),
    ("Finland", "Helsinki"), ("Sweden", "Stockholm"), ("Norway", "Oslo"),
    ("Denmark", "Copenhagen"), ("Greece", "Athens"), ("Cyprus", "Nicosia"), ("Malta", "Valletta"),
    ("Russia", "Moscow"), ("Liechtenstein", "Vaduz"), ("Armenia", "Yerevan"),
    ("Azerbaijan", "Baku"), ("Turkey", "Ankara"),
    # Middle East, Central, South and East Asia
    ("Iran", "Tehran"), ("Iraq", "Baghdad"), ("Syria", "Damascus"), ("Lebanon", "Beirut"),
    ("Jordan", "Amman"), ("Saudi Arabia", "Riyadh"), ("Oman", "Muscat"),
    ("United Arab Emirates", "Abu Dhabi"), ("Qatar", "Doha"), ("Bahrain", "Manama"),
    ("Kuwait", "Kuwait City"),
    ("Afghanistan", "Kabul"), ("Pakistan", "Islamabad"), ("Nepal", "Kathmandu"),
    ("Bhutan", "Thimphu"), ("Bangladesh", "Dhaka"), ("Thailand", "Bangkok"),
    ("Laos", "Vientiane"), ("Cambodia", "Phnom Penh"), ("Vietnam", "Hanoi"),
    ("Malaysia", "Kuala Lumpur"), ("Indonesia", "Jakarta"), ("Philippines", "Manila"),
    ("Brunei", "Bandar Seri Begawan"), ("East Timor", "Dili"), ("China", "Beijing"),
    ("North Korea", "Pyongyang"), ("South Korea", "Seoul"), ("Japan", "Tokyo"),
    ("Taiwan", "Taipei"), ("Uzbekistan", "Tashkent"), ("Kyrgyzstan", "Bishkek"),
    ("Tajikistan", "Dushanbe"),
    # Africa
    ("Egypt", "Cairo"), ("Libya", "Tripoli"), ("Tunisia", "Tunis"), ("Algeria", "Algiers"),
    ("Morocco", "Rabat"), ("Sudan", "Khartoum"), ("South Sudan", "Juba"),
    ("Ethiopia", "Addis Ababa"), ("Eritrea", "Asmara"), ("Somalia", "Mogadishu"),
    ("Kenya", "Nairobi"), ("Uganda", "Kampala"), ("Rwanda", "Kigali"), ("Mozambique", "Maputo"),
    ("Malawi", "Lilongwe"), ("Zambia", "Lusaka"), ("Zimbabwe", "Harare"),
    ("Botswana", "Gaborone"), ("Namibia", "Windhoek"), ("Lesotho", "Maseru"),
    ("Madagascar", "Antananarivo"), ("Angola", "Luanda"),
    ("Democratic Republic of the Congo", "Kinshasa"), ("Republic of the Congo", "Brazzaville"),
    ("Gabon", "Libreville"), ("Nigeria", "Abuja"), ("Niger", "Niamey"),
    ("Central African Republic", "Bangui"), ("Ghana", "Accra"), ("Burkina Faso", "Ouagadougou"),
    ("Mali", "Bamako"), ("Senegal", "Dakar"), ("Gambia", "Banjul"), ("Guinea", "Conakry"),
    ("Sierra Leone", "Freetown"), ("Liberia", "Monrovia"), ("Mauritania", "Nouakchott"),
    ("Cape Verde", "Praia"), ("Equatorial Guinea", "Malabo"), ("Mauritius", "Port Louis"),
    ("Seychelles", "Victoria"), ("Comoros", "Moroni"),
    # Americas
    ("Canada", "Ottawa"), ("Mexico", "Mexico City"), ("Cuba", "Havana"), ("Jamaica", "Kingston"),
    ("Haiti", "Port-au-Prince"), ("Dominican Republic", "Santo Domingo"), ("Bahamas", "Nassau"),
    ("Guatemala", "Guatemala City"), ("Panama", "Panama City"), ("Honduras", "Tegucigalpa"),
    ("Nicaragua", "Managua"), ("El Salvador", "San Salvador"),
    ("Belize", "Belmopan"), ("Venezuela", "Caracas"), ("Ecuador", "Quito"), ("Peru", "Lima"),
    ("Chile", "Santiago"), ("Argentina", "Buenos Aires"), ("Uruguay", "Montevideo"),
    ("Guyana", "Georgetown"), ("Suriname", "Paramaribo"), ("Trinidad and Tobago", "Port of Spain"),
    ("Barbados", "Bridgetown"), ("Saint Lucia", "Castries"), ("Dominica", "Roseau"),
    ("Saint Vincent and the Grenadines", "Kingstown"), ("Saint Kitts and Nevis", "Basseterre"),
    # Oceania
    ("Australia", "Canberra"), ("New Zealand", "Wellington"), ("Fiji", "Suva"),
    ("Papua New Guinea", "Port Moresby"), ("Samoa", "Apia"), ("Vanuatu", "Port Vila"),
    ("Solomon Islands", "Honiara"), ("Marshall Islands", "Majuro"), ("Micronesia", "Palikir"),
    ("Tuvalu", "Funafuti"),
    # Added with the several-answers scorer (CAPITAL_ALTERNATIVES): a capital the country
    # sources list more than once, or spell with diacritics (the shot shows the ASCII form)
    ("South Africa", "Pretoria"), ("Switzerland", "Bern"), ("Brazil", "Brasilia"),
    ("Paraguay", "Asuncion"), ("Cameroon", "Yaounde"), ("Colombia", "Bogota"),
    ("Costa Rica", "San Jose"), ("Togo", "Lome"), ("Moldova", "Chisinau"), ("Maldives", "Male"),
    ("Andorra", "Andorra la Vella"), ("Tonga", "Nuku'alofa"), ("Turkmenistan", "Ashgabat"),
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
    ("attack", "defend"), ("borrow", "lend"), ("teach", "learn"), ("laugh", "cry"),
    ("question", "answer"), ("lead", "follow"), ("send", "receive"), ("float", "sink"),
    ("sit", "stand"), ("pass", "fail"), ("include", "exclude"), ("inhale", "exhale"),
    ("internal", "external"), ("interior", "exterior"), ("inner", "outer"), ("input", "output"),
    ("major", "minor"), ("majority", "minority"), ("superior", "inferior"),
    ("senior", "junior"), ("horizontal", "vertical"), ("plural", "singular"),
    ("permanent", "temporary"), ("public", "private"), ("formal", "informal"),
    ("guilty", "innocent"), ("optimistic", "pessimistic"), ("urban", "rural"),
    ("ascend", "descend"), ("encourage", "discourage"), ("sunrise", "sunset"),
    ("summer", "winter"), ("floor", "ceiling"), ("correct", "incorrect"), ("past", "future"),
    ("raw", "cooked"), ("odd", "even"), ("rough", "smooth"), ("tight", "loose"),
    ("wise", "foolish"), ("polite", "rude"), ("near", "far"), ("here", "there"), ("yes", "no"),
    ("all", "none"), ("everything", "nothing"), ("most", "least"), ("many", "few"),
    ("cause", "effect"), ("profit", "loss"), ("credit", "debit"), ("wealth", "poverty"),
    ("war", "peace"), ("joy", "sorrow"), ("pleasure", "pain"), ("hero", "villain"),
    ("heaven", "hell"), ("angel", "devil"), ("birth", "death"), ("comedy", "tragedy"),
    ("reward", "punishment"), ("obey", "disobey"), ("agree", "disagree"),
    ("appear", "disappear"), ("connect", "disconnect"), ("honest", "dishonest"),
    ("able", "unable"), ("known", "unknown"), ("fair", "unfair"), ("lucky", "unlucky"),
    ("usual", "unusual"), ("certain", "uncertain"), ("visible", "invisible"),
    ("legal", "illegal"), ("logical", "illogical"), ("mature", "immature"),
    ("patient", "impatient"), ("perfect", "imperfect"), ("responsible", "irresponsible"),
    ("regular", "irregular"), ("relevant", "irrelevant"), ("complete", "incomplete"),
    ("direct", "indirect"), ("dependent", "independent"), ("advance", "retreat"),
    ("forward", "backward"), ("inward", "outward"), ("upstairs", "downstairs"),
    ("indoors", "outdoors"), ("plus", "minus"), ("add", "subtract"), ("multiply", "divide"),
    ("addition", "subtraction"), ("attract", "repel"), ("arrival", "departure"),
    ("dawn", "dusk"), ("morning", "evening"), ("noon", "midnight"), ("admit", "deny"),
    ("fact", "fiction"), ("employer", "employee"), ("winner", "loser"), ("vowel", "consonant"),
    ("predator", "prey"), ("lender", "borrower"), ("buyer", "seller"), ("landlord", "tenant"),
    ("ancestor", "descendant"), ("mountain", "valley"), ("on", "off"), ("in", "out"),
    ("over", "under"), ("lock", "unlock"), ("pack", "unpack"), ("tie", "untie"),
    ("load", "unload"), ("fold", "unfold"), ("cover", "uncover"), ("wrap", "unwrap"),
    ("arm", "disarm"), ("assemble", "disassemble"), ("approve", "disapprove"),
    ("trust", "distrust"), ("boy", "girl"), ("husband", "wife"), ("brother", "sister"),
    ("father", "mother"), ("king", "queen"), ("son", "daughter"), ("uncle", "aunt"),
    ("nephew", "niece"), ("mortal", "immortal"), ("finite", "infinite"), ("sane", "insane"),
    # Added for cluster-disjoint folds: WordNet 3.0 antonym pairs in which each word has this
    # one antonym only (scripts/lookup_sources.py), chosen by hand among the most frequent
    ("give", "take"), ("come", "go"), ("man", "woman"), ("arrive", "leave"),
    ("former", "latter"), ("quickly", "slowly"), ("hide", "show"), ("child", "parent"),
    ("absence", "presence"), ("strength", "weakness"), ("shout", "whisper"),
    ("contract", "expand"), ("despair", "hope"), ("actual", "potential"),
    ("northern", "southern"), ("danger", "safety"), ("absolute", "relative"),
    ("often", "rarely"), ("mental", "physical"), ("forbid", "permit"),
    ("conservative", "liberal"), ("abstract", "concrete"), ("extraordinary", "ordinary"),
    ("sleep", "wake"), ("adequate", "inadequate"), ("difficulty", "ease"),
    ("criticize", "praise"), ("smart", "stupid"), ("heavily", "lightly"), ("gross", "net"),
    ("primary", "secondary"), ("loudly", "softly"), ("best", "worst"),
    ("strengthen", "weaken"), ("objective", "subjective"), ("likely", "unlikely"),
    ("eastern", "western"), ("useful", "useless"), ("deposit", "withdraw"),
    ("privately", "publicly"), ("fortunate", "unfortunate"), ("definite", "indefinite"),
    ("conscious", "unconscious"), ("competition", "cooperation"), ("aware", "unaware"),
    ("analysis", "synthesis"), ("stable", "unstable"), ("personal", "impersonal"),
    ("leader", "follower"), ("expected", "unexpected"), ("directly", "indirectly"),
    ("complicate", "simplify"), ("approval", "disapproval"), ("pleasant", "unpleasant"),
    ("humble", "proud"), ("greater", "lesser"), ("upward", "downward"),
    ("continue", "discontinue"), ("capable", "incapable"), ("acceptance", "rejection"),
    ("necessary", "unnecessary"), ("patience", "impatience"), ("guilt", "innocence"),
    ("order", "disorder"), ("constructive", "destructive"), ("simplicity", "complexity"),
    ("agreement", "disagreement"),
)  # fmt: skip

# Every other right answer the scorer accepts, per query, written by scripts/lookup_sources.py:
# for an antonym, the other words WordNet 3.0 lists as its antonym in either direction (any
# sense; for adjectives every lemma of the antonym's synset: narrow -> broad); for a country,
# every other capital the two country sources list, and their spelling with diacritics.
# The table's own answer is always the reference (what a shot shows, what is teacher-forced).
ANTONYM_ALTERNATIVES = {
    "absolute": ("comparative",),
    "accept": ("refuse",),
    "actual": ("possible",),
    "adequate": ("unequal",),
    "admit": ("exclude", "reject"),
    "advance": ("back", "recede"),
    "all": ("no", "some"),
    "aware": ("incognizant",),
    "big": ("little",),
    "bottom": ("side",),
    "certain": ("incertain", "unsure"),
    "clean": ("contaminating", "impure", "soiled", "unclean"),
    "complete": ("uncomplete",),
    "correct": ("falsify", "wrong"),
    "credit": ("cash",),
    "dead": ("live", "living"),
    "defend": ("prosecute",),
    "deny": ("allow",),
    "dependent": ("main",),
    "direct": ("alternating", "inverse", "retrograde"),
    "dirty": ("uncontaminating", "unobjectionable"),
    "dishonest": ("honorable",),
    "divide": ("unite",),
    "downstairs": ("upstair",),
    "dry": ("lactating", "phlegmy", "sweet"),
    "early": ("later", "middle"),
    "empty": ("fill",),
    "even": ("uneven",),
    "exclude": ("admit",),
    "exit": ("enter",),
    "expensive": ("inexpensive",),
    "fail": ("manage", "succeed"),
    "fair": ("foul", "unjust"),
    "far": ("close", "nigh"),
    "female": ("androgynous",),
    "first": ("second",),
    "follow": ("precede",),
    "forget": ("mind",),
    "forward": ("reverse",),
    "friend": ("foe",),
    "full": ("thin",),
    "future": ("present",),
    "good": ("evil",),
    "gross": ("nett",),
    "guilty": ("guiltless",),
    "happy": ("unhappy",),
    "honest": ("dishonorable",),
    "horizontal": ("inclined", "perpendicular"),
    "inadequate": ("equal",),
    "incorrect": ("right",),
    "independent": ("subordinate",),
    "invisible": ("seeable",),
    "late": ("middle",),
    "lead": ("deficit",),
    "logical": ("unlogical",),
    "loose": ("compact",),
    "lose": ("find", "keep", "profit"),
    "loser": ("achiever",),
    "loss": ("gain",),
    "loud": ("soft",),
    "lucky": ("luckless",),
    "major": ("nonaged", "underage"),
    "male": ("androgynous",),
    "maximum": ("minimal",),
    "minimum": ("maximal",),
    "modern": ("nonmodern",),
    "most": ("fewest",),
    "multiply": ("singly",),
    "narrow": ("broad", "widen"),
    "necessary": ("unneeded",),
    "negative": ("affirmative", "affirmatory", "confirming", "neutral"),
    "never": ("ever",),
    "no": ("all", "some"),
    "on": ("cancelled",),
    "out": ("safe",),
    "past": ("present",),
    "permanent": ("impermanent",),
    "polite": ("impolite",),
    "positive": ("disconfirming", "neutral"),
    "potential": ("existent",),
    "present": ("future", "past"),
    "profit": ("lose",),
    "quiet": ("active", "noisy", "unquiet"),
    "reject": ("admit",),
    "reward": ("penalty",),
    "rich": ("lean",),
    "sad": ("glad",),
    "safe": ("out", "unsafe"),
    "sink": ("source",),
    "sit": ("lie",),
    "small": ("large",),
    "smooth": ("bumpy", "jolting", "jolty", "jumpy", "rocky", "roughen", "unsmooth"),
    "stand": ("lie", "yield"),
    "subjective": ("nonsubjective",),
    "thin": ("fat", "full", "thicken"),
    "tight": ("leaky",),
    "top": ("side",),
    "trust": ("mistrust",),
    "unaware": ("cognisant", "cognizant"),
    "uncertain": ("sure",),
    "unfair": ("just",),
    "upstairs": ("downstair",),
    "useless": ("utile",),
    "vertical": ("inclined",),
    "visible": ("unseeable",),
}

CAPITAL_ALTERNATIVES = {
    "South Africa": ("Bloemfontein", "Cape Town"),
    "Brazil": ("Brasília",),
    "Paraguay": ("Asunción",),
    "Cameroon": ("Yaoundé",),
    "Colombia": ("Bogotá",),
    "Costa Rica": ("San José",),
    "Togo": ("Lomé",),
    "Moldova": ("Chișinău",),
    "Maldives": ("Malé",),
}

N_SHOTS = 3


class FewShotLookup(TemplateTask):
    """Query i of `pairs` (both directions if `both_directions`) after N_SHOTS other pairs."""

    scoring = "generate"
    subtasks = ("lookup",)

    def __init__(
        self,
        name: str,
        pairs: tuple,
        separator: str,
        both_directions: bool,
        max_new_tokens: int,
        alternatives: dict[str, tuple[str, ...]],
    ):
        self.name = name
        self.pairs = pairs
        self.separator = separator  # between key and value, e.g. ":" or " ->"; a space follows it
        self.both_directions = both_directions
        self.max_new_tokens = max_new_tokens
        self.alternatives = alternatives  # query -> other accepted answers (the table's first)

    def query(self, item: Item) -> str:
        """The looked-up key: the prompt's last line without its separator ("wet ->" -> "wet")."""
        return item.prompt.rsplit("\n", 1)[-1].removesuffix(self.separator)

    def accepted(self, item: Item) -> tuple[str, ...]:
        """Every right answer: the table's (item.answer) first, then the listed alternatives."""
        return (item.answer, *self.alternatives.get(self.query(item), ()))

    def is_correct(self, item: Item, output: str) -> bool:
        """The stripped first line is one of the accepted answers, exactly (case-sensitive)."""
        return first_line(output) in self.accepted(item)

    def answer_context(self, item: Item) -> AnswerContext:
        """What a changed answer is compared with (`cel_numpy.tasks.changes`)."""
        shots = [line.split(f"{self.separator} ", 1)[1] for line in item.prompt.split("\n")[:-1]]
        return AnswerContext(self.query(item), tuple(shots), self.accepted(item))

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
        cluster = "/".join(self.pairs[pair]) if self.both_directions else self.pairs[pair][0]
        return Item(self.name, subtask, "\n".join(lines), answer=value, cluster=cluster)

    def cluster_shape(self, subtask: str) -> tuple[int, int]:
        """One cluster per table entry (both directions of an antonym pair together)."""
        return len(self.pairs), self.space_size(subtask) // len(self.pairs)

    def item_in_cluster(self, subtask: str, cluster: int, j: int) -> Item:
        if self.both_directions:  # j = 2 * shot_index + direction
            shot_index, reverse = divmod(j, 2)
            q = 2 * cluster + reverse
        else:
            shot_index, q = j, cluster
        return self.item_at(subtask, shot_index * self._n_queries() + q)

    def roles(self, item: Item) -> dict[str, list[tuple[int, int]]]:
        """Character spans [start, end) of each token role in `item.prompt`:
        "query" the queried key ("Italy" in "...\\nItaly:"), "shot keys", "shot answers" (the
        values of the shots, e.g. "Paris"), "separators" (each separator and newline)."""
        out: dict[str, list[tuple[int, int]]] = {
            "query": [],
            "shot keys": [],
            "shot answers": [],
            "separators": [],
        }
        start = 0
        lines = item.prompt.split("\n")
        for i, line in enumerate(lines):
            key, _, value = line.partition(self.separator)
            sep_start = start + len(key)
            if i == len(lines) - 1:
                out["query"].append((start, sep_start))
                out["separators"].append((sep_start, sep_start + len(self.separator)))
                break
            out["shot keys"].append((start, sep_start))
            out["separators"].append((sep_start, sep_start + len(self.separator)))
            out["shot answers"].append((sep_start + len(self.separator) + 1, start + len(line)))
            out["separators"].append((start + len(line), start + len(line) + 1))  # the newline
            start += len(line) + 1
        return out


def capitals() -> FewShotLookup:
    # the longest answers are 6 SmolLM2 tokens (" Bandar Seri Begawan", " Kuala Lumpur"); one more
    # token shows what follows them (an answer must end there: "Kuala Lumpur City" is wrong)
    return FewShotLookup(
        "capitals",
        CAPITALS,
        ":",
        both_directions=False,
        max_new_tokens=7,
        alternatives=CAPITAL_ALTERNATIVES,
    )


def antonyms() -> FewShotLookup:
    return FewShotLookup(
        "antonyms",
        ANTONYMS,
        " ->",
        both_directions=True,
        max_new_tokens=4,
        alternatives=ANTONYM_ALTERNATIVES,
    )
