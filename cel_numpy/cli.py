"""`cel-numpy` command line: one subcommand per job; each area registers its own.

    cel-numpy theory    train the two-task theory model, ablate heads, write a summary
    cel-numpy fetch     download a known model/vocabulary into the cache
    cel-numpy inspect   describe a model file
    cel-numpy generate  greedy generation with optional head ablations
    cel-numpy localize  the two-stage head-ablation search on a (model, task)
    cel-numpy demo      what `make demo` runs
"""

from __future__ import annotations

import argparse
import sys


class UserError(Exception):
    """A problem with the user's input: printed as one line, exit status 2, no traceback."""


def build_parser() -> argparse.ArgumentParser:
    from cel_numpy.demo import register as register_demo
    from cel_numpy.localize.cli import register as register_localize
    from cel_numpy.models.cli import register as register_models
    from cel_numpy.theory.cli import register as register_theory

    parser = argparse.ArgumentParser(prog="cel-numpy", description=__doc__.split("\n")[0])
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    register_theory(sub)
    register_models(sub)
    register_localize(sub)
    register_demo(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        return int(args.func(args) or 0)
    except (UserError, FileNotFoundError, PermissionError, ValueError) as err:
        print(f"cel-numpy {args.command}: error: {err}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print(f"cel-numpy {args.command}: interrupted; finished stages are kept on disk", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
