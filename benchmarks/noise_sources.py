"""Noise sources side by side: ES's own cost per member and ES's peak memory with ``es.noise = "table"``
and ``"counter"`` on the default model, in one invocation.

    python benchmarks/noise_sources.py                                    # CPU, SmolLM2-135M, 1 thread
    python benchmarks/noise_sources.py --json docs/benchmarks/noise_sources_cpu.json
    python benchmarks/noise_sources.py --device cuda --random-init        # a GPU without the weights

Method:
- speed, one child process (the model loaded once, both sources' ParamSets over the same weights):
  ``repeats`` rounds; in each, for each source (the order alternates between rounds) N members are
  perturbed (sigma = es.sigma) and restored one after another and one update of N directions is
  applied (one-point ES, coefficients like z-scored fitness, step lr / N), and one member's generation
  (the iteration's prompts, greedy) is timed with the unperturbed model. Reported: per-phase medians
  over rounds, wall and CPU (``time.thread_time``) seconds; the engine's cost per member, perturb +
  restore + update / N; and the ES time per member, generation + that cost, whose ratio counter /
  table is the ES speed ratio (target <= 1.03). Each source's restore is also checked bit-exact.
- memory, fresh child processes (``es_overhead.child_memory``): inference only (the model generates
  the batches an ES iteration generates, twice) and two full ES iterations with each source (perturb,
  generate, restore per member, update); peak RSS (``ru_maxrss``). Target: ES <= 1.1 x inference.
"""

from __future__ import annotations

import argparse
import copy
import json
import os
import platform
import statistics
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from es_overhead import _device_name, _setup, _sync, child_memory  # noqa: E402

SOURCES = ("table", "counter")


def child_speed(args) -> dict:
    import numpy as np
    import torch

    from evolm.backends.base import SamplingParams
    from evolm.es.engine import build_paramset, training_batch
    from evolm.es.update import compute_update, member_layout

    cfg, model, tokenizer, task, generator = _setup(args)
    sets, setup_s = {}, {}
    for kind in args.sources:
        c = copy.deepcopy(cfg)
        c.es.noise = kind
        t0 = time.perf_counter()
        sets[kind] = build_paramset(model, c)
        setup_s[kind] = time.perf_counter() - t0
    paths = {kind: ps.perturb_path for kind, ps in sets.items()}  # builds the fused kernel before timing
    examples, prompts = training_batch(task, tokenizer, 0, 0, cfg.es.prompts_per_iteration)
    sampling = SamplingParams(n=1, temperature=0.0, max_new_tokens=cfg.generation.max_new_tokens)
    generator.generate(prompts, sampling)  # warm-up
    layout = member_layout("one_point", cfg.es.population)
    exact = {}
    for kind, ps in sets.items():  # bit-exact restore on this device, for each source
        snapshot = [t.detach().clone() for t in ps.tensors]
        for m in range(3):
            ps.perturb(1000, m, 1, cfg.es.sigma)
            ps.restore()
        exact[kind] = all(torch.equal(a, b) for a, b in zip(snapshot, ps.tensors))
        del snapshot
    rng = np.random.default_rng(0)
    rounds = []
    for r in range(args.repeats):
        record = {}
        order = list(args.sources) if r % 2 == 0 else list(reversed(args.sources))
        for kind in order:
            ps = sets[kind]
            wall = {"perturb": 0.0, "restore": 0.0}
            cpu = {"perturb": 0.0, "restore": 0.0}
            for direction, sign in layout:
                for phase, call in (("perturb", lambda: ps.perturb(r, direction, sign, cfg.es.sigma)), ("restore", ps.restore)):
                    _sync(args.device)
                    w, c = time.perf_counter(), time.thread_time()
                    call()
                    _sync(args.device)
                    wall[phase] += time.perf_counter() - w
                    cpu[phase] += time.thread_time() - c
            update = compute_update(rng.normal(size=len(layout)), estimator="one_point", shaping="zscore",
                                    lr=cfg.es.lr, sigma=cfg.es.sigma)
            w, c = time.perf_counter(), time.thread_time()
            assert ps.apply_update(r, update.coefficients, update.scale)
            _sync(args.device)
            wall["update"], cpu["update"] = time.perf_counter() - w, time.thread_time() - c
            record[kind] = {"wall": wall, "cpu": cpu}
        _sync(args.device)
        w, c = time.perf_counter(), time.thread_time()
        generator.generate(prompts, sampling)
        _sync(args.device)
        record["generation_member"] = {"wall": time.perf_counter() - w, "cpu": time.thread_time() - c}
        rounds.append(record)
    return {"rounds": rounds, "setup_s": setup_s, "paths": paths, "restore_exact": exact, "params": sets[args.sources[0]].numel,
            "members": len(layout), "device_name": _device_name(args.device),
            "noise_bytes": {kind: _noise_bytes(ps.noise) for kind, ps in sets.items()}}


def _noise_bytes(noise) -> int:
    import torch

    return sum(v.numel() * v.element_size() for v in vars(noise).values() if isinstance(v, torch.Tensor))


