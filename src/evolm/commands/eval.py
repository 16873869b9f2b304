"""``evolm eval``: pass@k, maj@k, greedy accuracy and token entropy of a model on held-out tasks
(``evolm.evaluate.evaluate_model``), or exactly as a run measured its held-out evaluation
(``--like RUN_DIR``: ``evolm.heldout.evaluate_like``). Each invocation writes a new directory."""

from __future__ import annotations

import argparse
import textwrap

from evolm.config import parse_value
from evolm.errors import UserError
from evolm.evaluate import check_out_dir, default_out_dir, evaluate_model, markdown_table, write_outputs
from evolm.models import DEFAULT_MODEL
from evolm.runs import RunDir


def _parse_ks(text: str) -> list[int]:
    try:
        return [int(x) for x in text.split(",") if x.strip()]
    except ValueError:
        raise UserError(f"--k expects comma-separated integers such as 1,16,32 (got '{text}')") from None


def _parse_task_params(items: list[str]) -> dict[str, dict]:
    out: dict[str, dict] = {}
    for item in items:
        key, sep, value = item.partition("=")
        task, dot, param = key.strip().partition(".")
        if not sep or not dot or not task or not param:
            raise UserError(f"--task-param expects TASK.KEY=VALUE, e.g. gpqa.path=~/gpqa_diamond.csv (got '{item}')")
        out.setdefault(task, {})[param] = parse_value(value.strip())
    return out


LIKE_CONFLICTS = {"tasks": "--tasks", "temperature": "--temperature", "top_p": "--top-p",
                  "max_new_tokens": "--max-new-tokens", "limit": "--limit", "split": "--split", "seed": "--seed",
                  "task_param": "--task-param", "no_greedy": "--no-greedy", "batch_size": "--batch-size",
                  "cache_dir": "--cache-dir"}
"""Options ``--like`` takes from the run (its task, problems, sampling, length, seeds and batching); ``--n`` and
``--k`` may be given with it, to reach a larger k on the run's problems than the run measured."""

DEFAULTS = {"model": DEFAULT_MODEL, "tasks": "csqa,arc_easy", "n": 32, "k": "1,16,32", "temperature": 1.0, "top_p": 1.0, "max_new_tokens": 0,
            "split": "test", "seed": 0, "batch_size": 32, "dtype": "float32", "device": "cpu", "threads": 1}
"""Defaults of the options left unset on the command line (None there, so ``--like`` can tell)."""


def run(args) -> int:
    if args.like:
        return _run_like(args)
    for key, value in DEFAULTS.items():
        if getattr(args, key) is None:
            setattr(args, key, value)
    tasks = [t.strip() for t in args.tasks.split(",") if t.strip()]
    if not tasks:
        raise UserError("--tasks needs at least one task name, e.g. --tasks csqa,arc_easy")
    out_dir = check_out_dir(args.out) if args.out else default_out_dir(args.model, tasks)
    report = evaluate_model(args.model, tasks, n=args.n, ks=_parse_ks(args.k), temperature=args.temperature, top_p=args.top_p,
                            max_new_tokens=args.max_new_tokens, limit=args.limit, split=args.split, seed=args.seed,
                            greedy=not args.no_greedy, task_params=_parse_task_params(args.task_param), out_dir=out_dir,
                            cache_dir=args.cache_dir, use_cache=not args.no_cache, batch_size=args.batch_size,
                            dtype=args.dtype, device=args.device, threads=args.threads, progress=not args.no_progress)
    print(markdown_table(report))
    print(f"wrote {out_dir / 'eval.json'}, {out_dir / 'eval.md'} and {out_dir / 'passk.png'}")
    return 0


def _run_like(args) -> int:
    from evolm.heldout import evaluate_like  # torch: imported when the verb runs

    given = [flag for key, flag in LIKE_CONFLICTS.items() if getattr(args, key) not in (None, [], False)]
    if given:
        raise UserError(f"--like takes the task, problems, temperature, length, seeds and batching from the "
                        f"run; drop {', '.join(given)} (or drop --like to choose them yourself)")
    if args.n is not None and args.n < 1:
        raise UserError(f"--n must be at least 1 (got {args.n})")
    run = RunDir.open(args.like)
    model = args.model
    out_dir = check_out_dir(args.out) if args.out else default_out_dir(model, like=str(run.path))
    report = evaluate_like(run.path, model, dtype=args.dtype, device=args.device, threads=args.threads,
                           progress=not args.no_progress, n_samples=args.n,
                           ks=_parse_ks(args.k) if args.k is not None else None)
    write_outputs(report, out_dir)
    print(markdown_table(report))
    (task, result), = report["tasks"].items()
    after = run.evaluation("after")
    if model is None and after is not None and args.n is None and args.k is None:
        same = after.get("summary") == result["summary"]
        print(f"the run's eval_after.json: {'the same summary, exactly' if same else 'a DIFFERENT summary'} "
              f"({task}, {result['summary'].get('problems')} problems)")
    print(f"wrote {out_dir / 'eval.json'}, {out_dir / 'eval.md'} and {out_dir / 'passk.png'}")
    return 0


