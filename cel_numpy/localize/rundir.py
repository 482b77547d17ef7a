"""The run directory: manifest, panels, one records file per stage, done-files, and a lock.

Layout (one run = one (model, task) = one directory):

    manifest.json            what this run is (model identity, task, seed, panel sizes and hashes,
                             ablation, cross tasks, cel-numpy version, command line)
    lock                     present while a process writes here: "pid host started"
    panels/discovery.jsonl   one Item per line, with its content-hash id
    panels/heldout.jsonl
    panels/cross-<task>.jsonl
    <stage>.jsonl            one line per (condition, example), see `record_line`: the working
                             copy, appended to while the stage runs
    <stage>.jsonl.gz         the same bytes gzip-compressed, written when the stage finishes
                             (deterministic: no file name, mtime 0). This is the copy to keep or
                             commit: a finished stage validates, resumes and verifies
                             (`cel-numpy summarize --verify`) from either file; the plain one
                             may be deleted once the stage is done
    <stage>.sums             one line per complete block: "<sha256 of its lines> <block name>"
    <stage>.done.json        written last: line count, sha256 of <stage>.jsonl, sha256 of the
                             records of the stages it depends on, the stage's per-condition
                             summary, the wall time of the process that finished it and
                             how many records it found already written (records_resumed)
    finalists.json           the frozen top-10 of the joint search (written before confirmation)
    matched-gate.json        with --matched-gate P: {"gate": P, ...}, written when first given
                             and only before the held-out stage finished
    report.json, report.md, *.png

A record (one JSON object per line, keys in this order, so `grep '"block": "L3H5"'` works):

    {"block": "L3H5", "panel": "discovery", "heads": [[3, 5]], "item": "<id>",
     "correct": true, "answer": " 124", "ref_logprob": -0.73}

`ref_logprob` is the reference answer's log-probability under the condition (null where the
evaluator does not compute it); the informed tie-break of the ranking reads it.

`block` names a group of lines evaluated together (a condition; "intact#1"/"intact#2" in the
baseline; "<task>:<condition>" in the cross-task stage).

Writing: JSON files (manifest, done-files, finalists, report.json) and panels are written to a
temporary file, fsynced and renamed into place, so they exist whole or not at all. Records are
appended: a chunk of complete blocks per write, each write followed by fsync, only after the
file has been validated and cut back to its last complete block.

Resume rules
    * a stage with a done-file is validated: the records' sha256 and line count, the
      dependencies' hashes and the manifest must match, and the records must be exactly the
      blocks the stage would compute now. Any mismatch is an error naming the file; nothing is
      silently redone. Use a fresh --out, or delete that stage's two files (and later stages).
      A finished stage's records are never repaired: even a half line appended to them is
      refused (the sha256 no longer matches).
    * a stage without a done-file resumes from its partial records: complete blocks that
      validate are kept and never recomputed; what follows the last complete block -- the
      lines of an incomplete block and an unterminated final line (no newline: a write cut
      short by SIGKILL or a power loss) -- is dropped, cut off the file and recomputed. Only
      newline-terminated lines count as records, so a torn line is never parsed, even when its
      text happens to be valid JSON. Any malformed or mismatched *terminated* line is an error
      (as above): it cannot come from an interrupted append. Every complete block kept must
      match its checksum in <stage>.sums (appended after the block's records); a block without
      one yet is dropped and recomputed (`check_sums`).

Lock: `lock` holds "pid host started" and an exclusive flock(2) for as long as a run writes
here; the kernel drops the flock when the process dies, however it dies. A second run is refused
while the flock is held ("held by pid N"). Stale lock (the writer was killed with SIGKILL, or
the machine lost power): the lock file is still there but nobody holds its flock. If it names a
pid on this host that is not running, the new run takes the lock over and says so on stderr
(rerunning the same command resumes). If that pid is running (a writer that does not use
flock) or the lock was written on another host (whose processes cannot be checked from here),
the run refuses and the message says how to clear it (delete the file after checking).
A forked child (a worker process) closes its copy of the lock's descriptor at once: the flock
belongs to the open file description that a fork shares, so a worker outliving its parent
would otherwise keep the lock held.
"""