def _child(args, what: str, noise: str) -> dict:
    cmd = [sys.executable, __file__, "--child", what, "--model", args.model, "--device", args.device, "--threads", str(args.threads),
           "--population", str(args.population), "--prompts", str(args.prompts), "--max-new-tokens", str(args.max_new_tokens),
           "--batch-size", str(args.batch_size), "--repeats", str(args.repeats), "--noise", noise,
           "--sources", ",".join(args.sources)] + (["--random-init"] if args.random_init else [])
    out = subprocess.run(cmd, capture_output=True, text=True)
    if out.returncode != 0:
        raise SystemExit(f"child {what} failed:\n{out.stderr[-3000:]}")
    return json.loads(out.stdout.strip().splitlines()[-1])


def summarise(speed: dict, members: int) -> dict:
    """Medians over rounds: per member perturb, restore, update / N, the engine's cost, and the ES time
    per member (one member's generation + that cost), wall and CPU; ratios of each source to the first."""
    rounds = speed["rounds"]
    out = {}
    for clock in ("wall", "cpu"):
        gen = statistics.median(r["generation_member"][clock] for r in rounds)
        per = {}
        for kind in speed["restore_exact"]:
            med = {phase: statistics.median(r[kind][clock][phase] for r in rounds) for phase in ("perturb", "restore", "update")}
            engine = (med["perturb"] + med["restore"] + med["update"]) / members
            per[kind] = {"perturb_per_member": med["perturb"] / members, "restore_per_member": med["restore"] / members,
                         "update_per_member": med["update"] / members, "engine_per_member": engine,
                         "es_per_member": gen + engine}
        first = next(iter(per))
        for kind in per:
            per[kind]["engine_ratio"] = per[kind]["engine_per_member"] / per[first]["engine_per_member"]
            per[kind]["es_speed_ratio"] = per[kind]["es_per_member"] / per[first]["es_per_member"]
        out[clock] = {"generation_per_member": gen, **per}
    return out


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", default="smollm2-135m")
    p.add_argument("--device", default="cpu")
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--population", type=int, default=8)
    p.add_argument("--prompts", type=int, default=32)
    p.add_argument("--max-new-tokens", type=int, default=16)
    p.add_argument("--batch-size", type=int, default=32)
    p.add_argument("--repeats", type=int, default=5)
    p.add_argument("--sources", default=",".join(SOURCES), help="noise sources, the first is the reference")
    p.add_argument("--noise", default="table", help=argparse.SUPPRESS)  # the source of a memory child
    p.add_argument("--random-init", action="store_true")
    p.add_argument("--skip-memory", action="store_true")
    p.add_argument("--json", help="write results here")
    p.add_argument("--child", help=argparse.SUPPRESS)
    args = p.parse_args()
    args.sources = tuple(args.sources.split(","))
    if args.child:
        result = child_speed(args) if args.child == "speed" else child_memory(args, args.child)
        print(json.dumps(result))
        return
    results = {"settings": {k: v for k, v in vars(args).items() if k not in ("child", "json", "noise")},
               "machine": {"cpu": platform.processor() or platform.machine(), "cores": os.cpu_count(),
                           "load_before": os.getloadavg()}}
    speed = _child(args, "speed", args.sources[0])
    results["speed"] = speed
    results["summary"] = summarise(speed, speed["members"])
    if not args.skip_memory:
        memory = {"inference": _child(args, "inference", args.sources[0])}
        for kind in args.sources:
            memory[kind] = _child(args, "es", kind)
        for kind in args.sources:
            memory[kind]["rss_ratio"] = memory[kind]["peak_rss_mb"] / memory["inference"]["peak_rss_mb"]
        results["memory"] = memory
    results["machine"]["load_after"] = os.getloadavg()
    s = results["summary"]
    print(f"{speed['device_name']}, {speed['params']:,} parameters, N = {speed['members']}, {args.threads} thread(s), "
          f"load {results['machine']['load_before'][0]:.2f} -> {results['machine']['load_after'][0]:.2f}")
    print(f"one member's generation: {s['wall']['generation_per_member']:.2f} s wall, {s['cpu']['generation_per_member']:.2f} s CPU")
    for kind in args.sources:
        w, c = s["wall"][kind], s["cpu"][kind]
        line = (f"{kind:8s} per member: perturb {w['perturb_per_member']:.3f} / restore {w['restore_per_member']:.3f} / "
                f"update {w['update_per_member']:.3f} s wall = {w['engine_per_member']:.3f} s (CPU {c['engine_per_member']:.3f} s); "
                f"engine x{w['engine_ratio']:.2f} (CPU x{c['engine_ratio']:.2f}), ES time per member x{w['es_speed_ratio']:.3f} "
                f"(CPU x{c['es_speed_ratio']:.3f}); restore bit-exact {speed['restore_exact'][kind]}; "
                f"noise buffers {speed['noise_bytes'][kind] / 2**20:.1f} MB")
        if "memory" in results:
            m = results["memory"]
            line += f"; peak RSS {m[kind]['peak_rss_mb']:.0f} MB / inference {m['inference']['peak_rss_mb']:.0f} MB = {m[kind]['rss_ratio']:.3f}"
        print(line)
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=2) + "\n")


if __name__ == "__main__":
    main()
