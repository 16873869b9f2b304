"""Baselines of the embedded models on the training and held-out tasks: runs `evolm eval`, writes the table.

    python experiments/baselines.py run [--models smollm2-135m,gemma3-270m] [--only LABEL,...]
    python experiments/baselines.py load-time          # seconds to load each model from its cache
    python experiments/baselines.py cost [--only LABEL,...]   # ES / GRPO seconds per update (2 updates)
    python experiments/baselines.py table [--write]    # the tables of docs/results.md (--write: replace them there)

`run` calls `evolm eval` once per (model, task setting) with the settings in ``SETTINGS`` and writes
``docs/baselines/<model>/<label>/eval.json`` (+ eval.md; the pass@k plot is removed to keep the
repository small). Generations are cached per model fingerprint, so a killed run resumes where it
stopped. `table` reads only those files (and ``load_time.json``), so the table in docs/results.md is
regenerated from what is committed.

Budget: on the shared 2-core machine (load average 9-14 while these ran: eight jobs on two cores,
~10-20% of a core per process) a Gemma-3-270M eval generated 1-2 tokens/s: one decode step at batch 64
costs ~1.5 CPU-seconds, of which the 262k-vocabulary LM head is 0.45, sampling from the 262k
softmax 0.45 and the entropy 0.15. n = 32 on 64 problems (~34k tokens per task) was far out of reach
of the ~3 hours allowed for the whole set, so every task is measured on 32 problems with a greedy pass
and n = 8 samples at T = 1 (pass@1/4/8); GSM8K (160 tokens per completion) greedy plus one sample.
1-digit addition has only 23 test problems: its 32 draws repeat 9, and the table counts each distinct
problem once.

Base-model prompts use the tasks' Base-model prompts use the tasks'
own defaults (procedural tasks: one worked demonstration; dataset tasks: ``shots`` demonstrations on
plain-text prompts, see evolm.tasks.fewshot).
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
OUT = ROOT / "docs" / "baselines"
MODELS = ["smollm2-135m", "gemma3-270m"]

MC_TOKENS = {"smollm2-135m": 32, "gemma3-270m": 8}
"""Multiple choice: the task's default 32 for the chat model (it may write "The answer is B." and stops
at its end-of-sequence token); 8 for the base model, which answers "Answer: C" (4 tokens) and never stops."""

# label -> (task, task params, problems, n, ks, max new tokens (or per model), what it is)
SETTINGS: dict[str, tuple[str, dict, int, int, list[int], int | dict, str]] = {
    "arithmetic-1digit": ("arithmetic", {"digits": 1}, 32, 8, [1, 4, 8], 16, "train task: 1-digit addition"),
    "arithmetic-2digit": ("arithmetic", {"digits": 2}, 32, 8, [1, 4, 8], 16, "train task: 2-digit addition"),
    "countdown": ("countdown", {}, 32, 8, [1, 4, 8], 24, "train task: Countdown, 2-3 numbers <= 10, target <= 50"),
    "csqa": ("csqa", {}, 32, 8, [1, 4, 8], MC_TOKENS, "held out: CommonsenseQA (5 choices)"),
    "arc_easy": ("arc_easy", {}, 32, 8, [1, 4, 8], MC_TOKENS, "held out: ARC-Easy (4 choices)"),
    "sst2": ("sst2", {}, 32, 8, [1, 4, 8], MC_TOKENS, "held out: SST-2 (2 choices)"),
    "gsm8k": ("gsm8k", {}, 32, 1, [1], 160, "held out: GSM8K"),
}


def _evolm() -> list[str]:
    exe = Path(sys.executable).with_name("evolm")
    return [str(exe)] if exe.exists() else [sys.executable, "-m", "evolm"]


def run(models: list[str], only: list[str] | None) -> None:
    for model in models:
        for label, (task, params, limit, n, ks, max_tokens, _) in SETTINGS.items():
            if only and label not in only:
                continue
            max_tokens = max_tokens[model] if isinstance(max_tokens, dict) else max_tokens
            out = OUT / model / label
            if (out / "eval.json").exists():
                print(f"[baselines] {model} {label}: done already ({out / 'eval.json'})", flush=True)
                continue
            cmd = _evolm() + ["eval", "--model", model, "--tasks", task, "--limit", str(limit), "--n", str(n),
                              "--k", ",".join(map(str, ks)), "--max-new-tokens", str(max_tokens), "--batch-size", "64",
                              "--threads", "1", "--no-progress", "--out", str(out)]
            for key, value in params.items():
                cmd += ["--task-param", f"{task}.{key}={json.dumps(value)}"]
            print(f"[baselines] {model} {label}: {' '.join(cmd[1:])}", flush=True)
            t0 = time.time()
            subprocess.run(cmd, check=True)
            seconds = time.time() - t0
            (out / "passk.png").unlink(missing_ok=True)
            report = json.loads((out / "eval.json").read_text())
            report["wall_seconds"] = round(seconds, 1)
            tmp = out / "eval.json.tmp"
            tmp.write_text(json.dumps(report, indent=1))
            tmp.replace(out / "eval.json")
            print(f"[baselines] {model} {label}: {seconds:.0f} s", flush=True)


def load_time(models: list[str]) -> None:
    """Seconds to load each model from its safetensors cache (a fresh process each, three times: the median)."""
    out = OUT / "load_time.json"
    data = json.loads(out.read_text()) if out.exists() else {}
    code = ("import time, torch; torch.set_num_threads(1); from evolm import models; t = time.perf_counter(); "
            "m, _ = models.load('{spec}', threads=1); print(time.perf_counter() - t, sum(p.numel() for p in m.parameters()))")
    for model in models:
        runs = []
        for _ in range(3):
            res = subprocess.run([sys.executable, "-c", code.format(spec=model)], check=True, capture_output=True, text=True)
            seconds, params = res.stdout.split()[-2:]
            runs.append(float(seconds))
        data[model] = {"load_seconds_from_cache": round(sorted(runs)[1], 1), "runs": [round(r, 1) for r in runs],
                       "parameters": int(params)}
        print(model, data[model], flush=True)
    OUT.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(data, indent=1) + "\n")


# label -> (verb, config): two updates each, no before/after evaluation or probe (their cost is not an update's).
# On a loaded machine the wall time per update mostly measures the load; the CPU seconds of the whole
# run (model load + 2 updates, one thread) are the load-independent figure.
COST_RUNS = {
    "es-smollm2-135m": ("es", "configs/es-arithmetic.toml"),
    "es-gemma3-270m": ("es", "configs/es-arithmetic-gemma.toml"),
    "grpo-gemma3-270m": ("grpo", "configs/grpo-arithmetic-gemma.toml"),
    "grpo-smollm2-135m": ("grpo", "configs/grpo-arithmetic.toml"),
}
COST_FIELDS = ("seconds", "seconds_generate", "seconds_perturb", "seconds_restore", "seconds_update", "gen_sequences",
               "gen_tokens", "peak_rss_mb", "reward_mean")


def cost(only: list[str] | None) -> None:
    """Run each COST_RUNS config for 2 updates and keep its per-update records in docs/baselines/cost/."""
    import os

    for label, (verb, config) in COST_RUNS.items():
        if only and label not in only:
            continue
        out = OUT / "cost" / f"{label}.json"
        if out.exists():
            print(f"[baselines] {label}: done already ({out})", flush=True)
            continue
        run_dir = ROOT / "runs" / f"cost-{label}"
        if run_dir.exists():
            import shutil

            shutil.rmtree(run_dir)
        overrides = ["run.out_dir='runs'", f"run.name='cost-{label}'", "run.progress=false", "run.checkpoint_every=0",
                     "eval.before_after=false", "probe.every=0", f"{verb}.{'iterations' if verb == 'es' else 'steps'}=2"]
        cmd = _evolm() + [verb, "--config", config] + [x for o in overrides for x in ("--set", o)]
        print(f"[baselines] {label}: {' '.join(cmd[1:])}", flush=True)
        import resource

        load_before = os.getloadavg()
        cpu0 = resource.getrusage(resource.RUSAGE_CHILDREN)
        t0 = time.time()
        subprocess.run(cmd, check=True, cwd=ROOT)
        wall = time.time() - t0
        cpu1 = resource.getrusage(resource.RUSAGE_CHILDREN)
        cpu = (cpu1.ru_utime - cpu0.ru_utime) + (cpu1.ru_stime - cpu0.ru_stime)
        records = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines() if line.strip()]
        train = [{k: r[k] for k in COST_FIELDS if k in r} | {"step": r["step"]} for r in records if r.get("kind") == "train"]
        result = {"label": label, "command": " ".join(["evolm"] + cmd[1:]), "config": config, "updates": train,
                  "seconds_per_update": round(sum(r["seconds"] for r in train) / len(train), 1),
                  "peak_rss_mb": max(r.get("peak_rss_mb", 0) for r in train), "wall_seconds_whole_run": round(wall, 1),
                  "cpu_seconds_whole_run": round(cpu, 1),
                  "load_average_1min_before_after": [round(load_before[0], 1), round(os.getloadavg()[0], 1)],
                  "created": time.strftime("%Y-%m-%dT%H:%M:%S")}
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(json.dumps(result, indent=1) + "\n")
        print(f"[baselines] {label}: {result['seconds_per_update']} s per update, peak RSS {result['peak_rss_mb']:.0f} MB", flush=True)


def _fmt(x, digits=3):
    return "–" if x is None else f"{x:.{digits}f}"


def distinct_summary(task_report: dict) -> dict:
    """The task's summary recomputed over distinct problems (a repeated draw counted once)."""
    from dataclasses import fields

    from evolm.evaluate import ProblemResult, summarize

    names = {f.name for f in fields(ProblemResult)}
    seen: dict[str, ProblemResult] = {}
    for row in task_report["problems"]:
        seen.setdefault(row["id"], ProblemResult(**{k: v for k, v in row.items() if k in names}))
    return summarize(list(seen.values()), task_report["ks"])


