"""The low-rank ES population: all members of an iteration scored in batched forward passes.

``LowRankPopulation`` is a ``LocalPopulation`` (same ``apply_update``, ``checkpointed``, ``close``) with
its own ``score``, and the engine picks it with ``es.perturbation = "lowrank"``. ``score``
splits the member layout into blocks of ``es.member_batch`` members (0: all N in one block), and for
each block runs ONE ``generate`` per prompt batch over (members x prompts) rows
(``evolm.backends.hf_members``) with the block's perturbations applied per row by hooks
(``evolm.es.member_forward``); the weights are never written while scoring. ``apply_update`` is
``LowRankParamSet.apply_update`` (one float32 GEMM per matrix).

Timing fields in ``MemberScores.seconds``: ``perturb`` is stacking the block's factors and
registering the hooks, ``generate`` the batched generation, ``restore`` removing the hooks (~0).
"""

from __future__ import annotations

import time
from typing import Callable

from evolm.backends.base import Generator, SamplingParams
from evolm.es.population import LocalPopulation, MemberScores
from evolm.es.lowrank import LowRankParamSet
from evolm.es.member_forward import MemberForward
from evolm.tasks.base import Example, Task


class LowRankPopulation(LocalPopulation):
    """Scores ES members in batched forward passes over member-major rows (HF backend)."""

    def __init__(self, params: LowRankParamSet, generator: Generator, task: Task, member_batch: int = 0):
        from evolm.backends.hf import HFGenerator
        from evolm.backends.hf_members import HFMemberGenerator
        from evolm.errors import ConfigError

        if not isinstance(generator, HFGenerator):
            raise ConfigError(f"es.perturbation='lowrank' batches members through the hf backend; "
                              f"generation.backend gives a {type(generator).__name__} (set generation.backend='hf' or es.perturbation='full')")
        super().__init__(params, generator, task)
        self.member_batch = int(member_batch)
        self.forward = MemberForward(generator.model, params)
        self.batched = HFMemberGenerator(generator)

    def score(self, iteration: int, layout: list[tuple[int, int]], sigma: float, examples: list[Example],
              prompts: list[str], sampling: SamplingParams, on_member: Callable[[], None] | None = None) -> MemberScores:
        out = MemberScores(fitness=[])
        per_call = self.member_batch or len(layout)
        for start in range(0, len(layout), per_call):
            block = layout[start:start + per_call]
            t0 = time.perf_counter()
            with self.forward.members(iteration, block, sigma):
                t1 = time.perf_counter()
                results = self.batched.generate(prompts, sampling, len(block))
                t2 = time.perf_counter()
            t3 = time.perf_counter()
            out.seconds["perturb"] += t1 - t0
            out.seconds["generate"] += t2 - t1
            out.seconds["restore"] += t3 - t2
            for j, completions in enumerate(results):
                out.add(start + j, self.task, examples, completions, prompts)
                if on_member:
                    on_member()
        return out
