"""`evolm demo` with the auto parallelism default against one process on one thread: wall time, same results.

    python benchmarks/demo_parallel.py --json docs/benchmarks/demo_parallel.json     # the full demo, twice (~15 min idle)
    python benchmarks/demo_parallel.py --set es.iterations=1 --set eval.count=4       # a smoke run

Method (one invocation, so both sides see the same machine):
- each phase is a real ``evolm demo`` in a child process (the packaged demo config, ``--set`` overrides
  for both sides), with OMP_NUM_THREADS removed from its environment so that "auto" sees this process's
  cores (``evolm.machine.usable_cores``);
- ``auto``: the demo as shipped (``model.threads``, ``distributed.workers`` = "auto": on a CPU with 2+
  cores and Ray, one Ray actor per core at 1 thread); ``one``: ``--set distributed.workers=0 --set
  model.threads=1``; phases alternate one, auto, one, auto, ... (``--repeats``);
- ``wall_s``: the child's whole wall time (imports, model load, Ray start-up, held-out evaluation before
  and after, the updates, saving); ``seconds_updates``: the sum of the per-update wall times in
  metrics.jsonl; ``speedup`` = one's wall / auto's wall (and the same over the updates alone);
- ``parallelism``: the line the auto phase printed ("[evolm] parallelism: ...");
- the last auto run's final weights, per-member fitnesses and seed log are compared with the last
  one-process run's (``same_weights``, ``same_fitness``, ``same_seed_log``: auto promises bit-identical
  training results when it picks Ray actors at 1 thread), and the held-out tables (``same_eval``: the
  driver of 1-thread actors also runs at 1 thread, so they must match as well);
- the machine's 1-minute load average before and after each phase is recorded: on a shared machine
  the ratio says little (docs/benchmarks.md, Ray scaling); ``--wait-idle MINUTES`` waits for an idle one.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(Path(__file__).resolve().parent))
from ray_scaling import _wait_idle  # noqa: E402  (the same wait for an idle machine)
ONE = ["distributed.workers=0", "model.threads=1"]


def run_phase(kind: str, out_dir: Path, name: str, args) -> dict:
    sets = [f"run.out_dir='{out_dir}'", f"run.name='{name}'", "run.progress=false", *args.set, *(ONE if kind == "one" else [])]
    cmd = [sys.executable, "-m", "evolm", "demo"]
    for s in sets:
        cmd += ["--set", s]
    env = {k: v for k, v in os.environ.items() if k != "OMP_NUM_THREADS"}
    env["PYTHONPATH"] = str(REPO / "src")
    env.setdefault("RAY_memory_monitor_refresh_ms", "0")  # a shared machine's other jobs must not kill an actor
    load_before = os.getloadavg()[0]
    t0 = time.perf_counter()
    out = subprocess.run(cmd, capture_output=True, text=True, env=env)
    wall = time.perf_counter() - t0
    if out.returncode != 0:
        sys.exit(f"phase {name} failed:\n{out.stdout[-2000:]}\n{out.stderr[-3000:]}")
    run = out_dir / name
    records = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines() if line.strip()]
    train = [r for r in records if r.get("kind") == "train"]
    line = next((ln.removeprefix("[evolm] ") for ln in out.stdout.splitlines() if ln.startswith("[evolm] parallelism:")), "")
    return {"name": name, "kind": kind, "parallelism": line, "updates": len(train), "wall_s": round(wall, 1),
            "seconds_updates": round(sum(r["seconds"] for r in train), 2),
            "seconds_per_update": [round(r["seconds"], 2) for r in train],
            "load_1min_before": round(load_before, 2), "load_1min_after": round(os.getloadavg()[0], 2),
            "fitness": [r["fitness"] for r in train],
            "eval": {label: _summary(run / f"eval_{label}.json") for label in ("before", "after")}}


def _summary(path: Path) -> dict | None:
    return json.loads(path.read_text()).get("summary") if path.exists() else None


def _final_state(path: Path) -> dict:
    from safetensors.torch import load_file

    state = {}
    for f in sorted(path.glob("*.safetensors")):
        state.update(load_file(str(f)))
    return state


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--repeats", type=int, default=1, help="one-process/auto pairs, alternated")
    p.add_argument("--set", action="append", default=[], help="config overrides for both sides (the demo's --set)")
    p.add_argument("--json", help="write the results here")
    p.add_argument("--wait-idle", type=float, default=0, metavar="MINUTES",
                   help="first wait up to MINUTES for the 1-minute load average to drop below 0.5")
    args = p.parse_args()

    import torch

    from evolm import machine

    waited = _wait_idle(args.wait_idle)
    phases = []
    with tempfile.TemporaryDirectory(prefix="evolm-demo-parallel-") as tmp:
        for r in range(args.repeats):
            for kind in ("one", "auto"):
                phase = run_phase(kind, Path(tmp), f"{kind}-{r}", args)
                phases.append(phase)
                print(f"{phase['name']}: {phase['wall_s']} s wall, {phase['seconds_updates']} s in {phase['updates']} updates "
                      f"({phase['parallelism']}; load {phase['load_1min_before']} -> {phase['load_1min_after']})", flush=True)
        last = args.repeats - 1
        a, b = _final_state(Path(tmp) / f"one-{last}" / "final"), _final_state(Path(tmp) / f"auto-{last}" / "final")
        same_weights = a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
        logs = [(Path(tmp) / f"{k}-{last}" / "seed_log.jsonl").read_text() for k in ("one", "auto")]
    one = [ph for ph in phases if ph["kind"] == "one"]
    auto = [ph for ph in phases if ph["kind"] == "auto"]
    wall = lambda group, key="wall_s": sum(ph[key] for ph in group)  # noqa: E731
    speedup = wall(one) / wall(auto)
    result = {
        "benchmark": "demo_parallel", "overrides": args.set, "one_process": ONE,
        "usable_cores": machine.usable_cores()[0] if "OMP_NUM_THREADS" not in os.environ else None,
        "machine": {"cpus": os.cpu_count(), "processor": platform.processor() or platform.machine(),
                    "python": platform.python_version(), "torch": torch.__version__},
        "auto_parallelism": auto[-1]["parallelism"], "one_wall_s": wall(one), "auto_wall_s": wall(auto),
        "speedup_wall": round(speedup, 3), "speedup_updates": round(wall(one, "seconds_updates") / wall(auto, "seconds_updates"), 3),
        "same_weights": same_weights, "same_fitness": one[-1]["fitness"] == auto[-1]["fitness"],
        "same_seed_log": logs[0] == logs[1], "same_eval": one[-1]["eval"] == auto[-1]["eval"],
        "waited_for_idle_s": waited, "phases": phases, "measured": time.strftime("%Y-%m-%d %H:%M"),
    }
    print(f"| demo ({auto[-1]['parallelism'].removeprefix('parallelism: ')}) | {wall(one):.0f} s | {wall(auto):.0f} s | "
          f"{speedup:.2f}x | weights {same_weights}, fitness {result['same_fitness']}, eval {result['same_eval']} |")
    if args.json:
        Path(args.json).parent.mkdir(parents=True, exist_ok=True)
        Path(args.json).write_text(json.dumps(result, indent=1) + "\n")


if __name__ == "__main__":
    main()