def table() -> str:
    """The baseline table (Markdown) from docs/baselines/*/*/eval.json."""
    lines = ["| model | task | problems × n | max tokens | greedy | pass@1 | pass@4 | pass@8 | chance pass@1 / @8 | "
             "entropy (nats) | format | tokens | wall time |",
             "|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for model in MODELS:
        for label, (task, _, _, _, _, max_tokens, _) in SETTINGS.items():
            max_tokens = max_tokens[model] if isinstance(max_tokens, dict) else max_tokens
            path = OUT / model / label / "eval.json"
            if not path.exists():
                continue
            report = json.loads(path.read_text())
            s = distinct_summary(report["tasks"][task])
            chance = "–" if s.get("chance_pass@1") is None else \
                f"{s['chance_pass@1']:.2f} / {s['chance_pass@8']:.2f}" if "chance_pass@8" in s else f"{s['chance_pass@1']:.2f}"
            wall = report.get("wall_seconds")
            lines.append(f"| {model} | {label} | {s['problems']} × {report['settings']['n']} | {max_tokens} | "
                         f"{_fmt(s.get('greedy'))} | {_fmt(s.get('pass@1'))} | {_fmt(s.get('pass@4'))} | "
                         f"{_fmt(s.get('pass@8'))} | {chance} | {_fmt(s.get('entropy'))} | "
                         f"{_fmt(s.get('format_rate'), 2)} | {_fmt(s.get('mean_tokens'), 1)} | "
                         f"{'–' if wall is None else f'{wall / 60:.0f} min'} |")
    return "\n".join(lines)


def cost_table() -> str:
    """Load time and cost per update (Markdown) from docs/baselines/load_time.json and docs/baselines/cost/*.json."""
    lines = ["| run | seconds per update (wall) | of which generation | CPU seconds, whole run | peak RSS | "
             "sequences × tokens per update | load average (1 min) |", "|---|---|---|---|---|---|---|"]
    for label in COST_RUNS:
        path = OUT / "cost" / f"{label}.json"
        if not path.exists():
            continue
        c = json.loads(path.read_text())
        ups = c["updates"]
        gen = [u.get("seconds_generate") for u in ups if u.get("seconds_generate") is not None]
        share = f"{sum(gen) / sum(u['seconds'] for u in ups):.0%}" if gen else "–"
        cpu = c.get("cpu_seconds_whole_run")
        lines.append(f"| {label} | {' / '.join(str(round(u['seconds'])) for u in ups)} | {share} | "
                     f"{'–' if cpu is None else round(cpu)} | {c['peak_rss_mb'] / 1024:.1f} GB | "
                     f"{ups[0].get('gen_sequences', '–')} × {ups[0].get('gen_tokens', 0) / max(1, ups[0].get('gen_sequences', 1)):.1f} | "
                     f"{c['load_average_1min_before_after'][0]} → {c['load_average_1min_before_after'][1]} |")
    path = OUT / "load_time.json"
    if path.exists():
        lines += ["", "| model | parameters | load from the safetensors cache (median of 3) |", "|---|---|---|"]
        for model, d in json.loads(path.read_text()).items():
            lines.append(f"| {model} | {d['parameters']:,} | {d['load_seconds_from_cache']} s |")
    return "\n".join(lines)


BEGIN, END = "<!-- baselines table: experiments/baselines.py table --write -->", "<!-- end of baselines table -->"


def write_results(text: str) -> None:
    """Replace the generated block of docs/results.md (between BEGIN and END)."""
    path = ROOT / "docs" / "results.md"
    doc = path.read_text()
    if BEGIN not in doc or END not in doc:
        raise SystemExit(f"{path} has no generated block ({BEGIN} ... {END})")
    head, rest = doc.split(BEGIN, 1)
    tail = rest.split(END, 1)[1]
    path.write_text(f"{head}{BEGIN}\n{text}\n{END}{tail}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    r = sub.add_parser("run")
    r.add_argument("--models", default=",".join(MODELS))
    r.add_argument("--only", default="", help="comma-separated labels")
    lt = sub.add_parser("load-time")
    lt.add_argument("--models", default=",".join(MODELS))
    c = sub.add_parser("cost")
    c.add_argument("--only", default="", help="comma-separated labels of COST_RUNS")
    t = sub.add_parser("table")
    t.add_argument("--write", action="store_true", help="replace the tables between the markers in docs/results.md")
    args = ap.parse_args()
    if args.cmd == "run":
        run(args.models.split(","), [x for x in args.only.split(",") if x] or None)
    elif args.cmd == "cost":
        cost([x for x in args.only.split(",") if x] or None)
    elif args.cmd == "load-time":
        load_time(args.models.split(","))
    else:
        text = table() + "\n\n" + cost_table()
        if args.write:
            write_results(text)
        print(text)


if __name__ == "__main__":
    main()
