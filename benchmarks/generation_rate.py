"""Generation at the hardware's rate? HF generation's FLOP rate on ES's shapes against the GEMM rate of
the same machine, thread count and run.

    python benchmarks/generation_rate.py                          # SmolLM2-135M, CPU, 1 thread
    python benchmarks/generation_rate.py --json docs/benchmarks/generation_rate_cpu.json
    python benchmarks/generation_rate.py --dtype bfloat16 --json docs/benchmarks/generation_rate_cpu_bf16.json

Method (one process, one thread, so both sides see the same machine):
- the work: an ES member's generation of one iteration (``HFGenerator.generate`` on the task's
  prompts, greedy, as ``LocalPopulation`` calls it) for each shape: 2-digit addition (32 prompts,
  16 and 24 new tokens) and Countdown (32 prompts, 128 new tokens);
- FLOPs: counted by ``torch.utils.flop_counter.FlopCounterMode`` over one call (every matmul and
  attention the call executes: padding rows, finished rows that keep decoding until the batch ends,
  and the shared prefix once, as it runs), so the rate is what the hardware did, not a model estimate;
- time: CPU seconds of the process (``time.process_time``; less sensitive to other jobs than wall
  time) of ``repeats`` calls, median;
- ``F.linear`` at the decode shape beside it: the same product with the weight stored (n x k) as
  ``nn.Linear`` keeps it; on MKL's float32 path it runs well below ``torch.mm`` of a contiguous (k x n)
  operand at these few-row shapes, which is most of float32 generation's gap (docs/benchmarks.md);
- ``F.linear`` with its weights streamed from memory: the same product cycling through distinct weights
  as large together as the model, so none stays in cache, as in a decode step, which reads every weight
  once; the fraction against it is what decoding leaves of the rate the hardware gives its products;
- GEMM reference: ``torch.mm`` in the model's dtype (``--dtype``) at the shapes this generation runs most, (batch x hidden) @
  (hidden x intermediate) for decode steps and (prompt rows x hidden) @ (hidden x intermediate) for
  prefill, plus a 1024^3 square product, measured in between the generation repeats; a bfloat16 run
  also measures the float32 GEMM at the decode shape, so the two dtypes' rates compare on one scale (a
  CPU with AMX or AVX512-BF16 multiplies bf16 several times faster than float32);
- the profile: ``torch.profiler`` self-CPU time of one call by operator (matmul, KV-cache
  concatenation, attention, the rest).
Target (issue 27): effective FLOP rate >= 80% of the GEMM rate.
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import time
from pathlib import Path

SHAPES = [("arithmetic", 16), ("arithmetic", 24), ("countdown", 128)]


def _cpu_name() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def gemm_rate(m: int, k: int, n: int, seconds: float = 1.0, dtype: str = "float32") -> float:
    """GFLOP/s of ``(m x k) @ (k x n)`` in ``dtype`` on this thread (CPU time)."""
    import torch

    a, b = torch.randn(m, k, dtype=getattr(torch, dtype)), torch.randn(k, n, dtype=getattr(torch, dtype))
    a @ b
    calls, t0 = 0, time.process_time()
    while time.process_time() - t0 < seconds:
        a @ b
        calls += 1
    return 2 * m * k * n * calls / (time.process_time() - t0) / 1e9


def linear_rate(m: int, k: int, n: int, seconds: float = 1.0, dtype: str = "float32") -> float:
    """GFLOP/s of ``F.linear(x, w)`` with ``x: (m x k)`` and ``w: (n x k)`` in ``dtype`` on this thread (CPU
    time): the same product as ``gemm_rate(m, k, n)`` in the orientation ``nn.Linear`` stores its weight,
    ``x @ w.T``, which is what every projection of the model runs; one weight, reused from cache
    (``streamed_linear_rate`` with a single weight)."""
    return streamed_linear_rate(m, k, n, 0, seconds, dtype)


def streamed_linear_rate(m: int, k: int, n: int, total_bytes: int, seconds: float = 1.0, dtype: str = "float32") -> float:
    """GFLOP/s of ``F.linear(x, w)`` as ``linear_rate``, but cycling through distinct weights of ``total_bytes``
    together (the model's size), so each product reads its weight from memory as a decode step does: one
    step touches every weight once, and a model of hundreds of MB does not stay in a core's cache between
    steps. This is the rate the hardware gives decoding's products; ``linear_rate`` reuses one cached weight."""
    import torch
    import torch.nn.functional as F

    dt = getattr(torch, dtype)
    count = max(1, -(-total_bytes // (n * k * torch.finfo(dt).bits // 8)))
    x, ws = torch.randn(m, k, dtype=dt), [torch.randn(n, k, dtype=dt) for _ in range(count)]
    for w in ws:
        F.linear(x, w)
    calls, t0 = 0, time.process_time()
    while time.process_time() - t0 < seconds:
        for w in ws:
            F.linear(x, w)
        calls += count
    return 2 * m * k * n * calls / (time.process_time() - t0) / 1e9


def measure(model, tokenizer, task_name: str, new_tokens: int, prompts_n: int, repeats: int, dtype: str = "float32") -> dict:
    import torch
    from torch.profiler import ProfilerActivity, profile
    from torch.utils.flop_counter import FlopCounterMode

    from evolm.backends.base import SamplingParams
    from evolm.backends.hf import HFGenerator
    from evolm.es.engine import training_batch
    from evolm.tasks import make_task

    params = {"arithmetic": dict(digits=2, operators="+", terms=2), "countdown": {}}[task_name]
    task = make_task(task_name, "format_answer", None, **params)
    _, prompts = training_batch(task, tokenizer, 0, 0, prompts_n)
    generator = HFGenerator(model, tokenizer, batch_size=prompts_n)
    sampling = SamplingParams(n=1, temperature=0.0, max_new_tokens=new_tokens)
    generator.generate(prompts, sampling)  # warm-up
    with FlopCounterMode(display=False) as counter:
        outs = generator.generate(prompts, sampling)
    flops = counter.get_total_flops()
    cfg = model.config
    ids, _, prefix = generator._layout(prompts, new_tokens)
    times, decode, prefill, decode32, linear, streamed = [], [], [], [], [], []
    model_bytes = sum(p.numel() * p.element_size() for p in model.parameters())
    for _ in range(repeats):
        t0 = time.process_time()
        generator.generate(prompts, sampling)
        times.append(time.process_time() - t0)
        decode.append(gemm_rate(prompts_n, cfg.hidden_size, cfg.intermediate_size, 0.5, dtype))
        linear.append(linear_rate(prompts_n, cfg.hidden_size, cfg.intermediate_size, 0.5, dtype))
        streamed.append(streamed_linear_rate(prompts_n, cfg.hidden_size, cfg.intermediate_size, model_bytes, 1.0, dtype))
        prefill.append(gemm_rate(prompts_n * (len(ids[0]) - len(prefix)), cfg.hidden_size, cfg.intermediate_size, 0.5, dtype))
        if dtype != "float32":
            decode32.append(gemm_rate(prompts_n, cfg.hidden_size, cfg.intermediate_size, 0.5))
    square = gemm_rate(1024, 1024, 1024, dtype=dtype)
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        generator.generate(prompts, sampling)
    by_op = {e.key: e.self_cpu_time_total for e in prof.key_averages()}
    total = sum(by_op.values()) or 1.0
    share = {"matmul": sum(v for k, v in by_op.items() if k in ("aten::mm", "aten::addmm", "aten::bmm")) / total,
             "kv_cache_cat": by_op.get("aten::cat", 0.0) / total,
             "attention": sum(v for k, v in by_op.items() if "scaled_dot_product" in k) / total}
    share["other"] = 1.0 - sum(share.values())
    seconds = statistics.median(times)
    rate = flops / seconds / 1e9
    reference = statistics.median(decode)
    float32 = statistics.median(decode32) if decode32 else reference
    return {"task": task_name, "dtype": dtype, "new_tokens": new_tokens, "prompts": prompts_n, "prompt_width": len(ids[0]),
            "shared_prefix": len(prefix), "generated_tokens": sum(c.num_tokens for o in outs for c in o),
            "gflop_per_call": flops / 1e9, "cpu_seconds": seconds, "gflops": rate,
            "gemm_gflops_decode_shape": reference, "gemm_gflops_prefill_shape": statistics.median(prefill),
            "gemm_gflops_square": square, "fraction_of_decode_gemm": rate / reference,
            "fraction_of_square_gemm": rate / square, "gemm_gflops_decode_shape_float32": float32,
            "fraction_of_float32_decode_gemm": rate / float32, "linear_gflops_decode_shape": statistics.median(linear),
            "fraction_of_decode_linear": rate / statistics.median(linear),
            "streamed_linear_gflops_decode_shape": statistics.median(streamed), "model_bytes": model_bytes,
            "fraction_of_streamed_linear": rate / statistics.median(streamed), "profile_share": share, "repeats": repeats}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", default="smollm2-135m")
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--prompts", type=int, default=32)
    p.add_argument("--repeats", type=int, default=5)
    p.add_argument("--shapes", default=",".join(f"{t}:{n}" for t, n in SHAPES), help="task:new_tokens,...")
    p.add_argument("--dtype", default="float32", choices=("float32", "bfloat16"), help="the model's and the GEMM's dtype")
    p.add_argument("--json", help="write the results here")
    args = p.parse_args()
    import os

    import torch

    from evolm import models

    torch.set_num_threads(args.threads)
    model, tokenizer = models.load(args.model, dtype=args.dtype, threads=args.threads)
    rows = []
    for item in args.shapes.split(","):
        task, tokens = item.split(":")
        rows.append(measure(model, tokenizer, task, int(tokens), args.prompts, args.repeats, args.dtype))
    result = {"device": _cpu_name(), "threads": args.threads, "model": args.model, "dtype": args.dtype, "torch": torch.__version__,
              "attn_implementation": model.config._attn_implementation, "load_before": os.getloadavg()[0],
              "load_after": None, "rows": rows}
    result["load_after"] = os.getloadavg()[0]
    print(f"| task | new tokens | GFLOP/call | GFLOP/s | GEMM GFLOP/s (decode shape) | fraction | square GEMM | "
          f"float32 GEMM (decode shape) | fraction of it | F.linear (decode shape) | fraction of it | F.linear, weights streamed | **fraction of it** | matmul / cat / attention / other |  "
          f"({result['device']}, {args.threads} thread, {args.dtype})")
    print("|---|---|---|---|---|---|---|---|---|---|---|---|---|---|")
    for r in rows:
        s = r["profile_share"]
        print(f"| {r['task']} | {r['new_tokens']} | {r['gflop_per_call']:.1f} | {r['gflops']:.1f} | "
              f"{r['gemm_gflops_decode_shape']:.1f} | {r['fraction_of_decode_gemm']:.2f} | {r['gemm_gflops_square']:.1f} | "
              f"{r['gemm_gflops_decode_shape_float32']:.1f} | {r['fraction_of_float32_decode_gemm']:.2f} | "
              f"{r['linear_gflops_decode_shape']:.1f} | {r['fraction_of_decode_linear']:.2f} | "
              f"{r['streamed_linear_gflops_decode_shape']:.1f} | **{r['fraction_of_streamed_linear']:.2f}** | "
              f"{s['matmul']:.0%} / {s['kv_cache_cat']:.0%} / {s['attention']:.0%} / {s['other']:.0%} |")
    print(f"load average {result['load_before']:.2f} -> {result['load_after']:.2f}")
    if args.json:
        Path(args.json).write_text(json.dumps(result, indent=2) + "\n")


if __name__ == "__main__":
    main()
