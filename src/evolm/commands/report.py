"""``evolm report``: the verb's arguments; the report itself is ``evolm.report.build_report``.

Design decisions:

- ``--label NAME=PATH`` is parsed here into ``{path: name}``; a malformed one is a one-line error.
- ``--reference`` is a TOML literal like a ``--set`` value (``30``, ``0.001``, ``'one_point'``), so it
  matches a grid value of any type.
- ``--study CLAIMS`` builds the reproduction study's page instead (``evolm.report.build_study``); it takes no
  PATH (the claims file names its inputs) and ``--out`` defaults to ``docs`` for it.
"""

from __future__ import annotations

import argparse

from evolm import config
from evolm.errors import UserError
from evolm.report import build_report, build_study
from evolm.analysis.ablations import BAND, BAND_MODE, WINDOW


def parse_labels(items: list[str]) -> dict[str, str]:
    """``["NAME=PATH", ...]`` -> ``{PATH: NAME}``."""
    labels = {}
    for item in items:
        name, sep, path = item.partition("=")
        if not sep or not name.strip() or not path.strip():
            raise UserError(f"--label expects NAME=PATH, e.g. --label es=runs/es-demo (got '{item}')")
        labels[path.strip()] = name.strip()
    return labels


def _cmd_report(args) -> int:
    if args.study:
        if args.paths or args.label:
            raise UserError("--study takes no PATH or --label: the claims file names the files it reads "
                            f"(got {' '.join(args.paths + args.label)}); drop them or drop --study")
        study = build_study(args.study, args.out or "docs")
        verdicts = [o.verdict for o in study.outcomes]
        counts = ", ".join(f"{verdicts.count(v)} {v}" for v in dict.fromkeys(verdicts))
        print(f"wrote {study.markdown} ({len(study.outcomes)} claims: {counts}; {len(study.figures)} figures in "
              f"{study.markdown.parent / 'study' / 'figures'}) and {study.json}")
        return 0
    if not args.paths and not args.label:
        raise UserError("evolm report needs at least one run, sweep, eval or analysis directory (or --study CLAIMS)")
    args.out = args.out or "report"
    reference = None if args.reference is None else config.parse_value(args.reference)
    result = build_report(args.paths, args.out, labels=parse_labels(args.label), title=args.title, window=args.window,
                          band=args.band, band_mode=args.band_mode, reference=reference, match=args.match)
    print(f"wrote {result.markdown}, {result.html} and {result.json} ({len(result.figures)} figures in {result.out / 'figures'})")
    return 0


def register(subparsers) -> None:
    """Add the ``report`` verb; its ``func(args)`` returns the exit code."""
    p = subparsers.add_parser(
        "report", help="report.md + self-contained report.html with plots and tables from runs, sweeps, evals and analyses",
        description="Build one report from run directories (ES, GRPO, pipeline), sweep directories (evolm sweep), eval "
                    "outputs (eval.json) and analysis outputs (drift.json, sparsity.json, localisation.json, "
                    "compression.json, diversity.json, update_variance.json). Draws pass@k curves (base vs trained), entropy "
                    "and pass@k trajectories, training reward curves (against updates, sequences, tokens or seconds: --match), a cost "
                    "table, what each run spent (budget), the analyses, and for sweeps the "
                    "population-scaling, sigma, estimator and shaping ablations, each with a table of its numbers. "
                    "Writes <out>/report.md, <out>/report.html (figures embedded), <out>/report.json and <out>/figures/. "
                    "With --study CLAIMS it writes the reproduction study's page instead: <out>/REPRODUCTION.md (one row "
                    "per claim: command, what the paper reports, what was measured here with its 95% interval, verdict: "
                    "contradicted only at the claim's family-wise level), "
                    "figures under <out>/study/figures/ and <out>/study/reproduction.json, from the committed files the "
                    "claims file names.",
        epilog="examples:\n  evolm report runs/es runs/grpo runs/es/analysis --label ES=runs/es --out report\n"
               "  evolm report --study experiments/study/claims.toml --out docs   # docs/REPRODUCTION.md",
        formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("paths", nargs="*", metavar="PATH", help="run, sweep, eval or analysis directories")
    p.add_argument("--label", action="append", default=[], metavar="NAME=PATH",
                   help="name an input in plots and tables (repeatable; adds PATH when not given positionally)")
    p.add_argument("--out", "-o", default=None, metavar="DIR", help="output directory (default: report; docs with --study)")
    p.add_argument("--study", metavar="CLAIMS", help="build the reproduction study's page from a claims file (e.g. "
                                                     "experiments/study/claims.toml) instead of a report of PATHs")
    p.add_argument("--title", default="evolm report", help="report title (default: evolm report)")
    p.add_argument("--match", default="updates", choices=["updates", "sequences", "tokens", "seconds"],
                   help="the quantity runs are compared on: x-axis of the training-reward and probe curves, and the "
                        "matched column of the budget table (default: updates)")
    g = p.add_argument_group("sweep ablations")
    g.add_argument("--window", type=int, default=WINDOW, help="trailing moving-average window for reward curves (default: 1 = none)")
    g.add_argument("--band", type=float, default=BAND, help="population-scaling band (default: 0.005 = 0.5%%)")
    g.add_argument("--band-mode", default=BAND_MODE, choices=["relative", "absolute"],
                   help="band relative to the reference reward (|Δ| <= band·|r_ref|) or absolute (|Δ| <= band) (default: relative)")
    g.add_argument("--reference", metavar="N", help="reference population size (default: the largest N of each group)")
    p.set_defaults(func=_cmd_report)