from __future__ import annotations

import errno
import fcntl
import gzip
import hashlib
import json
import os
import socket
import sys
import time
import weakref
from collections.abc import Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from cel_numpy.errors import RunDirError, one_line
from cel_numpy.limits import (
    MAX_JSON_BYTES,
    read_bytes_limited,
    read_json,
    require_regular_file,
    safe_for_terminal,
)
from cel_numpy.localize.conditions import Condition, ExampleResult, normalize_condition
from cel_numpy.models.fetch import sha256_file
from cel_numpy.tasks.base import Item

# Format 2: panels disjoint by cluster (each item records its cluster), records carry the
# reference answer's log-probability. Format 1 directories (panels that may repeat a query across
# discovery and held-out, item-level tests only) are refused: see `check_or_write_manifest`.
FORMAT = "cel-numpy.localize/2"
OLD_FORMATS = ("cel-numpy.localize/1",)


def items_hash(items: Sequence[Item]) -> str:
    """sha256 of the panel's item ids and clusters in order (ids are content hashes, so this pins
    the content, and the cluster labels the statistics use)."""
    return hashlib.sha256("\n".join(f"{it.id}\t{it.cluster}" for it in items).encode()).hexdigest()


def json_dump(path: Path, obj) -> None:
    """Write JSON atomically (temp file + rename), so a crash never leaves half a done-file."""
    text_dump(path, json.dumps(obj, indent=1, sort_keys=False) + "\n")


def text_dump(path: Path, text: str) -> None:
    """Write text atomically (temp file + rename). A failed write (a full disk) removes the
    temporary file and is a RunDirError naming `path`."""
    path = Path(path)
    tmp = path.with_name(path.name + ".tmp")
    try:
        with open(tmp, "w", encoding="utf-8") as fh:
            fh.write(text)
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, path)
    except OSError as err:
        try:
            tmp.unlink(missing_ok=True)
        except OSError:
            pass
        raise write_error(path, err) from None


def write_error(path: Path, err: OSError) -> RunDirError:
    """A failed write as one line naming the file the user knows (never a temporary one)."""
    what = err.strerror or str(err)
    hint = (
        "; free some space, then rerun the same command to resume"
        if err.errno
        in (
            errno.ENOSPC,
            errno.EDQUOT,
        )
        else ""
    )
    return RunDirError(f"cannot write {path}: {what}{hint}")


@contextmanager
def writing(path: Path):
    """`with writing(path):` an OSError inside (a full disk) becomes a RunDirError naming path."""
    try:
        yield
    except OSError as err:
        if isinstance(err, RunDirError):
            raise
        raise write_error(path, err) from None


def read_json_object(path: Path, hint: str) -> dict:
    """A run-directory JSON file that must hold one object; RunDirError naming it otherwise
    (unreadable, not JSON, nested too deeply to parse, or valid JSON of another shape)."""
    obj = read_json(path, "run-directory file", error=RunDirError, hint=hint)
    if not isinstance(obj, dict):
        raise RunDirError(
            f"{path} holds a JSON {type(obj).__name__}, not the object cel-numpy writes; {hint}"
        )
    return obj


# --------------------------------------------------------------------------- directory and lock


MAX_PID = 2**22  # Linux's pid_max ceiling (4194304); larger numbers are not process ids


def _pid_alive(pid: int) -> bool:
    if not 0 < pid <= MAX_PID:  # no process can have it (os.kill would overflow)
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


_HELD_LOCKS: weakref.WeakSet = weakref.WeakSet()  # Lock objects holding their flock


