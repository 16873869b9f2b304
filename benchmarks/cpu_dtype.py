"""CPU dtype: an ES iteration in float32 against bf16 generation over float32 masters, in one process.

    python benchmarks/cpu_dtype.py --json docs/benchmarks/cpu_dtype.json    # the measurement (docs/benchmarks.md)
    python benchmarks/cpu_dtype.py --population 2 --prompts 4 --repeats 1 --json ''   # a smoke
    python benchmarks/cpu_dtype.py --shapes '' --json docs/benchmarks/cpu_dtype_visibility.json   # the cast alone

Why: ``model.dtype = "auto"`` means bfloat16 for ES on a CPU with AMX bf16 matrix units
(``evolm.machine.cpu_bf16_native``), float32 on other CPUs. This measures what that buys and what it
changes, on the machine it runs on:

- time: ``LocalPopulation.score`` (perturb, generate, restore per member, as an ES iteration runs it) and
  ``compute_update`` for the same members of iteration 0 and the same prompts, float32 and bfloat16
  alternating ``repeats`` times in one process (one model of each dtype loaded side by side; the bf16
  ParamSet keeps float32 masters, so its perturbation and restore are the masters' casts), median of each,
  CPU seconds of this process (``time.process_time``) beside wall seconds;
- the GEMM rates behind it: ``torch.mm`` at the decode shape (prompts x hidden @ hidden x intermediate)
  and a 1024^3 square product, float32 and bf16, this thread;
- what bf16 changes: the centre's greedy completions equal between the dtypes (fraction of prompts), and
  the Spearman correlation of the members' fitness between the dtypes (scipy.stats.spearmanr: whether bf16
  generation ranks the perturbations as float32 does; with few members, read it loosely);
- the share of coordinates, per parameter category, whose perturbation survives the cast to bf16 at all
  (``perturbation_visibility``);
- the AMX reading ``model.dtype = "auto"`` would act on.

Applying the update is left out on both sides (once per iteration; well under 1% of it here).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import time
from pathlib import Path
from typing import Any, NamedTuple

SHAPES = (("arithmetic", 24), ("countdown", 64))


class Side(NamedTuple):
    """One dtype's ES iteration: its config, ParamSet, generator, population and iteration-0 inputs."""
    cfg: Any
    params: Any
    generator: Any
    population: Any
    examples: list
    prompts: list
    sampling: Any
    layout: list


def _population(model, tokenizer, args, task_name: str, new_tokens: int, dtype: str) -> Side:
    from evolm import config
    from evolm.backends.base import SamplingParams
    from evolm.backends.hf import HFGenerator
    from evolm.es.engine import build_paramset, training_batch
    from evolm.es.population import LocalPopulation
    from evolm.es.update import member_layout
    from evolm.seeding import seed31
    from evolm.tasks import make_task

    cfg = config.from_dict(config.ESJob, {}, [
        f"model.spec='{args.model}'", f"model.dtype='{dtype}'", "model.device='cpu'", f"model.threads={args.threads}",
        "distributed.workers=0", f"task.name='{task_name}'", f"es.population={args.population}",
        f"es.prompts_per_iteration={args.prompts}", f"generation.max_new_tokens={new_tokens}",
        f"generation.batch_size={args.prompts}", f"es.sigma={args.sigma}"])
    task = make_task(cfg.task.name, cfg.task.reward, None, **cfg.task.params)
    params = build_paramset(model, cfg)
    generator = HFGenerator(model, tokenizer, batch_size=args.prompts)
    examples, prompts = training_batch(task, tokenizer, cfg.run.seed, 0, cfg.es.prompts_per_iteration)
    sampling = SamplingParams(n=1, max_new_tokens=new_tokens, seed=seed31(cfg.run.seed, "sampling", 0))
    return Side(cfg, params, generator, LocalPopulation(params, generator, task), examples, prompts, sampling,
                member_layout(cfg.es.estimator, cfg.es.population))


def _case(models, tokenizer, args, task_name: str, new_tokens: int) -> dict:
    from scipy.stats import spearmanr

    from evolm.backends.base import SamplingParams
    from evolm.es.update import compute_update

    sides = {dtype: _population(model, tokenizer, args, task_name, new_tokens, dtype) for dtype, model in models.items()}
    cpu: dict[str, list[float]] = {d: [] for d in sides}
    wall: dict[str, list[float]] = {d: [] for d in sides}
    fitness: dict[str, list[float]] = {}
    for _ in range(args.repeats):
        for dtype, side in sides.items():
            es = side.cfg.es
            c0, w0 = time.process_time(), time.perf_counter()
            scores = side.population.score(0, side.layout, args.sigma, side.examples, side.prompts, side.sampling)
            compute_update(scores.fitness, estimator=es.estimator, shaping=es.shaping, lr=es.lr,
                           sigma=args.sigma, divide_by_sigma=es.divide_by_sigma, errors=scores.errors)
            cpu[dtype].append(time.process_time() - c0)
            wall[dtype].append(time.perf_counter() - w0)
            fitness[dtype] = list(scores.fitness)
    greedy = SamplingParams(n=1, temperature=0.0, max_new_tokens=new_tokens)
    centre = {d: [o[0].text for o in side.generator.generate(side.prompts, greedy)] for d, side in sides.items()}
    rho = spearmanr(fitness["float32"], fitness["bfloat16"]).statistic if len(set(fitness["float32"])) > 1 else None
    f32, bf16 = statistics.median(cpu["float32"]), statistics.median(cpu["bfloat16"])
    return {"task": task_name, "max_new_tokens": new_tokens, "members": len(sides["float32"].layout),
            "prompts": len(sides["float32"].prompts),
            "cpu_seconds_float32": f32, "cpu_seconds_bfloat16": bf16, "speedup": f32 / bf16,
            "wall_seconds_float32": statistics.median(wall["float32"]), "wall_seconds_bfloat16": statistics.median(wall["bfloat16"]),
            "centre_greedy_equal": sum(a == b for a, b in zip(centre["float32"], centre["bfloat16"])) / len(centre["float32"]),
            "fitness_spearman": None if rho is None or rho != rho else float(rho),
            "fitness_float32": fitness["float32"], "fitness_bfloat16": fitness["bfloat16"],
            "cpu_seconds_all": cpu, "wall_seconds_all": wall}