def register(sub) -> None:
    p = sub.add_parser(
        "eval", help="pass@k, maj@k, greedy accuracy and token entropy of a model on held-out tasks",
        description=textwrap.fill("Sample --n completions per problem and report pass@k (unbiased estimator), maj@k (expected "
                    "majority vote over k-subsets), greedy accuracy, token-weighted entropy and distinct correct answers. "
                    "Writes eval.json, eval.md and passk.png into a new directory per invocation (never overwriting an "
                    "earlier evaluation). Generations are cached per model fingerprint, so an "
                    "interrupted eval resumes and a base model's samples are reused. Tasks: csqa, arc_easy, arc_challenge, "
                    "sst2, gsm8k, math500 (bundled), hotpotqa and gpqa (your files: --task-param gpqa.path=FILE), and any "
                    "other registered task. --like RUN_DIR measures exactly as that run measured its eval_after.json.", 100),
        epilog="examples:\n"
               "  evolm eval --model smollm2-135m --tasks csqa,gsm8k --n 32 --k 1,16,32 --limit 200\n"
               "  evolm eval --like runs/es-demo                     # the run's final/ weights: eval_after.json again\n"
               "  evolm eval --like runs/es-demo --model smollm2-135m # the base model: eval_before.json again\n"
               "  evolm eval --like runs/es-demo --n 32 --k 1,16,32   # the run's problems, more samples: pass@32",
        formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", "-m", default=None,
                   help=f"model spec (embedded name, model dir, .gguf, hub id) or an evolm run directory, whose final/ "
                        f"weights are used (default: {DEFAULT_MODEL}, or with --like the run's final/)")
    p.add_argument("--like", metavar="RUN_DIR",
                   help="evaluate exactly as the run RUN_DIR measured its eval_after.json: its held-out task and params, "
                        "its eval.count problems with the seed derived from run.seed, eval.n_samples, eval.k, temperature, "
                        "top-p, completion length, sampling-seed derivation, generation backend, batch size and prefix "
                        "cache, no generation cache; reproduces the run's summary exactly on its final/ weights "
                        "(--model picks other weights, e.g. the base to reproduce eval_before.json; --n and --k draw more "
                        "samples on the same problems, for a larger k than the run measured)")
    p.add_argument("--tasks", "-t", default=None, help="comma-separated task names (default: csqa,arc_easy)")
    p.add_argument("--n", type=int, default=None, help="samples per problem (default: 32, or with --like the run's eval.n_samples)")
    p.add_argument("--k", default=None, help="comma-separated k values for pass@k and maj@k, each <= n (default: 1,16,32, or with --like the run's "
                        "eval.k up to --n)")
    p.add_argument("--temperature", "-T", type=float, default=None, help="sampling temperature (default: 1.0)")
    p.add_argument("--top-p", type=float, default=None, help="nucleus sampling mass (default: 1.0)")
    p.add_argument("--max-new-tokens", type=int, default=None, help="completion length limit (default 0: each task's own default)")
    p.add_argument("--limit", "-l", type=int, default=None, help="problems per task: a seeded subset (default: the whole split)")
    p.add_argument("--split", default=None, help="split to evaluate (default: test, which is validation for csqa and sst2)")
    p.add_argument("--seed", type=int, default=None, help="seed of the problem subset and of sampling (default: 0)")
    p.add_argument("--task-param", action="append", default=[], metavar="TASK.KEY=VALUE",
                   help="a task parameter, e.g. gpqa.path=~/gpqa_diamond.csv, hotpotqa.context=none, countdown.path=countdown.json "
                        "or countdown.reward=qiu_exact (the checker of a reward convention; docs/rewards.md) (repeatable)")
    p.add_argument("--no-greedy", action="store_true", help="skip the greedy (temperature 0) accuracy pass")
    p.add_argument("--out", "-o", default=None,
                   help="output directory, which must not hold an eval.json yet (default: a new RUN_DIR/eval/<time>-<tasks>/ "
                        "for a run directory, else runs/eval-<model>-<time>/)")
    p.add_argument("--cache-dir", default=None, help="generation cache directory (default: $EVOLM_CACHE/generations)")
    p.add_argument("--no-cache", action="store_true", help="neither read nor write the generation cache")
    p.add_argument("--batch-size", type=int, default=None, help="sequences per generate() batch (default: 32)")
    p.add_argument("--dtype", default=None, choices=["float32", "bfloat16", "float16"],
                   help="model dtype (default: float32, or with --like the run's model.dtype)")
    p.add_argument("--device", default=None, help="torch device (default: cpu, or with --like the run's model.device)")
    p.add_argument("--threads", type=int, default=None, help="torch CPU threads (default: 1, or with --like the run's)")
    p.add_argument("--no-progress", action="store_true", help="no progress bars")
    p.set_defaults(func=run)