def _drop_locks_in_child() -> None:
    """After fork, in the child: close the inherited lock descriptors (never unlock: that would
    release the parent's flock too) and forget the locks, so the child cannot remove them."""
    for lock in list(_HELD_LOCKS):
        if lock.fd is not None:
            try:
                os.close(lock.fd)
            except OSError:
                pass
            lock.fd = None
    _HELD_LOCKS.clear()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_drop_locks_in_child)


class Lock:
    """`with Lock(run_dir):` one writer at a time (flock on a file holding pid and host).

    See the module docstring for the stale-lock policy. `note` receives the one line said when
    a stale lock is taken over (default: stderr).
    """

    def __init__(self, run_dir: Path, note=None):
        self.path = Path(run_dir) / "lock"
        self.note = note or (  # the lock file's host name is text from a file: escaped
            lambda msg: print(f"cel-numpy: {safe_for_terminal(msg)}", file=sys.stderr, flush=True)
        )
        self.fd: int | None = None

    def __enter__(self):
        for _ in range(10):  # retried only if the file is replaced between open and flock
            fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                os.close(fd)
                raise RunDirError(self._held_message(self._read_owner())) from None
            try:
                same = os.fstat(fd).st_ino == os.stat(self.path).st_ino
            except FileNotFoundError:
                same = False
            if same:
                break
            os.close(fd)  # the holder removed the file after we opened it: try the new one
        else:
            raise RunDirError(f"{self.path} keeps changing: another run is starting here")
        owner = self._read_owner()
        if owner is not None and owner[0] < 0:  # we hold the flock: nobody writes here now
            os.close(fd)
            raise RunDirError(
                f"{self.path} is damaged (not 'PID HOST TIME'); no run holds it now: delete it "
                "and rerun"
            )
        if owner is not None:
            pid, host = owner
            if host != socket.gethostname() or _pid_alive(pid):
                os.close(fd)
                raise RunDirError(self._held_message(owner))
            self.note(
                f"taking over the stale lock {self.path} of pid {pid} on {host} (not running; "
                "it was killed before it could remove the lock)"
            )
        os.ftruncate(fd, 0)
        os.pwrite(
            fd,
            f"{os.getpid()} {socket.gethostname()} {time.strftime('%Y-%m-%dT%H:%M:%S')}\n".encode(),
            0,
        )
        os.fsync(fd)
        self.fd = fd
        _HELD_LOCKS.add(self)
        return self

    def _read_owner(self) -> tuple[int, str] | None:
        """(pid, host) written in the lock file, None if it is empty; (-1, "?") if unreadable."""
        try:
            text = self.path.read_text()
        except OSError:
            return -1, "?"
        if not text.strip():
            return None
        try:
            pid_s, host, *_ = text.split()
            pid = int(pid_s)
        except ValueError:
            return -1, "?"
        if pid <= 0:
            return -1, "?"
        return pid, host

    def _held_message(self, owner) -> str:
        if owner is None or owner[0] < 0:
            return (
                f"{self.path} is held by another run (owner unreadable): wait for it to finish, "
                "or use another --out"
            )
        pid, host = owner
        if host == socket.gethostname() and not _pid_alive(pid):
            return (
                f"stale lock {self.path} (pid {pid} on {host} is not running) is still held: "
                "delete it and rerun"
            )
        where = (
            ""
            if host == socket.gethostname()
            else " (another host: if that run is gone, delete the lock)"
        )
        return f"{self.path} is held by pid {pid} on {host}: another run is writing here{where}"

    def __exit__(self, *exc):
        if self.fd is not None:
            try:
                # while still holding the flock: a waiting run then sees a new file
                self.path.unlink()
            except FileNotFoundError:
                pass
            os.close(self.fd)
            self.fd = None
            _HELD_LOCKS.discard(self)
        return False


# --------------------------------------------------------------------------- manifest

# Fields that must be identical for a resumed run to reuse anything.
MANIFEST_KEYS = (
    "format",
    "kind",
    "model",
    "task",
    "seed",
    "panel_sizes",
    "panel_hashes",
    "cross_tasks",
    "n_nominees",
    "n_finalists",
    "tie_break",
    "null_sets",
)


