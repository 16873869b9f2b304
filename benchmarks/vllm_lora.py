"""Low-rank ES members as vLLM LoRA adapters: members scored per second against full-rank members and the ceiling.

    .venv-vllm/bin/python benchmarks/vllm_lora.py --json docs/benchmarks/vllm_lora.json        # N = 8, 16, 32
    .venv-vllm/bin/python benchmarks/vllm_lora.py --ns 2 --prompts 2 --max-new-tokens 4 --repeats 1 --eager \\
        --json /tmp/vllm_lora_smoke.json                                                        # does it run?

Method. One process starts ONE vLLM engine with LoRA enabled (``max_loras`` = the largest N, rank
``es.rank`` in vLLM's next rank bucket) on the embedded SmolLM2-135M, float32, and takes the training
prompts of configs/es-arithmetic.toml (``training_batch``: 2-digit addition, greedy). For each N it
alternates ``--repeats`` times between

  (a) ``full``: full-rank members one at a time (``LocalPopulation`` over ``EngineParamSet``: perturb inside
      the engine's worker, generate the prompts, restore; N engine calls);
  (b) ``lora``: the LoRA population (``LoRAPopulation``): N adapters registered in the worker from the keyed
      low-rank noise, then N x prompts requests in ONE engine call;
  (c) ``ceiling``: pure batched inference of the same N x prompts requests in one call with no adapters,
      each member's copy of the prompts under its own ``cache_salt`` (so, as in (b), a member reuses its own
      prompts' shared prefix but never another member's KV).

Reported per N: members scored per second (N / median wall seconds of one scoring, the update excluded),
the same per CPU-second of this process and its children (vLLM's engine-core and worker processes: on a
shared machine wall time follows the other jobs), and the ratios ``lora_over_ceiling`` = (b)/(c) and
``lora_over_full`` = (b)/(a). The load average is recorded before and after each N: it says how much to
trust a figure. Both populations perturb the same parameters (``--params``, default attention and MLP, the
matrices a LoRA adapter can carry). All three modes run on the same engine, so (a) and (c) also pay for
vLLM's LoRA layers with no adapter active (punica ops on an empty mapping): compare with
``benchmarks/vllm_backend.py`` (an engine without LoRA) for that cost.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
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


def _ceiling(generator, prompts, sampling, members: int) -> int:
    """(c): members x prompts requests, no adapters, one engine call; each member's copy under its own cache salt."""
    ids = generator.check_lengths(prompts, sampling)
    requests = [{"prompt_token_ids": x, "cache_salt": f"member-{m}"} for m in range(members) for x in ids]
    params = [generator._sampling(sampling, i) for _ in range(members) for i in range(len(ids))]
    outputs = generator.llm.generate(requests, params, use_tqdm=False)
    return sum(len(c.token_ids) for o in outputs for c in o.outputs)