def perturbation_visibility(model, sigma: float, seed: int = 0) -> dict:
    """Per parameter category: the share of coordinates whose float32 perturbation ``sigma * eps`` survives
    the cast a bf16 member's weights go through, ``bf16(theta + sigma * eps) != bf16(theta)`` (the rest
    generate with their unperturbed value; a visible one moves by whole bf16 steps, not by sigma * eps)."""
    import torch

    from evolm.categories import param_category

    g = torch.Generator().manual_seed(seed)
    counts: dict[str, list[int]] = {}
    for name, p in model.named_parameters():
        w = p.detach().float().flatten()
        visible = (w + sigma * torch.randn(w.shape, generator=g)).bfloat16() != w.bfloat16()
        c = counts.setdefault(param_category(name), [0, 0])
        c[0] += int(visible.sum())
        c[1] += w.numel()
    out = {c: {"visible": v / n, "parameters": n} for c, (v, n) in counts.items()}
    out["all"] = {"visible": sum(v for v, _ in counts.values()) / sum(n for _, n in counts.values()),
                  "parameters": sum(n for _, n in counts.values())}
    return out


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", default="smollm2-135m")
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--population", type=int, default=8)
    p.add_argument("--prompts", type=int, default=16)
    p.add_argument("--sigma", type=float, default=1e-3)
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--shapes", default=",".join(f"{t}:{n}" for t, n in SHAPES), help="task:new_tokens,...")
    p.add_argument("--json", default="docs/benchmarks/cpu_dtype.json", help="write results here ('' for nowhere)")
    args = p.parse_args(argv)
    import torch

    from evolm import machine, models

    from generation_rate import _cpu_name, gemm_rate  # benchmarks/ is on sys.path when run as a script

    torch.set_num_threads(args.threads)
    load_before = os.getloadavg()[0]
    loaded = {dtype: models.load(args.model, dtype=dtype, threads=args.threads, device="cpu") for dtype in ("float32", "bfloat16")}
    tokenizer = loaded["float32"][1]
    models_ = {dtype: m for dtype, (m, _) in loaded.items()}
    cfg = models_["float32"].config
    gemm = {dtype: {"decode_shape": gemm_rate(args.prompts, cfg.hidden_size, cfg.intermediate_size, 1.0, dtype),
                    "square_1024": gemm_rate(1024, 1024, 1024, 1.0, dtype)} for dtype in ("float32", "bfloat16")}
    visibility = perturbation_visibility(models_["float32"], args.sigma)
    print("perturbation visible after the bf16 cast: " + ", ".join(f"{c} {v['visible']:.3f}" for c, v in visibility.items()))
    rows = []
    for item in filter(None, args.shapes.split(",")):
        task, n = item.split(":")
        rows.append(_case(models_, tokenizer, args, task, int(n)))
        r = rows[-1]
        print(f"{task} {n} tokens: float32 {r['cpu_seconds_float32']:.1f} s, bf16 {r['cpu_seconds_bfloat16']:.1f} s "
              f"({r['speedup']:.2f}x), centre greedy equal {r['centre_greedy_equal']:.2f}, "
              f"fitness Spearman {r['fitness_spearman']}", flush=True)
    amx, reading = machine.cpu_bf16_native()
    result = {"device": _cpu_name(), "amx": amx, "amx_reading": reading, "torch": torch.__version__,
              "settings": {k: v for k, v in vars(args).items() if k != "json"}, "gemm_gflops": gemm,
              "perturbation_visible_in_bf16": visibility,
              "load_before": load_before, "load_after": os.getloadavg()[0], "rows": rows}
    print(f"GEMM GFLOP/s (1 thread): float32 decode {gemm['float32']['decode_shape']:.0f}, square {gemm['float32']['square_1024']:.0f}; "
          f"bf16 decode {gemm['bfloat16']['decode_shape']:.0f}, square {gemm['bfloat16']['square_1024']:.0f}; AMX: {amx} ({reading}); "
          f"load {load_before:.2f} -> {result['load_after']:.2f}")
    if args.json:
        Path(args.json).parent.mkdir(parents=True, exist_ok=True)
        Path(args.json).write_text(json.dumps(result, indent=1) + "\n")


if __name__ == "__main__":
    main()