# present only when not the default / in test-heads / with --matched-null
OPTIONAL_MANIFEST_KEYS = ("screen", "heads", "matched_null")


# Where the model was found: recorded in manifest["model"], not part of the run's identity
# (`./model`, `model` and an absolute path are one model; so is a moved folder).
LOCATION_KEYS = ("spec", "source", "resolved_path")


def _identity(manifest: dict, legacy: bool = False) -> dict:
    ident = {k: manifest.get(k) for k in MANIFEST_KEYS}
    ident.update({k: manifest[k] for k in OPTIONAL_MANIFEST_KEYS if k in manifest})
    if not legacy and isinstance(ident.get("model"), dict):
        ident["model"] = {k: v for k, v in ident["model"].items() if k not in LOCATION_KEYS}
    return ident


def manifest_key(manifest: dict, legacy: bool = False) -> str:
    """sha256 of the manifest's identity; legacy=True: as cel-numpy computed it before the
    model's location was left out (done-files written then stay valid)."""
    ident = _identity(manifest, legacy)
    return hashlib.sha256(json.dumps(ident, sort_keys=True).encode()).hexdigest()


def check_or_write_manifest(run_dir: Path, manifest: dict) -> dict:
    """Write manifest.json, or check that an existing one describes the same run."""
    path = Path(run_dir) / "manifest.json"
    if not path.exists():
        json_dump(path, manifest)
        return manifest
    old = read_manifest(run_dir)
    difference = manifest_difference(old, manifest)  # first: a changed seed changes the prompts
    if difference is not None:
        raise RunDirError(f"{path} describes a different run ({difference}); use a fresh --out")
    check_prompt_hashes(path, old.get("prompt_hashes"), manifest.get("prompt_hashes"))
    return old


def manifest_difference(there: dict, now: dict) -> str | None:
    """The first field in which two manifests describe different runs, as
    "field: value there, value now" (dotted field names, e.g. model.file_sha256); None when
    they describe the same run. Where the model was found, the version and the command are not
    part of a run's identity."""
    a_ident, b_ident = _identity(there), _identity(now)
    for key in MANIFEST_KEYS + OPTIONAL_MANIFEST_KEYS:
        field, a, b = _first_difference(key, a_ident.get(key), b_ident.get(key))
        if field is not None:
            return f"{field}: {_short(a)} there, {_short(b)} now"
    return None


def check_prompt_hashes(path: Path, there, now) -> None:
    """The texts the model reads (rendered chat prompts) must be those the run started with.

    Recorded per panel in manifest["prompt_hashes"] (not part of the identity that done-files
    hash, so a run that recorded none, made by an older cel-numpy, still resumes)."""
    if not isinstance(there, dict) or not isinstance(now, dict):
        return
    for name in sorted(set(there) & set(now)):
        if there[name] != now[name]:
            raise RunDirError(
                f"{path}: the {name} panel's prompts now render differently from when the run "
                "started (a chat template that reads the date, or a changed template): resuming "
                "would mix two sets of prompts; use a fresh --out"
            )


def _first_difference(key: str, a, b):
    """(dotted name of the first field where a and b differ, its two values);
    (None, ..) if equal."""
    if a == b:
        return None, a, b
    if isinstance(a, dict) and isinstance(b, dict):
        for k in sorted(set(a) | set(b), key=str):
            if a.get(k) != b.get(k):
                return _first_difference(f"{key}.{k}", a.get(k), b.get(k))
    return key, a, b


