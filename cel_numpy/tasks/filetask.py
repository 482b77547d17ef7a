"""A task read from a JSONL file: one item per line, the task's options on an optional first line.

    {"options": {"name": "my-task", "separator": " ", "normalize": "chars"}}
    {"id": "q1", "prompt": "The sky is", "choices": ["blue", "green"], "answer": 0}
    {"id": "q2", "prompt": "Grass is", "choices": ["blue", "green"], "answer": 1, "cluster": "c"}

Items (one JSON object per line; blank lines are skipped):
    choice item    "id", "prompt", "choices" (two or more distinct strings), "answer" (the index of
                   the correct choice); scored by the log-likelihood of each choice after the
                   prompt (and the separator), the highest one chosen (the first on a tie)
    generate item  "id", "prompt", "answer" (text), optional "answers" (more accepted texts);
                   greedy continuation, correct iff its stripped text equals a stripped answer
    either         optional "cluster" (items of one cluster stay in one panel and count as one
                   unit in the held-out test; default: the item's own id), optional "subtask"
                   (a label reports break down by; default "all"), optional "meta" (an object,
                   kept with the file, never read)
All items of a file are of one kind. Ids are unique; no two items ask the same question.

Options (the first line, {"options": {...}}; every key optional):
    name            the task's name in reports (default: the file name without .jsonl)
    scoring         "choice" or "generate": a check that the items are of that kind
    separator       text between the prompt and a choice or answer (default ""): a file whose
                    choices are words after a space says " " and writes them without it
    normalize       choice items: "none" (default: total log-likelihood) or "chars" (divided by
                    the choice's length in characters, without the separator: lm-eval's acc_norm)
    max_new_tokens  generate items: the cap on generated tokens (default 16)
    stop            generate items: "newline" (default: the text is cut at its first newline) or
                    "end_of_turn" (the model's end-of-turn token ends it; for chat prompts)
    stop_text       generate items: cut at this text instead of a newline
    chat            true: each prompt is one user message in the model's chat template (default
                    false: the prompt is the model's text as written)

Bad input (a line that is not JSON, a missing or misspelled key, an empty prompt, a duplicate
id, an answer index out of range, an unknown option) is an OptionError naming the file and the
line: `items.jsonl:7: ...`. The file's sha256 is part of the task's identity (`identity()`), which
a run's manifest records: resuming a run on a changed file is refused.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import numpy as np

from cel_numpy.errors import OptionError
from cel_numpy.limits import read_bytes_limited
from cel_numpy.tasks.base import Item

MAX_TASK_FILE_BYTES = 256 << 20  # all 10,042 HellaSwag validation items are 10.1 MB

ITEM_KEYS = {"id", "prompt", "choices", "answer", "answers", "cluster", "subtask", "meta"}
OPTION_DEFAULTS = {
    "name": None,
    "scoring": None,
    "separator": "",
    "normalize": "none",
    "max_new_tokens": 16,
    "stop": "newline",
    "stop_text": None,
    "chat": False,
}


class _RepeatedKey(ValueError):
    def __init__(self, key: str):
        super().__init__(key)
        self.key = key


def _object_without_repeats(pairs: list) -> dict:
    """json.loads' object_pairs_hook: a key given twice in one object is an error, not the
    last value silently kept."""
    out = {}
    for key, value in pairs:
        if key in out:
            raise _RepeatedKey(key)
        out[key] = value
    return out


class FileTask:
    """The items of a JSONL task file (see the module docstring), read and checked at once."""

    def __init__(self, path: str | Path):
        self.path = Path(path)
        try:
            self.path.stat()
        except OSError as e:
            raise OptionError(
                f"--task {path}: cannot read the task file ({e.strerror or e}); give a .jsonl "
                "file of items (docs/tasks.md)"
            ) from None
        data = read_bytes_limited(  # a regular file only: /dev/zero or a FIFO never ends
            self.path,
            "task file",
            max_bytes=MAX_TASK_FILE_BYTES,
            error=OptionError,
            hint="give a .jsonl file of items (docs/tasks.md)",
        )
        self.sha256 = hashlib.sha256(data).hexdigest()
        try:
            text = data.decode("utf-8").removeprefix("\ufeff")  # a byte-order mark is no item
        except UnicodeDecodeError as e:
            line = data.count(b"\n", 0, e.start) + 1
            raise OptionError(
                f"{path}:{line}: not UTF-8 text (byte {e.start}); save the file as UTF-8"
            ) from None
        # lines end at "\n" (and "\r\n") only: str.splitlines would also cut at U+2028, U+0085
        # and other characters a JSON string may hold
        lines = [
            (n, line.removesuffix("\r"))
            for n, line in enumerate(text.split("\n"), 1)
            if line.strip()
        ]
        rows = [(n, self._json(n, line)) for n, line in lines]
        options, options_line = {}, rows[0][0] if rows else 1
        if rows and "options" in rows[0][1]:
            options = self._options(*rows[0])
            rows = rows[1:]
        if not rows:
            raise OptionError(f"{path}: no items; write one JSON object per line (docs/tasks.md)")
        self.options = {**OPTION_DEFAULTS, **options}
        self.name = self.options["name"] or self.path.name.removesuffix(".jsonl")
        self.scoring = "choice" if "choices" in rows[0][1] else "generate"
        self._set_scoring_options(options_line)
        self.accepted: dict[str, frozenset[str]] = {}  # generate items: item id -> answers
        self.file_ids: dict[str, str] = {}  # Item.id -> the id in the file
        self.line_of: dict[str, int] = {}  # Item.id -> its line in the file
        self.items = self._items(rows)

    # ------------------------------------------------------------------ reading

    def _where(self, n: int) -> str:
        return f"{self.path}:{n}"

    def where_item(self, item: Item) -> str:
        """An item's place for an error message: `items.jsonl:7: item 'q7'`."""
        return f"{self._where(self.line_of[item.id])}: item {self.file_ids[item.id]!r}"

    def _json(self, n: int, line: str) -> dict:
        try:
            row = json.loads(line, object_pairs_hook=_object_without_repeats)
            json.dumps(row, ensure_ascii=False).encode("utf-8")  # a lone "\\ud800" fails here
        except _RepeatedKey as e:
            raise OptionError(
                f"{self._where(n)}: key {e.key!r} is given twice in one object; keep one"
            ) from None
        except json.JSONDecodeError as e:
            raise OptionError(
                f"{self._where(n)}: not valid JSON ({e.msg}, column {e.colno}); one object per line"
            ) from None
        except UnicodeEncodeError:
            raise OptionError(
                f"{self._where(n)}: a \\u escape names half of a surrogate pair, which is not "
                "text; write the character itself"
            ) from None
        except RecursionError:
            raise OptionError(
                f"{self._where(n)}: JSON nested too deeply; an item is flat"
            ) from None
        except ValueError:  # Python refuses to parse an integer of more than 4,300 digits
            raise OptionError(
                f"{self._where(n)}: an integer of more than 4,300 digits; write smaller numbers"
            ) from None
        if not isinstance(row, dict):
            raise OptionError(f"{self._where(n)}: a line must be a JSON object, got {row!r:.40}")
        return row

    def _options(self, n: int, row: dict) -> dict:
        options = row["options"]
        if set(row) != {"options"} or not isinstance(options, dict):
            raise OptionError(
                f'{self._where(n)}: the options line is {{"options": {{...}}}} and nothing else'
            )
        unknown = sorted(set(options) - set(OPTION_DEFAULTS))
        if unknown:
            raise OptionError(
                f"{self._where(n)}: unknown option {unknown[0]!r}; known: "
                f"{', '.join(OPTION_DEFAULTS)}"
            )
        checks = {
            "name": lambda v: isinstance(v, str) and v.strip() and v.isprintable() and "/" not in v,
            "scoring": lambda v: v in ("choice", "generate"),
            "separator": lambda v: isinstance(v, str),
            "normalize": lambda v: v in ("none", "chars"),
            "max_new_tokens": lambda v: isinstance(v, int) and not isinstance(v, bool) and v >= 1,
            "stop": lambda v: v in ("newline", "end_of_turn"),
            "stop_text": lambda v: isinstance(v, str) and v != "",
            "chat": lambda v: isinstance(v, bool),
        }
        for key, value in options.items():
            if not checks[key](value):
                raise OptionError(
                    f"{self._where(n)}: option {key} = {value!r:.40} is not allowed "
                    "(docs/tasks.md lists the values)"
                )
        if "stop_text" in options and options.get("stop", "newline") != "newline":
            raise OptionError(f"{self._where(n)}: give stop or stop_text, not both")
        return options

    def _set_scoring_options(self, n: int) -> None:
        o = self.options
        if o["scoring"] not in (None, self.scoring):
            raise OptionError(
                f"{self._where(n)}: the options say scoring {o['scoring']!r}, but the items are "
                f"{self.scoring} items"
            )
        self.separator = o["separator"]
        self.answer_separator = o["separator"]  # what the gradient screen teacher-forces
        self.normalize = o["normalize"] if self.scoring == "choice" else "none"
        self.max_new_tokens = int(o["max_new_tokens"]) if self.scoring == "generate" else 1
        self.chat = bool(o["chat"])
        self.stop = "text" if o["stop_text"] is not None else o["stop"]
        self.stop_text = o["stop_text"]

    def _items(self, rows: list[tuple[int, dict]]) -> list[Item]:
        items: list[Item] = []
        seen_ids: dict[str, int] = {}
        seen_items: dict[str, int] = {}
        for n, row in rows:
            item = self._item(n, row)
            file_id = str(row["id"])
            if file_id in seen_ids:
                raise OptionError(
                    f"{self._where(n)}: duplicate id {file_id!r} (first on line "
                    f"{seen_ids[file_id]}); ids must be unique"
                )
            if item.id in seen_items:
                raise OptionError(
                    f"{self._where(n)}: the same prompt and answer as line {seen_items[item.id]}; "
                    "an item repeated would be counted twice"
                )
            seen_ids[file_id], seen_items[item.id] = n, n
            self.file_ids[item.id], self.line_of[item.id] = file_id, n
            items.append(item)
        return items

    def _item(self, n: int, row: dict) -> Item:
        where = self._where(n)
        if "options" in row:
            raise OptionError(f"{where}: the options line must be the file's first line")
        unknown = sorted(set(row) - ITEM_KEYS)
        if unknown:
            raise OptionError(f"{where}: unknown key {unknown[0]!r}; known: {', '.join(ITEM_KEYS)}")
        for key in ("id", "prompt", "answer"):
            if key not in row:
                raise OptionError(f"{where}: missing key {key!r}")
        if not isinstance(row["id"], (str, int)) or isinstance(row["id"], bool):
            raise OptionError(f"{where}: id must be a string or an integer, got {row['id']!r:.40}")
        prompt = row["prompt"]
        if not isinstance(prompt, str) or not prompt.strip():
            raise OptionError(f"{where}: the prompt must be a non-empty string")
        if ("choices" in row) != (self.scoring == "choice"):
            raise OptionError(
                f"{where}: a {'generate' if 'choices' not in row else 'choice'} item in a file of "
                f"{self.scoring} items (the first item decides); put each kind in its own file"
            )
        subtask = row.get("subtask", "all")
        cluster = row.get("cluster", row["id"])
        for key, value in (("subtask", subtask), ("cluster", cluster)):
            if not isinstance(value, (str, int)) or isinstance(value, bool) or value == "":
                raise OptionError(f"{where}: {key} must be a non-empty string or an integer")
        if "meta" in row and not isinstance(row["meta"], dict):
            raise OptionError(f"{where}: meta must be a JSON object")
        if self.scoring == "choice":
            return self._choice_item(where, row, prompt, str(subtask), str(cluster))
        return self._generate_item(where, row, prompt, str(subtask), str(cluster))

    def _choice_item(self, where, row, prompt, subtask, cluster) -> Item:
        choices, answer = row["choices"], row["answer"]
        if (
            not isinstance(choices, list)
            or len(choices) < 2
            or not all(isinstance(c, str) and c for c in choices)
        ):
            raise OptionError(f"{where}: choices must be a list of two or more non-empty strings")
        if len(set(choices)) != len(choices):
            raise OptionError(f"{where}: two choices are the same text; choices must differ")
        if not isinstance(answer, int) or isinstance(answer, bool):
            raise OptionError(
                f"{where}: answer must be the index of the correct choice (0 to "
                f"{len(choices) - 1}), got {answer!r:.40}"
            )
        if not 0 <= answer < len(choices):
            raise OptionError(
                f"{where}: answer index {answer} is out of range for {len(choices)} choices "
                f"(0 to {len(choices) - 1})"
            )
        if "answers" in row:
            raise OptionError(f"{where}: answers (several accepted texts) is for generate items")
        full = tuple(self.separator + c for c in choices)
        return Item(self.name, subtask, prompt, full[answer], choices=full, cluster=cluster)

    def _generate_item(self, where, row, prompt, subtask, cluster) -> Item:
        more = row.get("answers", [])
        answers = [row["answer"], *(more if isinstance(more, list) else [None])]
        if not all(isinstance(a, str) and a.strip() for a in answers):
            raise OptionError(
                f"{where}: answer (and every entry of answers) must be non-empty text"
            )
        item = Item(self.name, subtask, prompt, row["answer"], cluster=cluster)
        self.accepted[item.id] = frozenset(a.strip() for a in answers)
        return item

    # ------------------------------------------------------------------ the Task protocol

    def sample(self, rng: np.random.Generator, n: int) -> list[Item]:
        """n items drawn with replacement (panels use `items` directly)."""
        return [self.items[i] for i in rng.integers(0, len(self.items), size=n)]

    def is_correct(self, item: Item, output: str) -> bool:
        if self.scoring == "choice":
            return output == item.answer
        accepted = self.accepted.get(item.id, frozenset({item.answer.strip()}))
        return output.strip() in accepted

    def choice_lengths(self, item: Item) -> list[int]:
        """Characters of each choice without the separator (the "chars" normalization)."""
        return [max(1, len(c) - len(self.separator)) for c in item.choices]

    def identity(self) -> dict:
        """What a run records about the task: the file's content and the options in force."""
        return {"file_sha256": self.sha256, "options": self.options}


def is_task_file(name: str) -> bool:
    """A --task value naming a file rather than a registered task."""
    return name.endswith(".jsonl") or "/" in name or "\\" in name


__all__ = ["FileTask", "is_task_file"]
