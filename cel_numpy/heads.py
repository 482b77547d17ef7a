"""Head names: the one notation in which cel-numpy takes and prints attention heads.

A head is (layer, head), both counted from 0: `L3H1` is head 1 of layer 3. Wherever a function
or command takes heads, it accepts any of

    "L3H1"                     one head (the letters in either case, spaces around it ignored)
    "L3H1+L5H0"                several heads ("L3H1,L5H0" too)
    (3, 1)                     one head as a pair of integers
    [(3, 1), (5, 0)]           several; items may mix pairs and names: ["L3H1", (5, 0)]
    "intact", (), []           no head at all

and returns them as a sorted tuple of (layer, head) pairs. Reports, figures and errors print
`L3H1`, `L3H1+L5H0`, or `intact` for no head. Anything else is an OptionError whose one line says
what was given and how to write it; a head the model does not have is an InvalidHeadError.

This module imports nothing from cel-numpy but the errors, so every layer can use it.
"""

from __future__ import annotations

import re

from cel_numpy.errors import InvalidHeadError, OptionError

Head = tuple[int, int]  # (layer, head), 0-based
Heads = tuple[Head, ...]  # sorted, no head twice; () = intact

INTACT_NAME = "intact"
HOW = "write heads as L3H1 (layer 3, head 1, counted from 0), several as L3H1+L5H0"
_NAME = re.compile(r"\s*[Ll]([0-9]+)[Hh]([0-9]+)\s*")  # ASCII digits ("\d" takes "٣" too)


def head_name(head: Head) -> str:
    """(3, 1) -> "L3H1"."""
    layer, h = head
    return f"L{layer}H{h}"


def heads_name(heads) -> str:
    """((3, 1), (5, 0)) -> "L3H1+L5H0"; () -> "intact". Takes any spelling parse_heads takes."""
    heads = parse_heads(heads)
    return "+".join(head_name(h) for h in heads) if heads else INTACT_NAME


def _fail(what: str, message: str) -> OptionError:
    return OptionError(f"{what}: {message}" if what else message)


def _is_int(x) -> bool:
    # bool is an int subclass; numpy integers have __index__ but are not int
    return not isinstance(x, bool) and hasattr(x, "__index__") and not isinstance(x, str)


def _clip(text: str) -> str:
    """`text` as an error shows it: at most 60 characters (a 12,000-head list is not echoed)."""
    return text if len(text) <= 60 else text[:57] + "..."


def _parse_name(text: str, what: str) -> list[Head]:
    if text.strip().lower() == INTACT_NAME:
        return []
    heads = []
    for part in re.split(r"[+,]", text):
        match = _NAME.fullmatch(part)
        if match is None and not part.strip():
            shown = _clip(text)
            raise _fail(
                what, f"{shown!r} has an empty name (a + or , at an end, or two in a row): {HOW}"
            )
        if match is None:
            shown = _clip(part.strip())
            old = re.fullmatch(r"([0-9]+)\.([0-9]+)", shown)  # the dotted spelling of old versions
            hint = f"write L{old[1]}H{old[2]} for layer {old[1]}, head {old[2]}" if old else HOW
            raise _fail(what, f"{shown!r} is not a head name: {hint}")
        heads.append((int(match.group(1)), int(match.group(2))))
    return heads


def _parse_item(item, what: str) -> list[Head]:
    if isinstance(item, str):
        return _parse_name(item, what)
    if isinstance(item, (tuple, list)) and len(item) == 2 and all(_is_int(x) for x in item):
        layer, h = (x.__index__() for x in item)
        if layer < 0 or h < 0:
            raise _fail(what, f"head {tuple(item)} has a negative index: {HOW}")
        return [(layer, h)]
    raise _fail(what, f"{item!r} is not a head: {HOW}, or as (layer, head) pairs")


def parse_heads(spec, *, what: str = "", repeats: bool = False) -> Heads:
    """Any accepted spelling (see the module docstring) -> sorted tuple of (layer, head) pairs.

    what: the argument's name ("--ablate", "ablate"), put in front of an error's message.
    repeats: a head named twice counts once (a mask: removing a head twice removes it once);
    by default it is an error (a head set, a condition, a command-line option).
    """
    if spec is None:
        return ()
    if hasattr(spec, "tolist") and not isinstance(spec, str):  # a NumPy array of pairs
        spec = spec.tolist()
    if isinstance(spec, str):
        if not spec.strip():
            # a set to test or explain needs a head; elsewhere no head is a condition of its own
            none = "" if what in ("--heads", "heads") else " (or 'intact' for none)"
            raise _fail(what, f"an empty head list: {HOW}{none}")
        heads = _parse_name(spec, what)
    elif isinstance(spec, (tuple, list)) and len(spec) == 2 and all(_is_int(x) for x in spec):
        heads = _parse_item(spec, what)  # (3, 1): one head
    else:
        try:
            items = list(spec)
        except TypeError:
            raise _fail(what, f"{spec!r} is not a head: {HOW}, or as (layer, head) pairs") from None
        if any(not isinstance(item, (str, tuple, list)) for item in items):
            # (3,), (3, 1.0), (True, 1): a malformed pair, not a list of heads -- name all of it
            raise _fail(what, f"{spec!r} is not a head: {HOW}, or as (layer, head) pairs")
        heads = [head for item in items for head in _parse_item(item, what)]
    seen: set[Head] = set()
    for head in heads:
        if head in seen and not repeats:
            raise _fail(what, f"{head_name(head)} is given twice")
        seen.add(head)
    return tuple(sorted(seen))


def parse_head(spec, *, what: str = "") -> Head:
    """Exactly one head in any spelling: "L3H1" or (3, 1) -> (3, 1)."""
    heads = parse_heads(spec, what=what)
    if len(heads) != 1:
        given = heads_name(heads) if heads else "no head"
        raise _fail(what, f"takes one head, got {given}: write it as L3H1")
    return heads[0]


def check_heads(heads, n_layers: int, n_heads: int, *, what: str = "") -> None:
    """Every head exists in a model of n_layers x n_heads; InvalidHeadError naming it otherwise."""
    for layer, h in parse_heads(heads, what=what):
        if not (layer < n_layers and h < n_heads):
            message = (
                f"head L{layer}H{h} is not in the model: it has {n_layers} layers x {n_heads} "
                f"heads, L0H0 to L{n_layers - 1}H{n_heads - 1} (counted from 0)"
            )
            raise InvalidHeadError(f"{what}: {message}" if what else message)
