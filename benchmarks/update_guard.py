"""Cost of the finite-weights guard on the ES update (``ParamSet.apply_update``), on the default model.

    python benchmarks/update_guard.py                     # CPU, SmolLM2-135M, N = 8, table noise
    python benchmarks/update_guard.py --device cuda --random-init
    python benchmarks/update_guard.py --json docs/benchmarks/update_guard_cpu.json

``apply_update`` proves an update safe with a bound (one ``aminmax`` read of every selected tensor)
before it writes; only near overflow does it compute every new value first (a second pass). Three
timings per repeat, medians reported:

- ``plain``: the update loop alone (``_add_update(write=True)``: what ``apply_update`` did before the
  guard, the same arithmetic bit for bit);
- ``guarded``: ``apply_update`` as the ES engine calls it (bound, then the loop);
- ``careful``: the fallback near overflow (check pass, then the loop), for reference.

Each timed update is undone by restoring the weights from a float32 copy taken before (not timed).
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
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--population", type=int, default=8)
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--random-init", action="store_true", help="random weights from the model's config")
    ap.add_argument("--json", help="write the results here")
    args = ap.parse_args()

    import torch

    from evolm import models
    from evolm.es.noise import make_noise
    from evolm.es.params import ParamSet

    torch.set_num_threads(args.threads)
    if args.random_init:
        from transformers import AutoConfig, AutoModelForCausalLM

        directory = models.local_dir(args.model)
        torch.manual_seed(0)
        model = AutoModelForCausalLM.from_config(AutoConfig.from_pretrained(directory), dtype=torch.float32)
        model = model.to(args.device).eval()
    else:
        model, _ = models.load(args.model, threads=args.threads, device=args.device)
    params = ParamSet(model, None)
    params.noise = make_noise("table", 7, params.layout, 0, params.tensors[0].device)
    params.noise.max_abs()  # computed once per run; not part of an update
    original = [t.clone() for t in params.tensors]
    g = torch.Generator().manual_seed(0)
    coefficients = torch.randn(args.population, generator=g).tolist()
    scale = 5e-4 / args.population

    def sync():
        if args.device.startswith("cuda"):
            torch.cuda.synchronize()

    def timed(fn) -> float:
        sync()
        t0 = time.perf_counter()
        fn()
        sync()
        seconds = time.perf_counter() - t0
        for t, o in zip(params.tensors, original):
            t.copy_(o)
        return seconds

    runs = {"plain": [], "guarded": [], "careful": []}
    for r in range(args.repeats):
        runs["plain"].append(timed(lambda: params._add_update(r, coefficients, scale, write=True)))
        runs["guarded"].append(timed(lambda: params.apply_update(r, coefficients, scale)))
        runs["careful"].append(timed(lambda: (params._add_update(r, coefficients, scale, write=False),
                                              params._add_update(r, coefficients, scale, write=True))))
    med = {k: statistics.median(v) for k, v in runs.items()}
    out = {"model": args.model, "random_init": args.random_init, "device": args.device, "threads": args.threads,
           "parameters": params.numel, "population": args.population, "repeats": args.repeats,
           "seconds_median": med, "seconds_all": runs, "guard_over_plain": med["guarded"] / med["plain"],
           "careful_over_plain": med["careful"] / med["plain"], "load_average": os.getloadavg()[0]}
    print(json.dumps(out, indent=2))
    if args.json:
        Path(args.json).write_text(json.dumps(out, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