def read_manifest(run_dir: Path) -> dict:
    """manifest.json of a run directory of the current format (one-line RunDirError otherwise)."""
    path = Path(run_dir) / "manifest.json"
    if not path.exists():
        if not Path(run_dir).exists():
            raise RunDirError(f"{run_dir} does not exist: give a run directory (its --out)")
        if not Path(run_dir).is_dir():
            raise RunDirError(f"{run_dir} is a file, not a run directory: give its folder (--out)")
        raise RunDirError(
            f"{run_dir} is not a run directory (no manifest.json): give the --out of a "
            "localize or test-heads run"
        )
    manifest = read_json_object(
        path, "the run directory is damaged: rerun its command with a fresh --out"
    )
    fmt = manifest.get("format")
    if fmt in OLD_FORMATS:
        raise RunDirError(
            f"{run_dir} was written in the old format {fmt} (panels may repeat a query across "
            "discovery and held-out; item-level tests only): its report.md stays readable as it "
            "is; re-run the command in its manifest.json with a fresh --out for the new panels "
            "and tests"
        )
    if fmt != FORMAT:
        raise RunDirError(f"{path}: unknown format {fmt!r} (this cel-numpy writes {FORMAT})")
    return manifest


def _short(value) -> str:
    s = json.dumps(value, sort_keys=True)
    return s if len(s) <= 80 else s[:77] + "..."


# --------------------------------------------------------------------------- panels


def item_to_json(item: Item) -> dict:
    return {
        "id": item.id,
        "task": item.task,
        "subtask": item.subtask,
        "prompt": item.prompt,
        "answer": item.answer,
        "choices": list(item.choices),
        "cluster": item.cluster,
    }


def write_panel(path: Path, items: Sequence[Item]) -> None:
    with writing(path.parent):
        path.parent.mkdir(parents=True, exist_ok=True)
    text_dump(path, "".join(json.dumps(item_to_json(it)) + "\n" for it in items))


def read_panel(path: Path) -> list[Item]:
    """Read a panel, checking every stored id against the content hash of its fields."""
    items = []
    raw = read_bytes_limited(path, "panel file", max_bytes=MAX_JSON_BYTES, error=RunDirError)
    try:
        lines = raw.decode("utf-8").splitlines()
    except UnicodeDecodeError as err:
        raise RunDirError(f"{path}: not UTF-8 text ({err.reason}); use a fresh --out") from None
    for n, line in enumerate(lines, 1):
        try:
            d = json.loads(line)
            it = Item(
                task=d["task"],
                subtask=d["subtask"],
                prompt=d["prompt"],
                answer=d["answer"],
                choices=tuple(d["choices"]),
                cluster=d["cluster"],
            )
        except (json.JSONDecodeError, KeyError, TypeError, ValueError, RecursionError):
            raise RunDirError(f"{path}:{n}: malformed panel line; use a fresh --out") from None
        if it.id != d.get("id"):
            raise RunDirError(
                f"{path}:{n}: item id does not match its content (edited?); use a fresh --out"
            )
        items.append(it)
    return items


# --------------------------------------------------------------------------- stage records


@dataclass(frozen=True)
class Block:
    """One condition evaluated on one panel: the unit of writing, resuming and summarising."""

    name: str  # unique within the stage, e.g. "L3H5", "intact#1", "theory-B:L0H1"
    panel: str  # "discovery" | "heldout" | "cross-<task>"
    condition: Condition


def record_line(block: Block, result: ExampleResult) -> str:
    return (
        json.dumps(
            {
                "block": block.name,
                "panel": block.panel,
                "heads": [list(h) for h in block.condition],
                "item": result.item_id,
                "correct": bool(result.correct),
                "answer": result.answer,
                "ref_logprob": None if result.ref_logprob is None else float(result.ref_logprob),
            }
        )
        + "\n"
    )


RECORD_KEYS = ["block", "panel", "heads", "item", "correct", "answer", "ref_logprob"]


def stage_paths(run_dir: Path, stage: str) -> tuple[Path, Path]:
    return Path(run_dir) / f"{stage}.jsonl", Path(run_dir) / f"{stage}.done.json"


def _fresh_hint(stage: str) -> str:
    return (
        f"use a fresh --out, or delete {stage}.jsonl and {stage}.done.json (and every later "
        "stage) to redo it"
    )


