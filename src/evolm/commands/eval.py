"""``evolm eval``: pass@k, maj@k, greedy accuracy and token entropy of a model on held-out tasks
(``evolm.evaluate.evaluate_model``)."""

from __future__ import annotations

from pathlib import Path

from evolm.config import parse_value
from evolm.errors import UserError
from evolm.evaluate import default_out_dir, evaluate_model, markdown_table
from evolm.models import DEFAULT_MODEL


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


def run(args) -> int:
    tasks = [t.strip() for t in args.tasks.split(",") if t.strip()]
    if not tasks:
        raise UserError("--tasks needs at least one task name, e.g. --tasks csqa,arc_easy")
    out_dir = Path(args.out) if args.out else default_out_dir(args.model)
    report = evaluate_model(args.model, tasks, n=args.n, ks=_parse_ks(args.k), temperature=args.temperature, top_p=args.top_p,
                            max_new_tokens=args.max_new_tokens, limit=args.limit, split=args.split, seed=args.seed,
                            greedy=not args.no_greedy, task_params=_parse_task_params(args.task_param), out_dir=out_dir,
                            cache_dir=args.cache_dir, use_cache=not args.no_cache, batch_size=args.batch_size,
                            dtype=args.dtype, device=args.device, threads=args.threads, progress=not args.no_progress)
    print(markdown_table(report))
    print(f"wrote {out_dir / 'eval.json'}, {out_dir / 'eval.md'} and {out_dir / 'passk.png'}")
    return 0


def register(sub) -> None:
    p = sub.add_parser(
        "eval", help="pass@k, maj@k, greedy accuracy and token entropy of a model on held-out tasks",
        description="Sample --n completions per problem and report pass@k (unbiased estimator), maj@k (expected "
                    "majority vote over k-subsets), greedy accuracy, token-weighted entropy and distinct correct answers. "
                    "Writes eval.json, eval.md and passk.png. Generations are cached per model fingerprint, so an "
                    "interrupted eval resumes and a base model's samples are reused. Tasks: csqa, arc_easy, arc_challenge, "
                    "sst2, gsm8k, math500 (bundled), hotpotqa and gpqa (your files: --task-param gpqa.path=FILE), and any "
                    "other registered task.")
    p.add_argument("--model", "-m", default=DEFAULT_MODEL,
                   help=f"model spec (embedded name, model dir, .gguf, hub id) or an evolm run directory, whose final/ "
                        f"weights are used (default: {DEFAULT_MODEL})")
    p.add_argument("--tasks", "-t", default="csqa,arc_easy", help="comma-separated task names (default: csqa,arc_easy)")
    p.add_argument("--n", type=int, default=32, help="samples per problem (default: 32)")
    p.add_argument("--k", default="1,16,32", help="comma-separated k values for pass@k and maj@k, each <= n (default: 1,16,32)")
    p.add_argument("--temperature", "-T", type=float, default=1.0, help="sampling temperature (default: 1.0)")
    p.add_argument("--top-p", type=float, default=1.0, help="nucleus sampling mass (default: 1.0)")
    p.add_argument("--max-new-tokens", type=int, default=0, help="completion length limit (default 0: each task's own default)")
    p.add_argument("--limit", "-l", type=int, default=None, help="problems per task: a seeded subset (default: the whole split)")
    p.add_argument("--split", default="test", help="split to evaluate (default: test, which is validation for csqa and sst2)")
    p.add_argument("--seed", type=int, default=0, help="seed of the problem subset and of sampling (default: 0)")
    p.add_argument("--task-param", action="append", default=[], metavar="TASK.KEY=VALUE",
                   help="a task parameter, e.g. gpqa.path=~/gpqa_diamond.csv, hotpotqa.context=none, countdown.path=countdown.json "
                        "or countdown.reward=qiu_exact (the checker of a reward convention; docs/rewards.md) (repeatable)")
    p.add_argument("--no-greedy", action="store_true", help="skip the greedy (temperature 0) accuracy pass")
    p.add_argument("--out", "-o", default=None,
                   help="output directory (default: RUN_DIR/eval for a run directory, else runs/eval-<model>-<time>)")
    p.add_argument("--cache-dir", default=None, help="generation cache directory (default: $EVOLM_CACHE/generations)")
    p.add_argument("--no-cache", action="store_true", help="neither read nor write the generation cache")
    p.add_argument("--batch-size", type=int, default=32, help="sequences per generate() batch (default: 32)")
    p.add_argument("--dtype", default="float32", choices=["float32", "bfloat16", "float16"], help="model dtype (default: float32)")
    p.add_argument("--device", default="cpu", help="torch device (default: cpu)")
    p.add_argument("--threads", type=int, default=1, help="torch CPU threads (default: 1)")
    p.add_argument("--no-progress", action="store_true", help="no progress bars")
    p.set_defaults(func=run)
