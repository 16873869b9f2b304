"""Time the weight analyses on the real SmolLM2-135M (134.5M float32 parameters, tied embeddings).

The trained model is the base plus an ES-like synthetic update made in memory (every coordinate
moved by N(0, 2e-4²), 120 norm coordinates by +0.05), so nothing is written to disk. One thread.

    PYTHONPATH=src python benchmarks/analysis_ops.py
"""

from __future__ import annotations

import resource
import time

import torch

from evolm import models
from evolm.analysis import compression, sparsity
from evolm.analysis.drift import drift
from evolm.analysis.localisation import top_k_localisations
from evolm.analysis.weights import load_state
from evolm.state import state_fingerprint


def main() -> None:
    torch.set_num_threads(1)
    t0 = time.perf_counter()
    base = load_state(models.DEFAULT_MODEL)
    load_s = time.perf_counter() - t0
    g = torch.Generator().manual_seed(0)
    trained = {k: v + torch.randn(v.shape, generator=g) * 2e-4 for k, v in base.items()}
    for i in range(0, 30, 3):
        trained[f"model.layers.{i}.input_layernorm.weight"][:12] += 0.05
    rows = [("load_state (safetensors -> float32 dict)", load_s)]
    ops = [
        ("state_fingerprint (the base check)", lambda: state_fingerprint(base)),
        ("drift (with the ||Δ||² enrichment)", lambda: drift(base, trained)),
        ("top_k_localisations k=100,144 (with the null)", lambda: top_k_localisations(base, trained, [100, 144])),
        ("update_sparsity, 6 thresholds", lambda: sparsity.update_sparsity(base, trained, sparsity.tau_grid(2e-4))),
        ("threshold_update (one τ)", lambda: sparsity.threshold_update(base, trained, 2e-4)),
        ("compress int8 (attention+mlp)", lambda: compression.compress(trained, "int8")),
        ("compress int4 (attention+mlp)", lambda: compression.compress(trained, "int4")),
        ("compress prune:0.5 (global)", lambda: compression.compress(trained, "prune:0.5")),
        ("compress prune-tensor:0.5", lambda: compression.compress(trained, "prune-tensor:0.5")),
    ]
    for name, op in ops:
        t0 = time.perf_counter()
        op()
        rows.append((name, time.perf_counter() - t0))
    print("| operation | seconds |\n|---|---|")
    for name, s in rows:
        print(f"| {name} | {s:.1f} |")
    print(f"\npeak RSS {resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20:.1f} GiB")


if __name__ == "__main__":
    main()
