"""Timing the counter-noise paths on one device: the Triton kernels (``evolm.es.noise_triton``) against the
torch ops, through ``ParamSet``, with their bits compared (``benchmarks/gpu_check.py`` calls it when a GPU
is lent; ``tests/test_counter_triton.py`` runs it under Triton's interpreter). Its own module so that the
kernels' module imports nothing of ``ParamSet``."""

from __future__ import annotations

import os
import time

import torch

from evolm.es import noise_triton
from evolm.es.noise import CounterNoise
from evolm.es.params import ParamSet


def benchmark_counter_noise(numel: int = 1 << 26, members: int = 32, device: str = "cuda", repeats: int = 3,
                            dtype: torch.dtype = torch.float32) -> dict:
    """Counter noise's cost on ``device``, Triton kernels against the torch ops, on one random tensor of
    ``numel`` elements through ``ParamSet`` (in place for float32, float32 masters for another ``dtype``):
    ``fill_s`` = ``CounterNoise.values`` of the whole tensor, ``member_s`` = fill + perturb + restore (one
    member's ES work), ``update_s`` = one update over ``members`` members (and per member); best of
    ``repeats`` after a first, uncounted round (which compiles the kernels). ``identical``: whether both
    paths gave the same bits (noise, perturbed weights, updated weights): on a GPU, the check of the
    inline-PTX rounding. ``restored_exact``: restore gave back the weights bit for bit, per path. The torch
    path runs with ``EVOLM_TRITON=0``; ``triton`` is None where the kernels cannot run (no triton, a CPU
    tensor outside the tests' interpreter)."""
    def synchronize():
        if torch.device(device).type == "cuda":
            torch.cuda.synchronize()

    def same(a, b):
        return bool(torch.equal(a.contiguous().view(torch.uint8), b.contiguous().view(torch.uint8)))

    torch.manual_seed(0)
    base = (torch.randn(numel, dtype=torch.float32) * 0.02).to(device=device, dtype=dtype)
    noise = CounterNoise(1234, device)
    coefficients = [((-1) ** d) * (0.5 + d / members) for d in range(members)]
    results, bits, restored = {}, {}, {}
    saved = os.environ.get("EVOLM_TRITON")
    try:
        for path in ("torch", "triton"):
            os.environ["EVOLM_TRITON"] = "0" if path == "torch" else (saved if saved not in (None, "0") else "1")
            if path == "triton" and not noise_triton.usable(base.float(), noise.table):
                results[path] = None
                continue
            weight = base.clone()
            params = ParamSet.from_tensors(noise, [0], ["w"], [weight])
            fill = torch.empty(numel, dtype=torch.float32, device=device)
            fill_s, member_s, update_s = [], [], []
            for r in range(repeats + 1):
                synchronize()
                t0 = time.perf_counter()
                noise.values(noise.keys(r, 0, 0), 0, numel, out=fill)
                synchronize()
                t1 = time.perf_counter()
                params.perturb(r, 0, 1, 1e-3)
                if r == 0:
                    perturbed = weight.clone()
                params.restore()
                synchronize()
                t2 = time.perf_counter()
                if r == 0:
                    restored[path] = same(weight, base)
                params.apply_update(r, coefficients, 1e-3)
                synchronize()
                t3 = time.perf_counter()
                if r == 0:
                    updated = params.masters[0] if params.masters is not None else weight
                    bits[path] = {"noise": fill.clone(), "perturbed": perturbed, "updated": updated.clone()}
                else:
                    fill_s.append(t1 - t0)
                    member_s.append(t2 - t0)
                    update_s.append(t3 - t2)
            results[path] = {"perturb_path": params.perturb_path, "fill_s": min(fill_s), "member_s": min(member_s),
                             "update_s": min(update_s), "update_s_per_member": min(update_s) / members}
    finally:
        if saved is None:
            os.environ.pop("EVOLM_TRITON", None)
        else:
            os.environ["EVOLM_TRITON"] = saved
    out = {"numel": numel, "members": members, "device": str(device), "dtype": str(dtype).replace("torch.", ""),
           "repeats": repeats, "triton_available": noise_triton.triton_available(), "restored_exact": restored, **results}
    if results.get("triton"):
        out["identical"] = {what: same(bits["torch"][what], bits["triton"][what]) for what in bits["torch"]}
        out["speedup_member"] = results["torch"]["member_s"] / results["triton"]["member_s"]
        out["speedup_update"] = results["torch"]["update_s"] / results["triton"]["update_s"]
    return out
