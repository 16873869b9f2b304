"""What the LoRA population learns (issue 42, item 4): held-out pass@k before and after 30 updates of the
four low-rank and full-rank runs at the same config, seed and minibatches (experiments/lora_population.sh).

    python experiments/lora_population_compare.py runs/lora-population            # prints the table
    python experiments/lora_population_compare.py docs/lora-population --json docs/lora-population/comparison.json

Runs compared (all SmolLM2-135M float32, 2-digit addition, N = 8, sigma 1e-3, lr 5e-4, 16 prompts per update,
30 updates; held-out 64 problems x 16 samples on the HF backend):
- ``vllm-lora``: low-rank members as vLLM LoRA adapters, es.params = attention + mlp (DIR/vllm-lora);
- ``hf-lowrank``: the same members on the HF backend, same es.params (DIR/hf-lowrank);
- ``lowrank-30``: HF low-rank over every parameter (docs/lowrank-experiment/lowrank-30);
- ``full-at-30``: full-rank ES at its update 30 (docs/lowrank-experiment/full-at-30/eval.json).

Differences are paired over the 64 problems (per-problem unbiased pass@k, percentile bootstrap of the mean
difference, ``report.study.stats.bootstrap_interval``). The two LoRA-vs-HF runs draw the same members; where
their greedy completions agree their fitnesses, and so their updates, are identical: the table counts the
updates whose fitness vectors are equal.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))

from evolm.metrics import pass_at_k_problem  # noqa: E402
from evolm.report.study.stats import bootstrap_interval  # noqa: E402

LOWRANK = ROOT / "docs" / "lowrank-experiment"
KS = (1, 16)


def _problems(record: dict) -> dict:
    return {p["id"]: p for p in record["problems"]}


def _eval(path: Path) -> dict:
    data = json.loads(path.read_text())
    return data["tasks"]["arithmetic"] if "tasks" in data else data


def _train(run: Path) -> list[dict]:
    return [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines() if '"kind": "train"' in x]


def _row(name: str, after: dict, train: list[dict] | None) -> dict:
    s = after["summary"]
    row = {"run": name, "pass@1": s["pass@1"], "pass@16": s["pass@16"], "entropy": s.get("entropy"), "greedy": s["greedy"]}
    if train:
        first, last = train[:10], train[-10:]
        row.update(updates=len(train), reward_first10=sum(r["reward_mean"] for r in first) / len(first),
                   reward_last10=sum(r["reward_mean"] for r in last) / len(last),
                   no_signal=sum(r["update_status"] != "applied" for r in train),
                   seconds_per_update=sum(r["seconds"] for r in train) / len(train))
    return row


def _paired(a: dict, b: dict, k: int) -> tuple[float, float, float]:
    pa, pb = _problems(a), _problems(b)
    ids = sorted(set(pa) & set(pb))
    if len(ids) != len(pa):
        raise SystemExit("the runs were evaluated on different problems")
    return bootstrap_interval([pass_at_k_problem(pa[i]["n"], pa[i]["c"], k) - pass_at_k_problem(pb[i]["n"], pb[i]["c"], k)
                               for i in ids])


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("dir", type=Path, help="where vllm-lora/ and hf-lowrank/ are (runs/lora-population or the published copy)")
    ap.add_argument("--json", type=Path, help="also write the figures here")
    args = ap.parse_args(argv)
    runs = {"vllm-lora": args.dir / "vllm-lora", "hf-lowrank": args.dir / "hf-lowrank", "lowrank-30": LOWRANK / "lowrank-30"}
    for name, run in runs.items():
        if not (run / "eval_after.json").exists():
            print(f"{run} has no eval_after.json (not finished): run `bash experiments/lora_population.sh` first", file=sys.stderr)
            return 2
    before = _eval(runs["hf-lowrank"] / "eval_before.json")
    afters = {name: _eval(run / "eval_after.json") for name, run in runs.items()}
    afters["full-at-30"] = _eval(LOWRANK / "full-at-30" / "eval.json")
    trains = {name: _train(run) for name, run in runs.items()}
    rows = [_row("base", before, None)] + [_row(n, afters[n], trains.get(n)) for n in afters]
    pairs = {}
    for a, b in (("vllm-lora", "hf-lowrank"), ("vllm-lora", "lowrank-30"), ("vllm-lora", "full-at-30"),
                 ("hf-lowrank", "lowrank-30"), ("vllm-lora", "base")):
        other = before if b == "base" else afters[b]
        pairs[f"{a} - {b}"] = {f"pass@{k}": _paired(afters[a], other, k) for k in KS}
    lora, hf = trains["vllm-lora"], trains["hf-lowrank"]
    same_fitness = sum(x["fitness"] == y["fitness"] for x, y in zip(lora, hf))
    out = {"rows": rows, "paired": pairs, "same_fitness_updates": same_fitness, "updates": min(len(lora), len(hf))}

    cols = ("pass@1", "pass@16", "entropy", "greedy", "reward_first10", "reward_last10", "no_signal", "seconds_per_update")
    print("| run | " + " | ".join(cols) + " |")
    print("|---|" + "---|" * len(cols))
    for r in rows:
        cells = [("–" if r.get(c) is None else f"{r[c]:.3f}" if isinstance(r[c], float) else str(r[c])) for c in cols]
        print(f"| {r['run']} | " + " | ".join(cells) + " |")
    print()
    for name, d in pairs.items():
        print(f"{name}: " + ", ".join(f"{k} {m:+.3f} [{lo:+.3f}, {hi:+.3f}]" for k, (m, lo, hi) in d.items()))
    print(f"updates whose 8 fitnesses are equal between vllm-lora and hf-lowrank: {same_fitness} of {out['updates']}")
    if args.json:
        args.json.write_text(json.dumps(out, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