def read_blocks(
    path: Path, plan: Sequence[Block], panels: dict[str, list[Item]], stage: str, complete: bool
) -> tuple[list[list[ExampleResult]], int, int]:
    """Parse `path` against `plan`: (results of the complete blocks, their byte
    length, lines dropped).

    Every complete line must be a well-formed record of the next planned (block, item).
    complete=True (a finished stage): every planned block must be there and nothing else.
    complete=False (a partial stage): a torn last line and an incomplete last block are dropped.
    """
    if Path(path).exists():
        require_regular_file(path, "records file", RunDirError)  # never a FIFO or /dev/zero
        data = Path(path).read_bytes()
    else:
        data = b""
    return parse_blocks(data, path, plan, panels, stage, complete)


def parse_blocks(
    data: bytes,
    path: Path,
    plan: Sequence[Block],
    panels: dict[str, list[Item]],
    stage: str,
    complete: bool,
) -> tuple[list[list[ExampleResult]], int, int]:
    """`read_blocks` on the records' bytes (`path` names them in errors)."""
    lines = data.split(b"\n")
    torn = lines.pop()  # b"" if the file ends with a newline
    if torn and complete:
        raise RunDirError(f"{path}: last line is cut short; {_fresh_hint(stage)}")
    blocks: list[list[ExampleResult]] = []
    current: list[ExampleResult] = []
    good_bytes, pos = 0, 0
    for n, raw in enumerate(lines, 1):
        pos += len(raw) + 1
        bi = len(blocks)
        if bi >= len(plan):
            raise RunDirError(
                f"{path}:{n}: more records than the stage plans; {_fresh_hint(stage)}"
            )
        block = plan[bi]
        items = panels[block.panel]
        try:
            d = json.loads(raw)
            ok = (
                isinstance(d, dict)
                and list(d) == RECORD_KEYS
                and isinstance(d["correct"], bool)
                and isinstance(d["answer"], str)
                and (d["ref_logprob"] is None or isinstance(d["ref_logprob"], (int, float)))
            )
            heads = normalize_condition(d["heads"]) if ok and isinstance(d["heads"], list) else None
        except (json.JSONDecodeError, UnicodeDecodeError, RecursionError, ValueError, TypeError):
            ok = False
        if not ok:
            raise RunDirError(f"{path}:{n}: malformed record; {_fresh_hint(stage)}")
        expected_item = items[len(current)].id
        if (
            d["block"] != block.name
            or d["panel"] != block.panel
            or heads != block.condition
            or d["item"] != expected_item
        ):
            raise RunDirError(
                f"{path}:{n}: record does not match the plan (expected block {block.name} item "
                f"{expected_item}, found block {d['block']} item {d['item']}); "
                f"{_fresh_hint(stage)}"
            )
        current.append(ExampleResult(d["item"], d["correct"], d["answer"], d["ref_logprob"]))
        if len(current) == len(items):
            blocks.append(current)
            current = []
            good_bytes = pos
    dropped = len(current) + (1 if torn else 0)
    if complete and (len(blocks) != len(plan) or current):
        raise RunDirError(
            f"{path}: {len(blocks)} complete blocks, the stage plans {len(plan)}; "
            f"{_fresh_hint(stage)}"
        )
    return blocks, good_bytes, dropped


def sums_path(run_dir: Path, stage: str) -> Path:
    return Path(run_dir) / f"{stage}.sums"


def sum_line(block: Block, text: str) -> str:
    """The checksum line of one block's records: "<sha256 of its bytes> <block name>"."""
    return f"{hashlib.sha256(text.encode()).hexdigest()} {block.name}\n"


def append_sums(run_dir: Path, stage: str, lines: Sequence[str]) -> None:
    """Append checksum lines (after the records they describe are on disk), with fsync."""
    path = sums_path(run_dir, stage)
    with writing(path), open(path, "ab") as fh:
        fh.write("".join(lines).encode())
        fh.flush()
        os.fsync(fh.fileno())


