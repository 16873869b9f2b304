"""Peak memory of ES versus GRPO on the default model, measured in one run (target: ES <= 1/3 of GRPO).

Each method runs in a fresh subprocess through the `evolm` command line, so the peak resident set
(`peak_rss_mb`, the process's ru_maxrss, which every training record carries) belongs to that method
alone and includes the same model load and imports for both. The figure used is the largest
`peak_rss_mb` over the training records, i.e. during the updates, before the final weights are saved.

Both sides train the same model (SmolLM2-135M-Instruct, float32, CPU, one thread) on the same task
(2-digit addition, same train split) with the settings of `configs/grpo-arithmetic.toml` and
`configs/es-arithmetic.toml` (the demo's ES: N = 8 members x 32 prompts x <= 16 greedy tokens per
update; GRPO: 4 problems x 8 samples x <= 32 tokens and one AdamW step). `--prompts 1` measures
GRPO's smallest useful batch; `--es-batch 8` makes ES generate 8 sequences per call. Held-out evaluation, probes and
checkpoints are off on both sides. The result is printed and, with --out, written as JSON for
docs/benchmarks.md.

    python benchmarks/memory_es_vs_grpo.py                  # 2 updates each
    python benchmarks/memory_es_vs_grpo.py --prompts 1 --es-batch 8 --out mem.json
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def _run_cli(verb: str, config: Path, overrides: list[str], timeout_s: float) -> list[dict]:
    """Run ``evolm VERB --config CONFIG --set ...`` in a fresh process; return its metrics records."""
    sys.path.insert(0, str(ROOT / "src"))
    from evolm.runs import read_jsonl

    with tempfile.TemporaryDirectory(prefix=f"evolm-mem-{verb}-") as tmp:
        cmd = [sys.executable, "-m", "evolm", verb, "--config", str(config),
               "--set", f"run.out_dir='{tmp}'", "--set", f"run.name='{verb}-memory'",
               "--set", "run.checkpoint_every=0", "--set", "run.progress=false"]
        for o in overrides:
            cmd += ["--set", o]
        env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT / "src"), os.environ.get("PYTHONPATH", "")])}
        done = subprocess.run(cmd, env=env, cwd=ROOT, timeout=timeout_s, capture_output=True, text=True)
        if done.returncode != 0:
            raise RuntimeError(f"`{' '.join(cmd[2:])}` failed ({done.returncode}):\n{done.stderr[-3000:]}")
        return read_jsonl(Path(tmp) / f"{verb}-memory" / "metrics.jsonl")


def _summary(method: str, records: list[dict], settings: dict) -> dict:
    train = [r for r in records if r.get("kind", "train") == "train" and "peak_rss_mb" in r]
    if not train:
        raise RuntimeError(f"{method}: no training records with peak_rss_mb")
    return {
        "method": method,
        "peak_rss_mb": max(r["peak_rss_mb"] for r in train),
        "updates": len(train),
        "seconds_per_update": statistics.mean(r["seconds"] for r in train),
        "gen_sequences_per_update": statistics.mean(r["gen_sequences"] for r in train),
        "gen_tokens_per_update": statistics.mean(r["gen_tokens"] for r in train),
        "settings": settings,
    }


NO_HELDOUT = ("probe.every=0", "eval.before_after=false")
"""Held-out measurements are off on both sides: only training is measured."""


def measure_grpo(updates: int = 2, prompts_per_step: int = 4, num_generations: int = 8,
                 max_completion_length: int = 32, config: Path = ROOT / "configs" / "grpo-arithmetic.toml",
                 overrides: list[str] | tuple[str, ...] = (), timeout_s: float = 3600) -> dict:
    """Peak RSS (MiB) and per-update cost of ``updates`` GRPO updates on ``config``'s model and task.

    One update samples ``prompts_per_step x num_generations`` completions of at most
    ``max_completion_length`` tokens and takes one AdamW step (weights + gradients + two moments).
    """
    settings = {"updates": updates, "prompts_per_step": prompts_per_step, "num_generations": num_generations,
                "max_completion_length": max_completion_length, "config": str(config), "overrides": list(overrides)}
    records = _run_cli("grpo", config, [
        f"grpo.steps={updates}", f"grpo.prompts_per_step={prompts_per_step}", f"grpo.num_generations={num_generations}",
        f"grpo.max_completion_length={max_completion_length}", *NO_HELDOUT, *overrides], timeout_s)
    return _summary("grpo", records, settings)


def measure_es(updates: int = 2, population: int = 8, prompts: int = 32, max_new_tokens: int = 16,
               batch_size: int = 64, config: Path = ROOT / "configs" / "es-arithmetic.toml", overrides: list[str] | tuple[str, ...] = (),
               timeout_s: float = 3600) -> dict:
    """Peak RSS (MiB) and per-update cost of ``updates`` ES iterations on ``config``'s model and task.

    One update scores ``population`` perturbed copies (perturbed in place, restored exactly) on
    ``prompts`` training problems each and adds the weighted noise to the weights: no gradients, no
    optimizer state; the extra memory is the shared noise table and generation activations.
    """
    settings = {"updates": updates, "population": population, "prompts_per_iteration": prompts,
                "max_new_tokens": max_new_tokens, "batch_size": batch_size, "config": str(config),
                "overrides": list(overrides)}
    records = _run_cli("es", config, [
        f"es.iterations={updates}", f"es.population={population}", f"es.prompts_per_iteration={prompts}",
        f"generation.max_new_tokens={max_new_tokens}", f"generation.batch_size={batch_size}", *NO_HELDOUT,
        *overrides], timeout_s)
    return _summary("es", records, settings)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--updates", type=int, default=2, help="updates per method (default 2)")
    p.add_argument("--prompts", type=int, default=4, help="GRPO prompts per update (default 4, the config's)")
    p.add_argument("--generations", type=int, default=8, help="GRPO completions per prompt (default 8)")
    p.add_argument("--tokens", type=int, default=32, help="completion length limit (default 32)")
    p.add_argument("--grpo-set", action="append", default=[], metavar="KEY=VALUE", help="extra GRPO config override")
    p.add_argument("--population", type=int, default=8, help="ES members per update (default 8)")
    p.add_argument("--es-prompts", type=int, default=32, help="ES prompts per update (default 32)")
    p.add_argument("--es-tokens", type=int, default=16, help="ES completion length limit (default 16)")
    p.add_argument("--es-batch", type=int, default=64,
                   help="ES sequences per generate() call (default 64, the config's; 8 matches GRPO's rollout batch)")
    p.add_argument("--es-set", action="append", default=[], metavar="KEY=VALUE", help="extra ES config override")
    p.add_argument("--out", type=Path, help="write the measurements as JSON here")
    args = p.parse_args(argv)

    results = {"grpo": measure_grpo(args.updates, args.prompts, args.generations, args.tokens, overrides=args.grpo_set),
               "es": measure_es(args.updates, args.population, args.es_prompts, args.es_tokens, args.es_batch,
                                 overrides=args.es_set)}
    results["es_over_grpo"] = results["es"]["peak_rss_mb"] / results["grpo"]["peak_rss_mb"]
    for name in ("grpo", "es"):
        if name in results:
            r = results[name]
            print(f"{name:5s} peak RSS {r['peak_rss_mb']:8.0f} MiB  {r['seconds_per_update']:7.1f} s/update  "
                  f"{r['gen_sequences_per_update']:6.0f} sequences  {r['gen_tokens_per_update']:7.0f} tokens per update")
    if "es_over_grpo" in results:
        print(f"ES / GRPO peak RSS = {results['es_over_grpo']:.2f} (target <= 0.33)")
    if args.out:
        args.out.write_text(json.dumps(results, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
