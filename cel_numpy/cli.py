"""`cel-numpy` command line: one subcommand per job; each area registers its own.

    cel-numpy theory    train the two-task theory model, ablate heads, write a summary
    cel-numpy fetch     download a known model/vocabulary into the cache
    cel-numpy inspect   describe a model file
    cel-numpy generate  greedy generation with optional head ablations
    cel-numpy localize  the two-stage head-ablation search on a (model, task)
    cel-numpy test-heads  the held-out test of a given head set (the routine's statistics)
    cel-numpy explain   why removing given heads changes a task, head by head
    cel-numpy demo      what `make demo` runs

Errors: bad input of any kind (files, options, prompts, run directories; see cel_numpy.errors)
prints exactly one line, "cel-numpy CMD: error: ...", and exits with status 2; Ctrl-C prints one
line and exits with 130, SIGTERM the same way with 143 (both resumable for localize); running
out of memory is one line with exit status 2 (what to make smaller); anything else is a bug,
reported in one line with exit status 1. Control characters in any of these lines are escaped.
`--debug` (before or after the subcommand) shows the traceback instead.
"""

from __future__ import annotations

import argparse
import codecs
import os
import signal
import sys
import threading
import warnings
from pathlib import Path

from cel_numpy.errors import UserError, one_line, safe_text
from cel_numpy.limits import safe_for_terminal

__all__ = ["UserError", "build_parser", "main"]

EXIT_USER_ERROR = 2
EXIT_BUG = 1
EXIT_INTERRUPTED = 130  # 128 + SIGINT, what shells report for Ctrl-C
EXIT_TERMINATED = 143  # 128 + SIGTERM

OUT_OF_MEMORY = (
    "out of memory: this machine cannot hold what the options ask for; use smaller sizes "
    "(--batch-size, panel sizes, a shorter text) or a machine with more memory"
)

# What to tell the user after Ctrl-C, per subcommand (default: nothing to resume).
INTERRUPTED = {
    "localize": "interrupted; rerun the same command to resume",
    "test-heads": "interrupted; rerun the same command to resume",
}


class Terminated(KeyboardInterrupt):
    """SIGTERM, raised in the main thread: the command stops exactly as on Ctrl-C."""


def _on_sigterm(signum, frame):
    signal.signal(signal.SIGTERM, signal.SIG_DFL)  # a second SIGTERM ends the process at once
    raise Terminated()


def _catch_sigterm():
    """Route SIGTERM through _on_sigterm; returns the handler to restore (None: not possible)."""
    if threading.current_thread() is not threading.main_thread():
        return None
    try:
        return signal.signal(signal.SIGTERM, _on_sigterm)
    except (ValueError, OSError):
        return None


class OneLineParser(argparse.ArgumentParser):
    """argparse with usage errors on one line (not usage + error), exit status 2."""

    def error(self, message: str):
        self.exit(
            EXIT_USER_ERROR, f"{self.prog}: error: {one_line(message)} (see {self.prog} --help)\n"
        )


