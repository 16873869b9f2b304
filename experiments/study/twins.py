"""Commutative twins: which held-out arithmetic problems of the study had their mirror image in training.

    python experiments/study/twins.py docs/study docs/study/analyses/twins/twins.json

The arithmetic task's split (``split_version = 1``, what every committed study run used) hashes a problem's
expression text, so ``47+85`` and ``85+47`` are two problems that may fall in different splits: a held-out
``47+85`` may have its twin ``85+47`` among the training problems. This script rebuilds, from each committed
run directory's ``config.toml`` and ``metrics.jsonl`` (no weights, no model), the training problems the run
actually drew, exactly as the engines draw them:

- ES: update ``i`` (0-based) trains on ``task.examples("train", es.prompts_per_iteration,
  seed31(run.seed, "prompts", i))`` (``evolm.es.engine.training_batch``), for as many updates as the run
  logged (a continued run logged its earlier updates too);
- GRPO: the first ``steps done x grpo.prompts_per_step`` rows of ``task.examples("train", train_count,
  run.seed)`` (``evolm.grpo.training_examples``: TRL's shuffling is off, the rows are used in order, and a
  prefix of a draw does not depend on its length);
- a pipeline: the union of its stages' (``stages/*/``, each with its own seed).

and writes, per run, its held-out problem ids, those whose twin lies anywhere in the train split, and those
whose twin the run drew in training (``twins_drawn``). ``evolm report --study`` reads the file and shows, per
run, how many there are and the paired change of pass@1 / pass@16 on the twin-free problems beside the
change on all of them. A twin is the same problem with its operands in another order: for ``terms = 2`` and
``operators = "+"`` (every committed arithmetic run) ``b+a`` for ``a+b`` (``a != b``); in general the same
canonical form (``evolm.tasks.arithmetic.canonical_key``).
"""

from __future__ import annotations

import json
import sys
import tomllib
from pathlib import Path

from evolm.seeding import seed31
from evolm.tasks import make_task
from evolm.tasks.arithmetic import canonical_key
from evolm.tasks.procedural import split_of


def _records(d: Path) -> list[dict]:
    path = d / "metrics.jsonl"
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()] if path.exists() else []


def _task(cfg: dict):
    t = cfg["task"]
    return make_task(t["name"], t.get("reward", "format_answer"), **(t.get("params") or {}))


def drawn_keys(d: Path) -> list[str]:
    """The expression keys of every training problem run directory ``d`` drew, in order (repeats kept)."""
    cfg = tomllib.loads((d / "config.toml").read_text())
    kind = json.loads((d / "run.json").read_text()).get("kind")
    if kind == "pipeline":
        return [k for stage in sorted((d / "stages").iterdir()) if (stage / "config.toml").exists()
                for k in drawn_keys(stage)]
    task, seed = _task(cfg), int(cfg["run"]["seed"])
    updates = sum(r.get("kind") == "train" for r in _records(d))
    if kind == "es":
        count = int(cfg["es"]["prompts_per_iteration"])
        return [e.id.split(":", 1)[1] for i in range(updates)
                for e in task.examples("train", count, seed=seed31(seed, "prompts", i))]
    if kind == "grpo":
        per_step = int(cfg["grpo"]["prompts_per_step"])
        return [e.id.split(":", 1)[1] for e in task.examples("train", updates * per_step, seed)]
    raise ValueError(f"{d}: unknown run kind {kind!r}")


def twins_of(d: Path) -> dict | None:
    """The record of one arithmetic run directory (None for another task or a run without held-out results)."""
    cfg = tomllib.loads((d / "config.toml").read_text())
    if cfg.get("task", {}).get("name") != "arithmetic" or not (d / "eval_after.json").exists():
        return None
    params = cfg["task"].get("params") or {}
    drawn = drawn_keys(d)
    drawn_forms = {canonical_key(k) for k in drawn}
    heldout = list(dict.fromkeys(str(p["id"]) for p in json.loads((d / "eval_after.json").read_text())["problems"]))
    in_split, in_draws = [], []
    for pid in heldout:
        key = pid.split(":", 1)[1]
        form = canonical_key(key)
        others = [k for k in _orderings(key) if k != key]
        if any(split_of("arithmetic", k) == "train" for k in others):
            in_split.append(pid)
        if form in drawn_forms:
            in_draws.append(pid)
    return {"task": params, "train_draws": len(drawn), "distinct_train_problems": len(set(drawn)),
            "heldout": heldout, "twins_in_train_split": in_split, "twins_drawn": in_draws}


def _orderings(key: str) -> list[str]:
    """Every expression key with the same canonical form as ``key`` (for a two-operand sum or product: both
    operand orders; otherwise the key itself and, where they exist, its operand orderings over a commutative
    operator; enough for the committed runs, which are all two-operand sums)."""
    for op in "+*":
        parts = key.split(op)
        if len(parts) == 2 and all(p.isdigit() for p in parts):
            return [key, f"{parts[1]}{op}{parts[0]}"]
    return [key]


def main(argv: list[str]) -> int:
    data, out = Path(argv[0]), Path(argv[1])
    runs = {}
    for config in sorted(data.glob("**/config.toml")):
        d = config.parent
        if "stages" in d.parts or not (d / "run.json").exists():
            continue
        record = twins_of(d)
        if record is not None:
            runs[str(d.relative_to(data))] = record
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps({"kind": "twins", "split_version": 1,
                               "rule": "a held-out problem's twin: the same canonical form (operands of + or * "
                                       "reordered) under another expression key",
                               "runs": runs}, indent=1) + "\n")
    for name, r in runs.items():
        print(f"{name}: {len(r['heldout'])} held-out, {len(r['twins_in_train_split'])} with a twin in the train split, "
              f"{len(r['twins_drawn'])} with a twin drawn in training ({r['train_draws']} draws, "
              f"{r['distinct_train_problems']} distinct)")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
