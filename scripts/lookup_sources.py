"""Check the few-shot lookup tables (cel_numpy/tasks/fewshot.py) against published sources, and
print the accepted-answer tables the scorer uses.

Sources (none is needed by cel_numpy or the tests; the tables they produced are committed):
  WordNet 3.0       the Debian package `wordnet-base` (apt-get install wordnet-base), files in
                    /usr/share/wordnet: antonym pointers ("!") of every part of speech.
  world-countries   npm package world-countries@5.1.0, countries.json (field `capital`, a list).
  countries-list    npm package countries-list@3.4.1, countries.min.json (field `capital`).
                    (`npm pack world-countries@5.1.0 countries-list@3.4.1`, then untar.)

    python scripts/lookup_sources.py --wordnet /usr/share/wordnet \
        --world-countries DIR/countries.json --countries-list DIR/countries.min.json

Checks and prints:
  * every antonym pair of the table that WordNet does not list (the table answer is accepted
    anyway: it is the reference);
  * ANTONYM_ALTERNATIVES: per table word, the other single lowercase words of every synset that
    WordNet marks as its antonym in either direction (any sense: narrow -> wide, broad), i.e. the
    extra answers the scorer accepts;
  * every capital of the table that neither country source lists (accent-folded), and
    CAPITAL_ALTERNATIVES: per country, every other capital the sources list, and the source's
    own spelling where the table shows its plain-ASCII form.
Exit status 1 when a table entry has no source at all (capitals) or a table word is not
plain lowercase (antonyms).
"""

from __future__ import annotations

import argparse
import json
import re
import sys
import unicodedata
from collections import defaultdict
from pathlib import Path

from cel_numpy.tasks.fewshot import ANTONYMS, CAPITALS

_POS = {"noun": "n", "verb": "v", "adj": "a", "adv": "r"}
# table names the country sources spell otherwise (and list under no alternative spelling)
_ALIASES = {"Turkey": "Türkiye"}


def wordnet_antonyms(folder: Path) -> dict[str, set[str]]:
    """word -> the words WordNet 3.0 lists as its antonym (any sense, either direction).

    WordNet's antonym pointers ("!") join two words (wide <-> narrow). Adjectives are organised
    around such head pairs, and the other lemmas of a head synset share its sense ("wide,
    broad"), so for adjectives every lemma of the antonym's synset counts (narrow -> broad).
    Nouns, verbs and adverbs keep the pointer's word alone (their synsets mix senses: the
    synset of "boy" holds "son").
    """
    lemmas_of: dict[tuple[str, str], list[str]] = {}
    pointers = []  # (source synset, source word number, target synset, target word number)
    for name, pos in _POS.items():
        for line in open(folder / f"data.{name}", encoding="latin-1"):
            if line.startswith("  "):  # the licence header
                continue
            f = line.split(" | ")[0].split()
            n = int(f[3], 16)
            lemmas_of[(f[0], pos)] = [f[4 + 2 * i].split("(")[0].lower() for i in range(n)]
            i = 4 + 2 * n
            for _ in range(int(f[i])):
                symbol, offset, tpos, st = f[i + 1 : i + 5]
                i += 4
                if symbol == "!":
                    tpos = "a" if tpos == "s" else tpos
                    pointers.append(((f[0], pos), int(st[:2], 16), (offset, tpos), int(st[2:], 16)))
    out: dict[str, set[str]] = defaultdict(set)
    for source, k_source, target, k_target in pointers:
        a, b = lemmas_of[source][k_source - 1], lemmas_of[target][k_target - 1]
        adjective = source[1] == target[1] == "a"
        out[a].update(lemmas_of[target] if adjective else [b])
        out[b].update(lemmas_of[source] if adjective else [a])
    return out


def fold(text: str) -> str:
    """Plain ASCII: accents dropped (São Tomé -> Sao Tome)."""
    return unicodedata.normalize("NFKD", text).encode("ascii", "ignore").decode()


def antonym_report(folder: Path) -> tuple[dict[str, tuple[str, ...]], bool]:
    ant = wordnet_antonyms(folder)
    ok = True
    answer_of = {}
    for a, b in ANTONYMS:
        answer_of[a], answer_of[b] = b, a
        if not (re.fullmatch("[a-z]+", a) and re.fullmatch("[a-z]+", b)):
            print(f"antonyms: {a}/{b} is not plain lowercase", file=sys.stderr)
            ok = False
        if b not in ant.get(a, ()):
            print(f"antonyms: {a}/{b} is not a WordNet antonym pair (the table answer counts)")
    alternatives = {}
    for word in sorted(answer_of):
        extra = sorted(
            w for w in ant.get(word, ()) if re.fullmatch("[a-z]+", w) and w != answer_of[word]
        )
        if extra:
            alternatives[word] = tuple(extra)
    return alternatives, ok


def capital_report(world: Path, clist: Path) -> tuple[dict[str, tuple[str, ...]], bool]:
    wc = json.loads(world.read_text())
    cl = json.loads(clist.read_text())
    code_of: dict[str, str] = {}
    for c in wc:
        for name in [c["name"]["common"], c["name"]["official"], *c.get("altSpellings", [])]:
            code_of.setdefault(name, c["cca2"])
            code_of.setdefault(fold(name), c["cca2"])
    listed = {c["cca2"]: list(c.get("capital", [])) for c in wc}
    for code, c in cl.items():
        if c.get("capital") and c["capital"] not in listed.setdefault(code, []):
            listed[code].append(c["capital"])
    ok = True
    alternatives = {}
    for country, capital in CAPITALS:
        code = code_of.get(_ALIASES.get(country, country))
        sources = listed.get(code, [])
        if capital not in {fold(s) for s in sources}:
            print(
                f"capitals: {country}: {capital} is in neither source ({sources})", file=sys.stderr
            )
            ok = False
        extra = [s for s in dict.fromkeys(sources + [fold(s) for s in sources]) if s != capital]
        if extra:
            alternatives[country] = tuple(extra)
    return alternatives, ok


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--wordnet", type=Path, default=Path("/usr/share/wordnet"))
    ap.add_argument("--world-countries", type=Path, required=True)
    ap.add_argument("--countries-list", type=Path, required=True)
    args = ap.parse_args()
    ant_alt, ok_a = antonym_report(args.wordnet)
    cap_alt, ok_c = capital_report(args.world_countries, args.countries_list)
    for name, table in (("ANTONYM_ALTERNATIVES", ant_alt), ("CAPITAL_ALTERNATIVES", cap_alt)):
        print(f"{name} = {{")
        for key, extra in table.items():
            print(f"    {key!r}: {extra!r},")
        print("}")
    return 0 if ok_a and ok_c else 1


if __name__ == "__main__":
    sys.exit(main())
