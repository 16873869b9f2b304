"""The ``evolm`` command line: argparse and verbs only; every verb calls one job or result module.

One module per verb (``register(subparsers)`` adds its parser; its ``run(args)`` returns the exit
status). ``VERBS`` is the registry, in the order ``evolm --help`` lists them.

Design decisions:

- User errors (``evolm.errors.UserError``: a bad config field, a missing file, an unknown model)
  print one line ``evolm: error: ...`` and exit with status 2, without a traceback; so do the
  environment's refusals a user must fix (disk full, permission denied, read-only file system).
  Ctrl-C exits 130 and SIGTERM (schedulers send it before SIGKILL) 143, each with a line saying how
  to continue: SIGTERM raises ``errors.Terminated`` (a KeyboardInterrupt), so a run stops exactly as
  on Ctrl-C and ``run.json`` says ``interrupted``.
- The verb modules import the job modules (which import torch, ~2-4 s) inside ``run``, so
  ``evolm --help`` and argument errors answer at once.
"""

from __future__ import annotations

import argparse
import errno
import signal
import sys

from evolm import __version__
from evolm.commands import analyze, config, demo, es, eval, export, grpo, pipeline, replay, report, sweep
from evolm.errors import Terminated, UserError

VERBS = (demo, es, grpo, pipeline, replay, export, eval, analyze, sweep, report, config)
"""The verb modules, in help order."""


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="evolm", description="Post-train language models with Evolution Strategies on "
                                     "verifiable rewards, and compare what ES and GRPO do to a model.")
    parser.add_argument("--version", action="version", version=f"evolm {__version__}")
    sub = parser.add_subparsers(dest="verb", metavar="VERB")
    for verb in VERBS:
        verb.register(sub)
    return parser


ENVIRONMENT_ERRORS = {errno.ENOSPC: "free some space", errno.EDQUOT: "free some space (disk quota)",
                      errno.EACCES: "fix the permissions or choose another directory",
                      errno.EPERM: "fix the permissions or choose another directory",
                      errno.EROFS: "choose a writable directory"}
"""OSError numbers reported as one line (with the fix) instead of a traceback."""


def _terminate(signum, frame):
    raise Terminated(f"signal {signum}")


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if not getattr(args, "func", None):
        parser.print_help()
        return 2
    try:
        previous = signal.signal(signal.SIGTERM, _terminate)
    except ValueError:  # not the main thread: leave signals alone
        previous = None
    try:
        return int(args.func(args) or 0)
    except UserError as e:
        print(f"evolm: error: {e}", file=sys.stderr)
        return 2
    except OSError as e:
        if e.errno not in ENVIRONMENT_ERRORS:
            raise
        where = f": {e.filename}" if e.filename else ""
        print(f"evolm: error: {e.strerror}{where}; {ENVIRONMENT_ERRORS[e.errno]}, then run the command again "
              "(a run continues with --resume RUN_DIR; its checkpoints are intact)", file=sys.stderr)
        return 2
    except KeyboardInterrupt as e:
        what = "terminated (SIGTERM)" if isinstance(e, Terminated) else "interrupted"
        print(f"evolm: {what}; finished work is saved in the run directory (continue with --resume RUN_DIR)",
              file=sys.stderr)
        return 143 if isinstance(e, Terminated) else 130
    finally:
        if previous is not None:
            signal.signal(signal.SIGTERM, previous)
