"""Peak memory of ES versus GRPO on the default model, measured in one run (target: ES <= 1/3 of GRPO).

Each method runs in a fresh subprocess through the `evolm` command line, so the peak resident set
(`peak_rss_mb`, the process's ru_maxrss, which every training record carries) belongs to that method
alone and includes the same model load and imports for both. The figure used is the largest
`peak_rss_mb` over the training records, i.e. during the updates, before the final weights are saved.
Both sides should train on the same task and prompts for a few updates; the result is printed
and, with --out, written as JSON for docs/benchmarks.md.

    python benchmarks/memory_es_vs_grpo.py --updates 3
    python benchmarks/memory_es_vs_grpo.py --grpo-set grpo.prompts_per_step=2 --out mem.json

The GRPO side is `measure_grpo`; the ES side (`measure_es`) is filled in with the ES engine.
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


def measure_grpo(updates: int = 3, prompts_per_step: int = 1, num_generations: int = 8,
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
        f"grpo.max_completion_length={max_completion_length}", "grpo.probe_every=0", *overrides], timeout_s)
    return _summary("grpo", records, settings)


def measure_es(updates: int = 3, **settings) -> dict:
    """Peak RSS (MiB) and per-update cost of ``updates`` ES iterations (same task and prompts as GRPO)."""
    raise NotImplementedError("the ES side of this benchmark is not written yet: run `evolm es` for the same "
                              "number of updates through _run_cli('es', ...) and summarise with _summary('es', ...)")


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--updates", type=int, default=3,
                   help="updates per method (default 3: GRPO's peak settles by the 2nd-3rd update)")
    p.add_argument("--prompts", type=int, default=1, help="GRPO prompts per update (default 1)")
    p.add_argument("--generations", type=int, default=8, help="GRPO completions per prompt (default 8)")
    p.add_argument("--tokens", type=int, default=32, help="completion length limit (default 32)")
    p.add_argument("--grpo-set", action="append", default=[], metavar="KEY=VALUE", help="extra GRPO config override")
    p.add_argument("--out", type=Path, help="write the measurements as JSON here")
    args = p.parse_args(argv)

    results = {"grpo": measure_grpo(args.updates, args.prompts, args.generations, args.tokens, overrides=args.grpo_set)}
    try:
        results["es"] = measure_es(args.updates)
    except NotImplementedError as e:
        print(f"ES side skipped: {e}", file=sys.stderr)
    if "es" in results:
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