def check_sums(
    run_dir: Path,
    stage: str,
    plan: Sequence[Block],
    blocks: list[list[ExampleResult]],
    good_bytes: int,
    dropped: int,
) -> tuple[list[list[ExampleResult]], int, int]:
    """Check the complete blocks of an unfinished stage against <stage>.sums.

    A block whose bytes differ from its checksum is an error (an edited record). Blocks after
    the last checksum (the run died between writing a block and its checksum) are dropped, to
    be recomputed, like a torn line; so are checksums of blocks no longer in the records.
    Returns (blocks kept, their byte length, lines dropped).
    Records without a .sums file were written by an older cel-numpy: kept unchecked.
    """
    records, sums = stage_paths(run_dir, stage)[0], sums_path(run_dir, stage)
    if not sums.exists():
        return blocks, good_bytes, dropped
    require_regular_file(sums, "checksum file", RunDirError)
    lines = sums.read_bytes().split(b"\n")
    lines.pop()  # a torn (unterminated) last line is not a checksum
    del lines[len(blocks) :]  # checksums of records cut off the file: recomputed, like them
    data = Path(records).read_bytes()[:good_bytes]
    start = 0
    for i, line in enumerate(lines):
        end = start
        for _ in blocks[i]:
            end = data.index(b"\n", end) + 1
        want = sum_line(plan[i], data[start:end].decode("utf-8", "surrogateescape")).encode()
        if line + b"\n" != want:
            raise RunDirError(
                f"{records}: block {plan[i].name} does not match its checksum in {sums.name} "
                f"(edited or corrupted); {_fresh_hint(stage)}"
            )
        start = end
    keep = len(lines)
    with open(sums, "r+b") as fh:  # drop a torn checksum line
        fh.truncate(sum(len(line) + 1 for line in lines))
    dropped += sum(len(b) for b in blocks[keep:])
    return blocks[:keep], start, dropped


def validate_done(
    run_dir: Path,
    stage: str,
    plan: Sequence[Block],
    panels: dict[str, list[Item]],
    manifest: dict,
    depends: dict[str, str],
) -> tuple[list[list[ExampleResult]], dict]:
    """Check a finished stage against its done-file, the manifest and the plan;
    return its results."""
    done = stage_paths(run_dir, stage)[1]
    info = read_json_object(done, _fresh_hint(stage))
    if info.get("manifest_key") not in (manifest_key(manifest), manifest_key(manifest, True)):
        raise RunDirError(f"{done} belongs to a different manifest; {_fresh_hint(stage)}")
    records, data = finished_records(run_dir, stage, info)
    if info.get("depends") != depends:
        raise RunDirError(
            f"{done} was computed from different earlier stages; {_fresh_hint(stage)}"
        )
    blocks, _, _ = parse_blocks(data, records, plan, panels, stage, complete=True)
    n_lines = sum(len(b) for b in blocks)
    if info.get("n_records") != n_lines or info.get("n_blocks") != len(plan):
        raise RunDirError(f"{done}: counts do not match {records.name}; {_fresh_hint(stage)}")
    return blocks, info


def write_done(
    run_dir: Path,
    stage: str,
    n_records: int,
    n_blocks: int,
    manifest: dict,
    depends: dict[str, str],
    summary,
    seconds: float | None = None,
    records_resumed: int = 0,
) -> dict:
    """Write <stage>.done.json; `seconds` is the wall time of the process that
    finished the stage, which evaluated all but `records_resumed` of its records (those were
    written by earlier processes of a resumed run)."""
    records, done = stage_paths(run_dir, stage)
    info = {
        "stage": stage,
        "records": records.name,
        "n_records": n_records,
        "n_blocks": n_blocks,
        "sha256": sha256_file(records),
        "manifest_key": manifest_key(manifest),
        "depends": depends,
        "finished": time.strftime("%Y-%m-%dT%H:%M:%S"),
        "seconds": None if seconds is None else round(seconds, 1),
        "records_resumed": records_resumed,
        "summary": summary,
    }
    json_dump(done, info)
    return info


