"""``evolm config``: every config field of a job with its default and meaning, or a config file resolved."""

from __future__ import annotations

from evolm import config


def register(sub) -> None:
    p = sub.add_parser("config", help="print every config field with its default and meaning, or resolve a config file",
                       description="Without --resolve: list the fields of a job config. With --resolve FILE: print the "
                                   "validated, defaults-filled config.")
    p.add_argument("job", nargs="?", default="es", help="job kind: es, grpo, pipeline (default: es)")
    p.add_argument("--resolve", metavar="FILE", help="validate FILE and print it resolved")
    p.add_argument("--set", "-s", dest="overrides", action="append", default=[], metavar="KEY=VALUE")
    p.set_defaults(func=run)


def run(args) -> int:
    from evolm.registry import job_kind  # the job modules import torch: only when this verb runs

    cls = job_kind(args.job).config_class
    if args.resolve:
        print(config.to_toml(config.load(cls, args.resolve, args.overrides, paths_from_file=True)), end="")
    else:
        print("\n".join(config.describe(cls)))
    return 0
