"""ES's arithmetic without ES's signal: the refnum runs' configs with seeded random fitness, no generation.

Every update is computed exactly as in a real ES run (the same noise, members, z-scoring, step scale and
arithmetic: exact float32, reference or artifact bfloat16 in place, or bfloat16 with float32 masters), but each
member's fitness is a seeded N(0, 1) draw (``seed31(run.seed, "null-fitness", iteration)``) instead of its
task reward. What the weights do is then the arithmetic's alone: drift, sparsity and localisation of a
z-scored Gaussian walk in the run's dtype. Beside a real run at the same horizon it tells what ES's
fitness adds; alone it reaches horizons (240 updates) that generation cannot afford on this machine (a
SmolLM2 member at 16 prompts x 24 tokens costs 2-8 s of generation; here an update costs the arithmetic).

- Reference and artifact arithmetic (``es.arithmetic = "reference"`` / ``"artifact"``) perturb and restore
  every member (their restore error is the point; artifact: each on its engine's replica, the replicas
  synced as in a real run), through the run's own ``ParamSet``; exact arithmetic restores bit for bit by construction (``tests/test_es.py``,
  ``tests/test_fused.py``), so its members are skipped: the weights are the same, an update is cheaper.
  The first iteration's first member is perturbed and restored anyway and checked bit for bit.
- The output is an ordinary ES run directory (``run.json`` says ``fitness = "null"``): ``evolm replay``
  rebuilds its weights, ``evolm analyze`` reads it, ``--resume`` continues it (also without weights).

  python experiments/refnum/null_walk.py experiments/refnum/smollm2-es-reference-bf16.toml --iterations 240
  python experiments/refnum/null_walk.py experiments/refnum/smollm2-es-artifact-bf16.toml --iterations 240
  python experiments/refnum/null_walk.py --resume runs/refnum/smollm2-es-reference-bf16-null
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import numpy as np
import torch

from evolm import config as config_mod
from evolm.es.population import LocalPopulation, MemberScores
from evolm.jobs import run_es
from evolm.runs import RunDir
from evolm.seeding import seed31

FITNESS = "null: seeded N(0,1) per member (seed31(run.seed, 'null-fitness', iteration)), no generation"


class NullFitnessPopulation(LocalPopulation):
    """Members scored by a seeded N(0, 1) draw; perturbed and restored only where restore is not exact."""

    def __init__(self, params, generator, task, seed: int, reference: bool):
        super().__init__(params, generator, task)
        self.seed, self.reference, self.checked = seed, reference, False

    def score(self, iteration, layout, sigma, examples, prompts, sampling, on_member=None) -> MemberScores:
        out = MemberScores(fitness=[])
        if self.reference:
            for direction, sign in layout:
                t0 = time.perf_counter()
                self.params.perturb(iteration, direction, sign, sigma)
                t1 = time.perf_counter()
                self.params.restore()
                out.seconds["perturb"] += t1 - t0
                out.seconds["restore"] += time.perf_counter() - t1
        elif not self.checked:  # exact restore, checked once on the run's own weights
            before = [t.clone() for t in self.params.tensors]
            self.params.perturb(iteration, *layout[0], sigma)
            self.params.restore()
            if not all(torch.equal(a, b) for a, b in zip(before, self.params.tensors)):
                raise RuntimeError("exact restore did not restore the weights bit for bit")
            self.checked = True
        rng = np.random.default_rng(seed31(self.seed, "null-fitness", iteration))
        out.fitness = [float(x) for x in rng.standard_normal(len(layout))]
        return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("config", nargs="?", help="a refnum ES config (experiments/refnum/*.toml)")
    ap.add_argument("--iterations", type=int, default=240)
    ap.add_argument("--out-dir", default="runs/refnum")
    ap.add_argument("--resume", metavar="RUN_DIR", help="continue this null run (to --iterations)")
    ap.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                    help="a config override, as evolm es --set (e.g. task.params.train_path=FILE)")
    args = ap.parse_args(argv)
    if (args.config is None) == (args.resume is None):
        ap.error("give a config or --resume RUN_DIR")
    source = Path(args.resume) / "config.toml" if args.resume else Path(args.config)
    cfg = config_mod.load(config_mod.ESJob, str(source), [f"es.iterations={args.iterations}", "eval.before_after=false", "probe.every=0",
                                        "distributed.workers=0", "run.progress=false"]
                          + ([] if args.resume else [f'run.out_dir="{args.out_dir}"']) + args.set)
    if not args.resume:
        cfg.run.name = f"{cfg.run.name}-null"
    reference = cfg.es.arithmetic in ("reference", "artifact")  # restore not exact: every member perturbed and restored
    factory = lambda cfg, params, generator, task: NullFitnessPopulation(params, generator, task, cfg.run.seed, reference)  # noqa: E731
    path = Path(args.resume) if args.resume else Path(cfg.run.out_dir) / cfg.run.name

    def mark(step, record):  # run.json says what the fitness was, from the first update on
        if step == 1 or args.resume:
            RunDir.open(path).update_info(fitness=FITNESS)

    run = run_es(cfg, resume=args.resume, population_factory=factory, callbacks=(mark,))
    print(f"wrote {run.path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
