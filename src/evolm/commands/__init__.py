"""The ``evolm`` command line: argparse and verbs only; every verb calls one job or result module.

One module per verb (``register(subparsers)`` adds its parser; its ``run(args)`` returns the exit
status). ``VERBS`` is the registry, in the order ``evolm --help`` lists them.

Design decisions:

- User errors (``evolm.errors.UserError``: a bad config field, a missing file, an unknown model)
  print one line ``evolm: error: ...`` and exit with status 2, without a traceback; Ctrl-C exits 130
  with a line saying how to continue.
- The verb modules import the job modules (which import torch, ~2-4 s) inside ``run``, so
  ``evolm --help`` and argument errors answer at once.
"""

from __future__ import annotations

import argparse
import sys

from evolm import __version__
from evolm.commands import analyze, config, demo, es, eval, grpo, pipeline, replay, report, sweep
from evolm.errors import UserError

VERBS = (demo, es, grpo, pipeline, replay, eval, analyze, sweep, report, config)
"""The verb modules, in help order."""


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="evolm", description="Post-train language models with Evolution Strategies on "
                                     "verifiable rewards, and compare what ES and GRPO do to a model.")
    parser.add_argument("--version", action="version", version=f"evolm {__version__}")
    sub = parser.add_subparsers(dest="verb", metavar="VERB")
    for verb in VERBS:
        verb.register(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if not getattr(args, "func", None):
        parser.print_help()
        return 2
    try:
        return int(args.func(args) or 0)
    except UserError as e:
        print(f"evolm: error: {e}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("evolm: interrupted; finished work is saved in the run directory (continue with --resume RUN_DIR)",
              file=sys.stderr)
        return 130
