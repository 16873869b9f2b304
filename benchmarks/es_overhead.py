"""ES overhead: one ES iteration's wall time over the pure generation time of the same members, and
ES peak memory over inference-only peak memory, on the default model.

    python benchmarks/es_overhead.py                      # CPU, SmolLM2-135M, noise=table and stream
    python benchmarks/es_overhead.py --device cuda        # GPU
    python benchmarks/es_overhead.py --json out.json      # also write the numbers

Method (all in one invocation, so machine noise hits both sides alike):
- time: in a child process, alternate ``repeats`` times between (a) generating the iteration's prompts
  once per member with the unperturbed model ("pure generation", exactly the work ES must do) and
  (b) one full ES iteration (perturb, generate, restore for every member, then the update). The ratio
  of medians is reported, with the per-phase breakdown.
- memory: two fresh child processes, one that loads the model and generates the same batches
  (inference only) and one that runs ES iterations; their peak RSS (``ru_maxrss``) and, on CUDA,
  ``torch.cuda.max_memory_allocated`` are compared.
``--random-init`` builds the model from the config with random weights (for machines where the real
weights cannot be shipped; completions then always run to ``max_new_tokens``).
Targets (issue 2): time ratio <= 1.10, peak RSS <= 1.2 x inference-only.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import time
from pathlib import Path


def _setup(args):
    import torch

    from evolm import config, models
    from evolm.backends.hf import HFGenerator
    from evolm.tasks import make_task

    torch.set_num_threads(args.threads)
    if args.random_init:
        from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer

        models.quiet_transformers()
        directory = models.local_dir(args.model) if not Path(args.model).is_dir() else args.model
        torch.manual_seed(0)
        model = AutoModelForCausalLM.from_config(AutoConfig.from_pretrained(directory), dtype=torch.float32).to(args.device).eval()
        tokenizer = AutoTokenizer.from_pretrained(directory)
        tokenizer.padding_side = "left"
        tokenizer.pad_token = tokenizer.pad_token or tokenizer.eos_token
    else:
        model, tokenizer = models.load(args.model, threads=args.threads, device=args.device)
    cfg = config.from_dict(config.ESJob, {}, [
        f"model.spec='{args.model}'", f"es.population={args.population}", f"es.prompts_per_iteration={args.prompts}",
        f"generation.max_new_tokens={args.max_new_tokens}", f"generation.batch_size={args.batch_size}",
        f"es.noise='{args.noise}'", f"model.device='{args.device}'"])
    task = make_task(cfg.task.name, cfg.task.reward, None, **cfg.task.params)
    generator = HFGenerator(model, tokenizer, batch_size=args.batch_size)
    return cfg, model, tokenizer, task, generator


def _device_name(device: str) -> str:
    import platform

    import torch

    return torch.cuda.get_device_name(device) if device.startswith("cuda") else platform.processor() or platform.machine()


def _sync(device):
    if device.startswith("cuda"):
        import torch

        torch.cuda.synchronize()


def child_time(args) -> dict:
    from evolm.backends.base import SamplingParams
    from evolm.es.engine import build_paramset, training_batch
    from evolm.es.population import LocalPopulation
    from evolm.es.update import compute_update, member_layout

    cfg, model, tokenizer, task, generator = _setup(args)
    t0 = time.perf_counter()
    params = build_paramset(model, cfg)
    setup_s = time.perf_counter() - t0
    population = LocalPopulation(params, generator, task)
    layout = member_layout(cfg.es.estimator, cfg.es.population)
    examples, prompts = training_batch(task, tokenizer, 0, 0, cfg.es.prompts_per_iteration)
    sampling = SamplingParams(n=1, temperature=0.0, max_new_tokens=cfg.generation.max_new_tokens)
    generator.generate(prompts, sampling)  # warm-up
    import torch

    snapshot = [t.detach().clone() for t in params.tensors]
    for cycle in range(5):  # bit-exact restore on this device
        params.perturb(1000 + cycle, cycle, 1, cfg.es.sigma)
        params.restore()
    restore_exact = all(torch.equal(a, b) for a, b in zip(snapshot, params.tensors))
    del snapshot
    gen, es, phases = [], [], []
    for r in range(args.repeats):
        _sync(args.device)
        t = time.perf_counter()
        for _ in layout:
            generator.generate(prompts, sampling)
        _sync(args.device)
        gen.append(time.perf_counter() - t)
        t = time.perf_counter()
        scores = population.score(r, layout, cfg.es.sigma, examples, prompts, sampling)
        t_u = time.perf_counter()
        update = compute_update([f + 1e-3 * i for i, f in enumerate(scores.fitness)], estimator=cfg.es.estimator,
                                shaping=cfg.es.shaping, lr=cfg.es.lr, sigma=cfg.es.sigma)  # force a non-zero update
        population.apply_update(r, update)
        _sync(args.device)
        es.append(time.perf_counter() - t)
        phases.append({**scores.seconds, "update": time.perf_counter() - t_u, "gen_tokens": scores.gen_tokens})
    return {"generation_s": gen, "es_iteration_s": es, "phases": phases, "noise_setup_s": setup_s,
            "restore_exact": restore_exact, "device_name": _device_name(args.device),
            "ratio": statistics.median(es) / statistics.median(gen), "params": params.numel}


def child_memory(args, mode: str) -> dict:
    import resource

    import torch

    from evolm.backends.base import SamplingParams
    from evolm.es.engine import build_paramset, training_batch
    from evolm.es.population import LocalPopulation
    from evolm.es.update import compute_update, member_layout

    cfg, model, tokenizer, task, generator = _setup(args)
    examples, prompts = training_batch(task, tokenizer, 0, 0, cfg.es.prompts_per_iteration)
    sampling = SamplingParams(n=1, temperature=0.0, max_new_tokens=cfg.generation.max_new_tokens)
    layout = member_layout(cfg.es.estimator, cfg.es.population)
    if mode == "inference":
        for _ in range(2):
            for _ in layout:
                generator.generate(prompts, sampling)
    else:
        params = build_paramset(model, cfg)
        population = LocalPopulation(params, generator, task)
        for it in range(2):
            scores = population.score(it, layout, cfg.es.sigma, examples, prompts, sampling)
            update = compute_update([f + 1e-3 * i for i, f in enumerate(scores.fitness)], estimator=cfg.es.estimator,
                                    shaping=cfg.es.shaping, lr=cfg.es.lr, sigma=cfg.es.sigma)
            population.apply_update(it, update)
    out = {"peak_rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024}
    if args.device.startswith("cuda"):
        out["peak_gpu_mb"] = torch.cuda.max_memory_allocated() / 2**20
    return out


def _child(args, what: str) -> dict:
    cmd = [sys.executable, __file__, "--child", what, "--model", args.model, "--device", args.device, "--threads", str(args.threads),
           "--population", str(args.population), "--prompts", str(args.prompts), "--max-new-tokens", str(args.max_new_tokens),
           "--batch-size", str(args.batch_size), "--repeats", str(args.repeats), "--noise", args.noise] + (["--random-init"] if args.random_init else [])
    out = subprocess.run(cmd, capture_output=True, text=True)
    if out.returncode != 0:
        raise SystemExit(f"child {what} failed:\n{out.stderr[-3000:]}")
    return json.loads(out.stdout.strip().splitlines()[-1])


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", default="smollm2-135m")
    p.add_argument("--device", default="cpu")
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--population", type=int, default=8)
    p.add_argument("--prompts", type=int, default=32)
    p.add_argument("--max-new-tokens", type=int, default=16)
    p.add_argument("--batch-size", type=int, default=32)
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--noise", default="table", help="table, stream, or both (comma-separated)")
    p.add_argument("--random-init", action="store_true")
    p.add_argument("--json", help="write results here")
    p.add_argument("--child", help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.child:
        result = child_time(args) if args.child == "time" else child_memory(args, args.child)
        print(json.dumps(result))
        return
    results = {"settings": {k: v for k, v in vars(args).items() if k not in ("child", "json")}}
    for noise in args.noise.split(","):
        args.noise = noise
        timing = _child(args, "time")
        inference, es = _child(args, "inference"), _child(args, "es")
        results[noise] = {"timing": timing, "memory_inference": inference, "memory_es": es,
                          "rss_ratio": es["peak_rss_mb"] / inference["peak_rss_mb"]}
        ph = timing["phases"]
        med = lambda k: statistics.median(x[k] for x in ph)  # noqa: E731
        print(f"noise={noise}: ES iteration / pure generation = {timing['ratio']:.3f} "
              f"(generation {statistics.median(timing['generation_s']):.1f}s, ES {statistics.median(timing['es_iteration_s']):.1f}s; "
              f"per iteration: perturb {med('perturb'):.2f}s, restore {med('restore'):.2f}s, update {med('update'):.2f}s); "
              f"restore bit-exact: {timing['restore_exact']}; peak RSS ES {es['peak_rss_mb']:.0f} MB / inference {inference['peak_rss_mb']:.0f} MB = {results[noise]['rss_ratio']:.3f}"
              + (f"; GPU peak ES {es['peak_gpu_mb']:.0f} MB / inference {inference['peak_gpu_mb']:.0f} MB" if "peak_gpu_mb" in es else ""))
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=2))


if __name__ == "__main__":
    main()