def run(args) -> dict:
    import torch

    from evolm import config, models
    from evolm.backends.base import SamplingParams
    from evolm.backends.vllm import VLLMGenerator
    from evolm.es.engine import build_paramset, make_population, training_batch
    from evolm.es.update import member_layout
    from evolm.tasks import make_task

    torch.set_num_threads(args.threads)
    ns = [int(n) for n in args.ns.split(",")]
    params = "[" + ",".join(f"'{p}'" for p in args.params.split(",")) + "]"
    base = [f"es.params={params}", f"es.rank={args.rank}", "generation.backend='vllm'", f"model.threads={args.threads}",
            f"generation.max_new_tokens={args.max_new_tokens}"]
    cfg_full = config.load(config.ESJob, ROOT / "configs" / "es-arithmetic.toml", base)
    model, tokenizer = models.load(cfg_full.model.spec, threads=args.threads)
    task = make_task(cfg_full.task.name, cfg_full.task.reward, None, **cfg_full.task.params)
    examples, prompts = training_batch(task, tokenizer, 0, 0, args.prompts)
    sampling = SamplingParams(n=1, temperature=0.0, max_new_tokens=args.max_new_tokens)
    t0 = time.perf_counter()
    generator = VLLMGenerator(model, tokenizer, threads=args.threads, kv_cache_gb=args.kv_cache_gb,
                              max_model_len=cfg_full.generation.vllm_max_model_len, enforce_eager=args.eager,
                              lora_slots=max(ns), lora_rank=args.rank)
    startup = time.perf_counter() - t0
    generator.generate(prompts, sampling)  # warm-up
    results = {}
    for n in ns:
        cfg_lora = config.load(config.ESJob, ROOT / "configs" / "es-arithmetic.toml",
                               base + ["es.perturbation='lowrank'", f"es.population={n}", "es.estimator='antithetic'"])
        cfg_n = config.load(config.ESJob, ROOT / "configs" / "es-arithmetic.toml", base + [f"es.population={n}"])
        layouts = {"full": member_layout(cfg_n.es.estimator, n), "lora": member_layout("antithetic", n)}
        load_before = os.getloadavg()
        times = {"full": [], "lora": [], "ceiling": []}
        cpu = {k: [] for k in times}
        tokens = {k: [] for k in times}
        for r in range(args.repeats):
            for mode, cfg in (("full", cfg_n), ("lora", cfg_lora)):
                paramset = build_paramset(model, cfg, generator=generator)  # the worker's ES state for this mode
                population = make_population(cfg, paramset, generator, task)
                t, c = time.perf_counter(), _cpu_seconds()
                scores = population.score(r, layouts[mode], cfg.es.sigma, examples, prompts, sampling)
                times[mode].append(time.perf_counter() - t)
                cpu[mode].append(_cpu_seconds() - c)
                tokens[mode].append(scores.gen_tokens)
                population.close()
            t, c = time.perf_counter(), _cpu_seconds()
            tokens["ceiling"].append(_ceiling(generator, prompts, sampling, n))
            times["ceiling"].append(time.perf_counter() - t)
            cpu["ceiling"].append(_cpu_seconds() - c)
            generator.reset_prefix_cache()
            print(f"N={n} repeat {r}: " + ", ".join(f"{k} {v[-1]:.1f}s ({cpu[k][-1]:.1f} CPU s)" for k, v in times.items()),
                  file=sys.stderr, flush=True)
        per_s = {k: n / statistics.median(v) for k, v in times.items()}
        per_cpu_s = {k: n / statistics.median(v) for k, v in cpu.items()}
        results[str(n)] = {
            "members_per_s": per_s, "members_per_cpu_s": per_cpu_s, "seconds": times, "cpu_seconds": cpu,
            "gen_tokens": tokens, "lora_over_ceiling": per_s["lora"] / per_s["ceiling"],
            "lora_over_full": per_s["lora"] / per_s["full"],
            "lora_over_ceiling_cpu": per_cpu_s["lora"] / per_cpu_s["ceiling"],
            "lora_over_full_cpu": per_cpu_s["lora"] / per_cpu_s["full"],
            "loadavg_before": load_before, "loadavg_after": os.getloadavg()}
        res = results[str(n)]
        print(f"N={n}: members/s full {per_s['full']:.2f}, LoRA {per_s['lora']:.2f}, ceiling {per_s['ceiling']:.2f}; "
              f"LoRA/ceiling {res['lora_over_ceiling']:.2f}, LoRA/full {res['lora_over_full']:.2f} "
              f"(CPU s: {res['lora_over_ceiling_cpu']:.2f}, {res['lora_over_full_cpu']:.2f}); "
              f"load {load_before[0]:.1f} -> {res['loadavg_after'][0]:.1f}", flush=True)
    generator.close()
    return {"engine_startup_s": startup, "by_population": results}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--ns", default="8,16,32", help="population sizes N, comma-separated")
    p.add_argument("--prompts", type=int, default=32, help="training prompts per member")
    p.add_argument("--max-new-tokens", type=int, default=16)
    p.add_argument("--rank", type=int, default=4, help="es.rank of the LoRA members")
    p.add_argument("--params", default="attention,mlp", help="es.params of both populations")
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--kv-cache-gb", type=float, default=2.0)
    p.add_argument("--eager", action="store_true", help="vLLM without torch.compile (starts faster)")
    p.add_argument("--json", help="write the results here")
    args = p.parse_args()
    import vllm

    settings = {k: v for k, v in vars(args).items() if k != "json"}
    out = {"settings": {**settings, "model": "smollm2-135m", "dtype": "float32", "greedy": True,
                        "config": "configs/es-arithmetic.toml"},
           "machine": {"cpu": platform.processor() or platform.machine(), "cores": os.cpu_count(), "vllm": vllm.__version__},
           "loadavg_start": os.getloadavg()}
    out.update(run(args))
    out["loadavg_end"] = os.getloadavg()
    if args.json:
        Path(args.json).parent.mkdir(parents=True, exist_ok=True)
        Path(args.json).write_text(json.dumps(out, indent=2) + "\n")


if __name__ == "__main__":
    main()
