"""The ``evolm`` command line. It only wires: parse arguments, load configs, call one module.

Every verb has ``--help``. User errors (``evolm.errors.UserError``: a bad config field, a missing file,
an unknown model) print one line ``evolm: error: ...`` and exit with status 2, without a traceback.
"""

from __future__ import annotations

import argparse
import sys

from evolm.errors import UserError


def _add_config_args(p: argparse.ArgumentParser, required: bool = False) -> None:
    p.add_argument("--config", "-c", metavar="FILE", required=required, help="TOML config file (see `evolm config`)")
    p.add_argument("--set", "-s", dest="overrides", action="append", default=[], metavar="KEY=VALUE",
                   help="override a config field, e.g. --set es.sigma=0.002 (repeatable; values are TOML literals)")


# -- es / demo ---------------------------------------------------------------------------------------

def _cmd_es(args) -> int:
    from evolm import config
    from evolm.es.engine import run_es

    if args.resume:
        from evolm.runs import RunDir

        run = RunDir.open(args.resume)
        cfg = config.load(config.ESJob, run.config_path, args.overrides)
        run_es(cfg, resume=run)
        return 0
    if not args.config:
        raise UserError("evolm es needs --config FILE (or --resume RUN_DIR); `evolm config es` prints every field")
    cfg = config.load(config.ESJob, args.config, args.overrides)
    run_es(cfg)
    return 0


def _cmd_demo(args) -> int:
    from evolm.demo import run_demo

    run_demo(overrides=args.overrides, resume=args.resume)
    return 0


def _cmd_config(args) -> int:
    from evolm import config

    jobs = {"es": config.ESJob}
    jobs.update(_extra_jobs())
    if args.job not in jobs:
        raise UserError(f"unknown job '{args.job}'; choose one of {sorted(jobs)}")
    if args.resolve:
        print(config.to_toml(config.load(jobs[args.job], args.resolve, args.overrides)), end="")
    else:
        print("\n".join(config.describe(jobs[args.job])))
    return 0


def _extra_jobs() -> dict:
    """Job configs defined by other modules (GRPO, pipelines), when present."""
    out = {}
    try:
        from evolm.grpo import GRPOJob

        out["grpo"] = GRPOJob
    except ImportError:
        pass
    try:
        from evolm.pipeline import PipelineJob

        out["pipeline"] = PipelineJob
    except ImportError:
        pass
    return out


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="evolm", description="Post-train language models with Evolution Strategies on "
                                     "verifiable rewards, and compare what ES and GRPO do to a model.")
    from evolm import __version__

    parser.add_argument("--version", action="version", version=f"evolm {__version__}")
    sub = parser.add_subparsers(dest="verb", metavar="VERB")

    p = sub.add_parser("demo", help="short ES run on the embedded SmolLM2-135M with before/after pass@k",
                       description="ES on the embedded SmolLM2-135M-Instruct on 2-digit arithmetic (about ten minutes "
                                   "on 2 CPU cores): held-out greedy accuracy and pass@k before and after, and the run directory.")
    p.add_argument("--set", "-s", dest="overrides", action="append", default=[], metavar="KEY=VALUE",
                   help="override a field of the packaged demo config (evolm/configs/demo.toml), e.g. --set es.iterations=5")
    p.add_argument("--resume", metavar="RUN_DIR", help="continue an interrupted demo run")
    p.set_defaults(func=_cmd_demo)

    p = sub.add_parser("es", help="ES post-training from a TOML config",
                       description="Run ES post-training. Writes runs/<name>/ with the resolved config, metrics.jsonl, "
                                   "seed_log.jsonl, checkpoints/ and final/.")
    _add_config_args(p)
    p.add_argument("--resume", metavar="RUN_DIR", help="continue a killed run from its newest checkpoint (bit-identical result)")
    p.set_defaults(func=_cmd_es)

    p = sub.add_parser("config", help="print every config field with its default and meaning, or resolve a config file",
                       description="Without --resolve: list the fields of a job config. With --resolve FILE: print the "
                                   "validated, defaults-filled config.")
    p.add_argument("job", nargs="?", default="es", help="job kind: es, grpo, pipeline (default: es)")
    p.add_argument("--resolve", metavar="FILE", help="validate FILE and print it resolved")
    p.add_argument("--set", "-s", dest="overrides", action="append", default=[], metavar="KEY=VALUE")
    p.set_defaults(func=_cmd_config)

    for register in _extra_verbs():
        register(sub)
    return parser


def _extra_verbs():
    """Verbs implemented in other modules register themselves through ``add_cli(subparsers)``."""
    import importlib

    for module in ("evolm.evaluate", "evolm.grpo", "evolm.pipeline", "evolm.commands.analyze", "evolm.sweep", "evolm.commands.report"):
        try:
            mod = importlib.import_module(module)
        except ModuleNotFoundError as e:
            if e.name and e.name.startswith("evolm"):
                continue
            raise
        yield getattr(mod, "register", None) or mod.add_cli  # evolm.commands.* modules define register(subparsers)


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
        print("evolm: interrupted; finished work is saved in the run directory (continue with --resume RUN_DIR)", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