def build_parser() -> argparse.ArgumentParser:
    from cel_numpy.demo import register as register_demo
    from cel_numpy.explain.cli import register as register_explain
    from cel_numpy.localize.cli import register as register_localize
    from cel_numpy.models.cli import register as register_models
    from cel_numpy.theory.cli import register as register_theory

    parser = OneLineParser(prog="cel-numpy", description=__doc__.split("\n")[0])
    parser.add_argument("--debug", action="store_true", help="show the traceback of any error")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    register_theory(sub)
    register_models(sub)
    register_localize(sub)
    register_explain(sub)
    register_demo(sub, run_command=main)
    for p in sub.choices.values():  # `cel-numpy localize ... --debug` works too
        p.add_argument(
            "--debug",
            action="store_true",
            default=argparse.SUPPRESS,
            help="show the traceback of any error",
        )
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    debug = args.debug or os.environ.get("CEL_NUMPY_DEBUG", "") not in ("", "0")
    prefix = f"cel-numpy {args.command}"
    _never_fail_on_output()
    previous = _catch_sigterm()
    new_out = _new_folder(getattr(args, "out", None))
    try:
        with warnings.catch_warnings():
            if not debug:  # overflow/invalid: non-finite weights and logits are errors of their own
                warnings.simplefilter("ignore", RuntimeWarning)
            return int(args.func(args) or 0)
    except KeyboardInterrupt as err:  # Ctrl-C, or SIGTERM (Terminated)
        if debug:
            raise
        said = INTERRUPTED.get(args.command, "interrupted")
        if isinstance(err, Terminated):
            said = said.replace("interrupted", "terminated (SIGTERM)", 1)
        _say(f"{prefix}: {said}")
        return EXIT_TERMINATED if isinstance(err, Terminated) else EXIT_INTERRUPTED
    except MemoryError:  # before OSError/ValueError: say what to make smaller
        if debug:
            raise
        _say(f"{prefix}: error: {OUT_OF_MEMORY}")
        return EXIT_USER_ERROR
    except (UserError, OSError, ValueError) as err:
        # ValueError: NumPy-level checks with clear messages (e.g. a mean_z of the wrong shape);
        # OSError: a disk that filled up, a file that vanished -- the OS message names the file.
        if debug:
            raise
        _remove_if_left_empty(new_out)
        _say(f"{prefix}: error: {one_line(_message(err))}")
        return EXIT_USER_ERROR
    except Exception as err:  # a bug: one line here, the traceback with --debug
        if debug:
            raise
        _say(
            f"{prefix}: internal error: {type(err).__name__}: {one_line(str(err))} "
            "(a bug in cel-numpy: rerun with --debug for the traceback and report it)"
        )
        return EXIT_BUG
    finally:
        if previous is not None:
            signal.signal(signal.SIGTERM, previous)


def _new_folder(out) -> Path | None:
    """--out when it does not exist yet: a refused command removes the empty folder it made."""
    if out is None or not str(out).strip():
        return None
    try:
        return None if Path(out).exists() else Path(out)
    except (OSError, ValueError):
        return None


def _remove_if_left_empty(folder: Path | None) -> None:
    """A command refused after creating `folder` (the check that --out is writable comes
    first) leaves nothing behind; a folder with anything in it is kept."""
    if folder is None:
        return
    try:
        folder.rmdir()  # only an empty directory: anything written stays
    except OSError:
        pass


def _replace_unprintable(err: UnicodeError):
    """Codec error handler: each character the stream cannot encode becomes U+FFFD (or '?')."""
    if not isinstance(err, UnicodeEncodeError):
        raise err
    try:  # as bytes: encoders take only ASCII replacement text, but any replacement bytes
        mark = "\ufffd".encode(err.encoding)
    except (UnicodeEncodeError, LookupError):
        mark = b"?"
    return mark * (err.end - err.start), err.end


codecs.register_error("cel-numpy-replace", _replace_unprintable)


def _never_fail_on_output() -> None:
    """stdout and stderr replace what they cannot encode (a non-UTF-8 path, kept by Python as lone
    surrogates, printed after the work is done) instead of failing."""
    for stream in (sys.stdout, sys.stderr):
        if getattr(stream, "errors", None) in ("strict", "backslashreplace"):
            try:
                stream.reconfigure(errors="cel-numpy-replace")
            except (AttributeError, ValueError, OSError):  # not a reconfigurable text stream
                pass


def _say(line: str) -> None:
    """One line on stderr; control characters (from a file's contents: a tensor name, a
    template's message) are escaped and text the stream cannot encode (a non-UTF-8 path) is
    replaced."""
    print(safe_text(safe_for_terminal(line), sys.stderr), file=sys.stderr, flush=True)


def _message(err: BaseException) -> str:
    """The user-facing text of an error: OSErrors as 'file: reason', others their message."""
    if isinstance(err, OSError) and not isinstance(err, UserError) and err.strerror:
        where = f"{err.filename}: " if err.filename else ""
        return f"{where}{err.strerror}"
    return str(err) or type(err).__name__


if __name__ == "__main__":
    sys.exit(main())