def records_sha(run_dir: Path, stage: str) -> str:
    """sha256 of a finished stage's records, as its done-file states (used in `depends`)."""
    done = stage_paths(run_dir, stage)[1]
    sha = read_json_object(done, _fresh_hint(stage)).get("sha256")
    if not isinstance(sha, str):
        raise RunDirError(f"{done} has no sha256 of its records; {_fresh_hint(stage)}")
    return sha


# --------------------------------------------------------------------------- compressed records


def stage_started(run_dir: Path, stage: str) -> bool:
    """Whether any file of `stage` exists: its records, done-file, checksums or gzip copy."""
    return any(
        p.exists()
        for p in (*stage_paths(run_dir, stage), sums_path(run_dir, stage), gz_path(run_dir, stage))
    )


GATE_FILE = "matched-gate.json"


def gate_path(run_dir: Path) -> Path:
    """Where `--matched-gate` is recorded when first given (`Localizer._record_gate`)."""
    return Path(run_dir) / GATE_FILE


def gz_path(run_dir: Path, stage: str) -> Path:
    return Path(run_dir) / f"{stage}.jsonl.gz"


def gzip_bytes(data: bytes) -> bytes:
    """gzip of `data` that depends on the bytes alone (no file name, mtime 0)."""
    import io

    buf = io.BytesIO()
    with gzip.GzipFile(filename="", mode="wb", fileobj=buf, compresslevel=9, mtime=0) as gz:
        gz.write(data)
    return buf.getvalue()


def compress_records(run_dir: Path, stage: str) -> None:
    """Write <stage>.jsonl.gz from the finished stage's <stage>.jsonl (atomically), unless a .gz
    holding the same bytes is already there."""
    plain, gz = stage_paths(run_dir, stage)[0], gz_path(run_dir, stage)
    data = plain.read_bytes()
    if gz.exists():
        try:
            if gzip.decompress(gz.read_bytes()) == data:
                return
        except (OSError, EOFError, gzip.BadGzipFile):
            pass  # a damaged copy: rewritten from the plain records, which the done-file pins
    tmp = gz.with_name(gz.name + ".tmp")
    with writing(gz):
        tmp.write_bytes(gzip_bytes(data))
        os.replace(tmp, gz)


MAX_RECORDS_BYTES = 2**31  # uncompressed records of one stage: far beyond any real run


def finished_records(run_dir: Path, stage: str, info: dict) -> tuple[Path, bytes]:
    """(the file read, the bytes) of a finished stage's records: <stage>.jsonl, or its .gz when
    the plain file is gone; RunDirError if neither is there or the bytes do not match the sha256
    the done-file `info` states."""
    plain, done = stage_paths(run_dir, stage)
    gz = gz_path(run_dir, stage)
    if plain.exists():
        require_regular_file(plain, "records file", RunDirError)  # never a FIFO or /dev/zero
        path, data = plain, plain.read_bytes()
    elif gz.exists():
        require_regular_file(gz, "records file", RunDirError)
        path = gz
        try:
            with gzip.open(gz, "rb") as fh:
                data = fh.read(MAX_RECORDS_BYTES + 1)
        except (OSError, EOFError, gzip.BadGzipFile) as err:
            raise RunDirError(
                f"{gz} is not a readable gzip file ({one_line(str(err))}); {_fresh_hint(stage)}"
            ) from None
        if len(data) > MAX_RECORDS_BYTES:
            raise RunDirError(f"{gz} expands beyond {MAX_RECORDS_BYTES} bytes: not our records")
    else:
        raise RunDirError(
            f"{plain} (or {gz.name}) is missing but {done.name} exists; {_fresh_hint(stage)}"
        )
    if info.get("sha256") != hashlib.sha256(data).hexdigest():
        raise RunDirError(
            f"{path} does not match {done.name} (sha256 differs: edited or corrupted); "
            f"{_fresh_hint(stage)}"
        )
    return path, data
