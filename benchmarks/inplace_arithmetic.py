"""Cost of one ES update in the in-place arithmetics (``es.arithmetic = "reference"`` and ``"artifact"``), chunked
against whole tensors, on a real model in bfloat16; the two must end on the same bits.

    python benchmarks/inplace_arithmetic.py                                  # SmolLM2-135M, N = 32, 1 thread
    python benchmarks/inplace_arithmetic.py --model gemma3-270m --json docs/benchmarks/inplace_arithmetic_gemma.json

One update of a null walk (what ``experiments/refnum/null_walk.py`` does per update): N members perturbed and
restored (reverted), then the update, on one engine. Two ways, alternated, ``--repeats`` times each:

- ``chunked``: evolm's ``ReferenceParamSet`` / ``ArtifactParamSet`` (``evolm/es/reference.py``): every operation
  CHUNK = 2^20 values at a time into buffers allocated once;
- ``whole``: the same operations on whole tensors, as Qiu et al.'s lines and the artifact's worker write them (and
  as evolm did before): a temporary the size of each tensor per operation (for Gemma-3-270M's 168M-value
  embedding, 670 MB of float32 per temporary, fresh pages each time).

After every repeat the two models are compared bit for bit (the run fails otherwise) and both are reset from a
copy (not timed). Reported: seconds per update, median over repeats, and whole / chunked (a ratio measured in one
run). Run it alone: the two ways share the machine's memory bandwidth with anything else running.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import time
from pathlib import Path


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="smollm2-135m")
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--population", type=int, default=32)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--arithmetic", default="reference,artifact")
    ap.add_argument("--json", help="write the results here")
    args = ap.parse_args()

    import numpy as np
    import torch

    from evolm import models
    from evolm.es.artifact import ArtifactParamSet
    from evolm.es.noise import make_noise
    from evolm.es.reference import ReferenceParamSet

    torch.set_num_threads(args.threads)
    sigma, lr, n = 1.5e-3, 2.5e-4, args.population
    chunked_model, _ = models.load(args.model, dtype="bfloat16", threads=args.threads)
    whole_model, _ = models.load(args.model, dtype="bfloat16", threads=args.threads)
    results = {"model": args.model, "threads": args.threads, "population": n, "dtype": "bfloat16",
               "load": os.getloadavg()[0], "torch": torch.__version__, "arithmetic": {}}
    for arithmetic in args.arithmetic.split(","):
        cls = ReferenceParamSet if arithmetic == "reference" else ArtifactParamSet
        extra = {} if arithmetic == "reference" else {"population": n, "engines": 1}
        ours = cls(chunked_model, None, lr=lr, **extra)
        ours.noise = make_noise("table", 7, ours.layout, 0)
        theirs = cls(whole_model, ours.noise, lr=lr, **extra)
        base = [t.clone() for t in ours.tensors]
        eps = lambda params, k, d: params.noise.direction(0, d, params.indices[k], params.tensors[k].numel())  # noqa: E731
        coefficients = np.random.default_rng(0).standard_normal(n)
        coefficients = ((coefficients - coefficients.mean()) / coefficients.std()).tolist()

        @torch.no_grad()
        def whole_update():  # the same operations, one whole tensor at a time
            for d in range(n):
                for factor in (sigma, -sigma):
                    for k, live in enumerate(theirs.tensors):
                        if arithmetic == "reference":
                            live.add_(factor * eps(theirs, k, d).to(live.dtype).view_as(live))
                        else:
                            live.add_(torch.mul(eps(theirs, k, d), factor).to(live.dtype).view_as(live))
            for k, live in enumerate(theirs.tensors):
                if arithmetic == "reference":
                    update = torch.zeros_like(live)
                    for d, c in enumerate(coefficients):
                        noise = eps(theirs, k, d).to(live.dtype, copy=True).view_as(live)
                        noise.mul_(c)
                        update.add_(noise)
                    update.div_(n)
                    live.add_(lr * update)
                else:
                    total = torch.zeros(live.numel(), dtype=torch.float32)
                    for d, c in enumerate(coefficients):
                        total.add_(eps(theirs, k, d), alpha=lr / n * c)
                    live.view(-1).add_(total.to(live.dtype))

        def chunked_update():
            for d in range(n):
                ours.perturb(0, d, +1, sigma)
                ours.restore()
            assert ours.apply_update(0, coefficients, lr / n)

        times = {"chunked": [], "whole": []}
        for _ in range(args.repeats):
            for name, fn in (("whole", whole_update), ("chunked", chunked_update)):
                t0 = time.perf_counter()
                fn()
                times[name].append(time.perf_counter() - t0)
            same = all(torch.equal(a.view(torch.int16), b.view(torch.int16)) for a, b in zip(ours.tensors, theirs.tensors))
            moved = sum(int((a != b).sum()) for a, b in zip(ours.tensors, base))
            if not same or moved == 0:
                raise SystemExit(f"{arithmetic}: chunked and whole-tensor updates differ (same bits: {same}, moved: {moved})")
            for t, u, b in zip(ours.tensors, theirs.tensors, base):
                t.copy_(b)
                u.copy_(b)
        row = {k: statistics.median(v) for k, v in times.items()}
        row["whole_over_chunked"] = row["whole"] / row["chunked"]
        row["params"] = sum(t.numel() for t in ours.tensors)
        row["largest_tensor"] = max(t.numel() for t in ours.tensors)
        row["repeats"] = {k: v for k, v in times.items()}
        results["arithmetic"][arithmetic] = row
        print(f"{args.model} {arithmetic}: one update (N = {n}) chunked {row['chunked']:.2f} s, whole tensors "
              f"{row['whole']:.2f} s: {row['whole_over_chunked']:.2f}x (same bits; load {results['load']:.2f})")
        del ours, theirs, base
    if args.json:
        Path(args.json).parent.mkdir(parents=True, exist_ok=True)
        Path(args.json).write_text(json.dumps(results, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
