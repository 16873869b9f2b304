"""Ray scaling: ES members/s with K = 2 Ray actors x 1 thread against the local population (K = 1).

    python benchmarks/ray_scaling.py                                   # configs/es-arithmetic.toml, 2 updates per run
    python benchmarks/ray_scaling.py --repeats 2 --json docs/benchmarks/ray_scaling.json

Method (one invocation, so both sides see the same machine):
- each phase is a real ``evolm es`` run in a child process of the same config (the shipped
  configs/es-arithmetic.toml: SmolLM2-135M float32, 8 members x 32 prompts x 16 greedy tokens, one
  torch thread) with held-out evaluation, probes and checkpoints off; the local phase uses
  ``distributed.workers = 0`` (members one after another in the driver), the Ray phase
  ``distributed.workers = 2`` (a private local Ray instance, two actors of one thread each);
- phases alternate local, Ray, local, Ray, ... (``--repeats``);
- members/s = members scored / the sum of the runs' per-update wall times (``seconds`` in
  metrics.jsonl: scoring, the update, the replicas' checksums); model loading, Ray start-up and the
  actors' loading are reported apart (``startup_s``), since they are paid once per run;
- ``speedup`` = Ray members/s / local members/s; target >= 1.7 on a 2-core machine;
- the machine is shared: every phase records the 1-minute load average before and after and the
  machine-wide busy CPU time during the phase (``busy_cores``: busy core-seconds / wall seconds; 2.0
  means both cores were busy all the time, with whoever's work);
  just before each phase, 1 and then 2 busy-looping processes measure how many cores this session can
  get at that moment (``cores_available_before``): with the kernel's autogroup scheduling a busy
  neighbour session halves what 2 processes get, and the Ray phase cannot scale past that;
- both sides use the fused perturb kernel, built once before the phases in a private cache (the
  model caches are linked from the shared one), so no kernel build lands inside a measured update;
- ``--wait-idle MINUTES`` first waits (up to that long) for the 1-minute load average to fall below
  0.5, so the comparison runs on an idle machine when one comes;
- the last Ray run's final weights and per-member fitnesses are compared with the last local run's
  (``same_weights``, ``same_fitness``: the Ray population must reach bit-identical results).
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


def _busy_seconds() -> tuple[float, float]:
    import psutil

    t = psutil.cpu_times()
    idle = t.idle + getattr(t, "iowait", 0.0)
    return sum(t) - idle, idle


def _spin(seconds: float, queue) -> None:
    import time as t

    w0, c0, n = t.perf_counter(), t.process_time(), 0
    while t.perf_counter() - w0 < seconds:
        for _ in range(10_000):
            n += 1
    queue.put(t.process_time() - c0)


def cores_available(processes: int, seconds: float = 3.0) -> float:
    """CPU cores that ``processes`` busy-looping processes of this session obtain right now (CPU s / wall s).

    On a machine shared with other sessions under the kernel's autogroup scheduling, CPU time is
    shared between sessions, not processes: 2 processes then get no more than 1 while others are busy."""
    import multiprocessing as mp

    queue = mp.Queue()
    procs = [mp.Process(target=_spin, args=(seconds, queue)) for _ in range(processes)]
    t0 = time.perf_counter()
    for proc in procs:
        proc.start()
    for proc in procs:
        proc.join()
    return round(sum(queue.get() for _ in procs) / (time.perf_counter() - t0), 2)


def run_phase(workers: int, out_dir: Path, name: str, args) -> dict:
    sets = [f"run.out_dir='{out_dir}'", f"run.name='{name}'", f"es.iterations={args.iterations}", "eval.before_after=false",
            "probe.every=0", "run.checkpoint_every=0", "run.progress=false", f"distributed.workers={workers}",
            f"distributed.threads={args.threads}", f"model.threads={args.threads}", *args.set]
    cmd = [sys.executable, "-m", "evolm", "es", "--config", str(args.config)]
    for s in sets:
        cmd += ["--set", s]
    available = {"1_process": cores_available(1), "2_processes": cores_available(2)}
    load_before = os.getloadavg()
    busy0, _ = _busy_seconds()
    t0 = time.perf_counter()
    env = {**os.environ, "PYTHONPATH": str(REPO / "src"), "EVOLM_CACHE": str(args.cache)}
    out = subprocess.run(cmd, capture_output=True, text=True, env=env)
    wall = time.perf_counter() - t0
    busy1, _ = _busy_seconds()
    if out.returncode != 0:
        sys.exit(f"phase {name} failed:\n{out.stderr[-3000:]}")
    records = [json.loads(line) for line in (out_dir / name / "metrics.jsonl").read_text().splitlines() if line.strip()]
    train = [r for r in records if r.get("kind") == "train"]
    members = sum(len(r["fitness"]) for r in train)
    seconds = sum(r["seconds"] for r in train)
    return {
        "name": name, "workers": workers, "updates": len(train), "members": members,
        "seconds_updates": round(seconds, 2), "members_per_s": members / seconds,
        "seconds_per_update": [round(r["seconds"], 2) for r in train],
        "seconds_update_phase": [round(r["seconds_update"], 2) for r in train],
        "seconds_generate_summed": [round(r["seconds_generate"], 2) for r in train],
        "members_per_actor": [r.get("ray_members") for r in train] if workers >= 2 else None,
        "startup_s": round(wall - seconds, 1), "wall_s": round(wall, 1),
        "load_1min_before": round(load_before[0], 2), "load_1min_after": round(os.getloadavg()[0], 2),
        "busy_cores": round((busy1 - busy0) / wall, 2),
        "cores_available_before": available,
        "fitness": [r["fitness"] for r in train],
    }


def _final_state(path: Path) -> dict:
    from safetensors.torch import load_file

    state = {}
    for f in sorted(path.glob("*.safetensors")):
        state.update(load_file(str(f)))
    return state


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--config", default=str(REPO / "configs" / "es-arithmetic.toml"))
    p.add_argument("--iterations", type=int, default=2, help="ES updates per run")
    p.add_argument("--repeats", type=int, default=1, help="local/Ray pairs, alternated")
    p.add_argument("--threads", type=int, default=1, help="torch threads of the local driver and of every actor")
    p.add_argument("--set", action="append", default=[], help="extra config overrides for both sides")
    p.add_argument("--json", help="write the results here")
    p.add_argument("--wait-idle", type=float, default=0, metavar="MINUTES",
                   help="first wait up to MINUTES for the 1-minute load average to drop below 0.5")
    args = p.parse_args()

    import torch

    waited = _wait_idle(args.wait_idle)
    phases = []
    with tempfile.TemporaryDirectory(prefix="evolm-ray-scaling-") as tmp:
        args.cache = _private_cache(Path(tmp) / "cache")
        for r in range(args.repeats):
            for workers in (0, 2):
                phase = run_phase(workers, Path(tmp), f"k{workers}-{r}", args)
                phases.append(phase)
                print(f"{phase['name']}: {phase['members_per_s']:.3f} members/s over {phase['updates']} updates "
                      f"({phase['seconds_per_update']} s; start-up {phase['startup_s']} s; load {phase['load_1min_before']}"
                      f" -> {phase['load_1min_after']}; busy cores {phase['busy_cores']})", flush=True)
        last = args.repeats - 1
        a, b = _final_state(Path(tmp) / f"k0-{last}" / "final"), _final_state(Path(tmp) / f"k2-{last}" / "final")
        same_weights = a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
    local = [ph for ph in phases if ph["workers"] == 0]
    ray = [ph for ph in phases if ph["workers"] == 2]
    rate = lambda group: sum(ph["members"] for ph in group) / sum(ph["seconds_updates"] for ph in group)  # noqa: E731
    speedup = rate(ray) / rate(local)
    result = {
        "benchmark": "ray_scaling", "config": str(Path(args.config).relative_to(REPO)) if Path(args.config).is_relative_to(REPO) else args.config,
        "overrides": [f"es.iterations={args.iterations}", "eval.before_after=false", "probe.every=0", "run.checkpoint_every=0",
                      f"model.threads={args.threads}", f"distributed.threads={args.threads}", *args.set],
        "machine": {"cpus": os.cpu_count(), "processor": platform.processor() or platform.machine(),
                    "python": platform.python_version(), "torch": torch.__version__, "ray": _ray_version()},
        "local_members_per_s": rate(local), "ray_k2_members_per_s": rate(ray), "speedup": speedup, "target": 1.7,
        "met": speedup >= 1.7, "same_weights": same_weights,
        "same_fitness": local[-1]["fitness"] == ray[-1]["fitness"],
        "waited_for_idle_s": waited, "phases": phases, "measured": time.strftime("%Y-%m-%d %H:%M"),
    }
    print(f"speedup {speedup:.2f} (target 1.7): local {rate(local):.3f} members/s, Ray K=2 {rate(ray):.3f} members/s; "
          f"same weights {same_weights}, same fitness {result['same_fitness']}")
    if args.json:
        Path(args.json).parent.mkdir(parents=True, exist_ok=True)
        Path(args.json).write_text(json.dumps(result, indent=1) + "\n")


def _private_cache(path: Path) -> Path:
    """An EVOLM_CACHE for the phases: the shared model caches linked in, and a private build of the
    fused kernel made here, before any phase, so that neither side pays (or waits for) a kernel
    build inside its measured updates (another checkout's build in the shared cache forces a rebuild)."""
    from evolm.models import cache_dir

    shared = cache_dir()
    path.mkdir(parents=True)
    for entry in shared.iterdir() if shared.exists() else ():
        if entry.name != "torch_extensions":
            (path / entry.name).symlink_to(entry)
    code = "from evolm.es import fused; import sys; sys.exit(0 if fused.kernel() is not None else 1)"
    built = subprocess.run([sys.executable, "-c", code], env={**os.environ, "EVOLM_CACHE": str(path),
                                                           "PYTHONPATH": str(REPO / "src")}).returncode == 0
    print(f"fused kernel {'built' if built else 'unavailable (torch ops on both sides)'} in {path}", flush=True)
    return path


def _wait_idle(minutes: float) -> float | None:
    """Seconds waited for the load average to drop below 0.5 (None: it did not within ``minutes``)."""
    t0 = time.time()
    while os.getloadavg()[0] >= 0.5:
        if time.time() - t0 > minutes * 60:
            return None
        time.sleep(15)
    return round(time.time() - t0)


def _ray_version() -> str:
    try:
        import ray

        return ray.__version__
    except ImportError:
        return "not installed"


if __name__ == "__main__":
    main()
