"""Output directories: created and proven writable before any work starts.

One check for every command that writes a folder (`cel-numpy theory --out`, `cel-numpy localize
--out`, the demo), so the same condition always gives the same one-line `OptionError`:

    out_arg(text)             argparse type for --out: an empty value (which would mean the
                              current folder) is refused, not silently turned into "."
    prepare_out(out)          create the folder and prove it writable
    run_directory_holding(p)  the run directory (a folder with manifest.json) that is `p` or
                              holds it: commands whose output is not a run refuse to write there
    check_out(out)            the checks of `prepare_out` that write nothing (for --plan)
    refuse_inside_run(out)    a run's --out may be a run directory, not a folder inside one
    refuse_other_output(out)  ... nor a folder holding a report of something else (an explain
                              report), which the run's report would overwrite
"""

from __future__ import annotations

import argparse
import os
from pathlib import Path

from cel_numpy.errors import OptionError


def out_arg(text: str) -> Path:
    """An --out value: a non-empty path (argparse turns the ValueError into a one-line error)."""
    if not text.strip():
        raise argparse.ArgumentTypeError("is empty: give a folder, e.g. --out results/my-run")
    return Path(text).expanduser()


def run_directory_holding(path: str | os.PathLike) -> Path | None:
    """The nearest folder at or above `path` whose manifest.json is a cel-numpy run's (its
    "format" says so; any other project's manifest.json is no run), or None."""
    from cel_numpy.limits import read_json

    target = Path(path).resolve()
    for folder in (target, *target.parents):
        if not (folder / "manifest.json").is_file():
            continue
        try:
            manifest = read_json(folder / "manifest.json", "run manifest", error=OptionError)
        except OptionError:
            continue  # unreadable: not evidence of a run
        if isinstance(manifest, dict) and str(manifest.get("format", "")).startswith("cel-numpy"):
            return folder
    return None


def refuse_inside_run(out: str | os.PathLike, what: str = "--out") -> None:
    """OptionError when `out` lies inside a run directory other than itself: a run written
    there would mix its files with another run's (`out` itself being a run is the resume)."""
    holder = run_directory_holding(out)
    if holder is not None and holder != Path(out).resolve():
        raise OptionError(
            f"{what} {out} is inside the run directory {holder}: give a folder of its own, "
            "e.g. a sibling of it"
        )


# files a run writes that other commands (explain) write too, by name
RUN_REPORT_NAMES = ("report.json", "report.md", "finalists.json", "matched-gate.json")


def refuse_other_output(out: str | os.PathLike, what: str = "--out") -> None:
    """OptionError when `out` is a folder without a run's manifest.json that holds a file a
    run would write (report.json, report.md, ...): that file is some other command's result
    (an explain report) and the run would overwrite it."""
    out = Path(out)
    if not out.is_dir() or (out / "manifest.json").is_file():
        return
    clash = next((name for name in RUN_REPORT_NAMES if (out / name).exists()), None)
    if clash is not None:
        raise OptionError(
            f"{what} {out} holds {clash} but no manifest.json: it is not a run directory, and "
            "the run would overwrite that file: give a folder of its own"
        )


def check_out(out: str | os.PathLike, option: str = "--out") -> Path:
    """`out` as a Path if it is a usable --out (empty, or an existing file, is one-line
    OptionError); nothing is created."""
    if not str(out).strip():
        raise OptionError(f"{option} is empty: give a folder, e.g. {option} results/my-run")
    out = Path(out)
    if out.exists() and not out.is_dir():
        raise OptionError(
            f"{option} {out} is an existing file, not a directory: give a new or existing directory"
        )
    return out


def prepare_out(out: str | os.PathLike, option: str = "--out") -> Path:
    """Create `out` (and parents) if needed and write a probe file there; else one-line error.

    `option` names the argument in the message ("--out" on the command line).
    """
    out = check_out(out, option)
    try:
        out.mkdir(parents=True, exist_ok=True)
        probe = out / f".write-test-{os.getpid()}"
        probe.write_text("ok")
        probe.unlink()
    except OSError as err:
        raise OptionError(f"cannot write to {option} {out}: {err.strerror or err}") from None
    return out
