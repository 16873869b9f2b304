"""Low-rank ES members as LoRA adapters of a vLLM engine: all members of an iteration in one engine call.

``LoRAPopulation`` is what ``es.perturbation = "lowrank"`` with ``generation.backend = "vllm"`` builds. A
low-rank member moves every selected weight matrix by ``s sigma A_d B_d^T / sqrt(r)`` (``es/lowrank.py``),
which is a rank-r LoRA adapter of that layer: ``lora_a = B_d^T``, ``lora_b = A_d s sigma / sqrt(r)``
(``lowrank.adapter_factors``). vLLM serves requests of different adapters in one batch (multi-LoRA; on CPU
through ``PunicaWrapperCPU``'s torch ops), so ``score`` registers the N members' adapters in the engine and
submits the N x prompts requests in one ``LLM.generate`` call.

Design decisions:

- The adapters are built inside the workers (``ESWorkerExtension.es_lora_members``) from the same keyed
  noise the HF low-rank path draws (``LowRankParamSet.from_tensors`` over the engine's views, the driver's
  indices and noise description): only ``(iteration, members, sigma)`` crosses the process boundary, no
  adapter is written to disk, and the factors are bit for bit the HF path's (tested). They are added to
  vLLM's adapter manager directly (vLLM packs q/k/v and gate/up as its own loader does); the requests name
  them by id, which vLLM finds registered and never loads from the placeholder path.
- Adapters are replaced, not accumulated: every ``score`` call first removes the previous call's adapters
  and reuses ids 1..N, so vLLM's LoRA cache holds at most N adapters (tested across updates); ``close``
  removes them. Names are unique per member key (they enter vLLM's prefix-cache hashes), and the prefix
  cache is reset after registering, as after every weight change.
- Only projection matrices vLLM wraps for LoRA can be perturbed: ``es.params`` must select attention and
  MLP weights only (validated in ``config``; any other selected tensor is refused here, by name). Norms,
  biases, embeddings and the LM head have no per-request adapter in vLLM 0.32 (the embedding's LoRA would
  leave a tied LM head unperturbed), so a LoRA population is the HF low-rank method restricted to
  ``es.params = ["attention", "mlp"]``; an HF low-rank run with that selection draws the same members.
- The update ``W += scale sum_d c_d A_d B_d^T / sqrt(r)`` is applied to the base weights inside the engine
  (``EngineParamSet.apply_update`` -> the worker's ``LowRankParamSet``: one float32 GEMM per matrix, into
  the float32 masters when the engine runs bf16), and queued for the driver's HF copy as with full-rank
  vLLM members; the updated weights equal an HF low-rank run's bit for bit (tested).
- What is not bit-identical: the forward pass. vLLM computes ``x W^T + ((x lora_a^T) lora_b^T)`` with its
  own kernels, as the HF path's batched forward computes ``x W^T + s ((x B) A^T)`` with its own; neither is
  the member materialised as dense weights. Greedy completions agree up to near-ties (tested, with a
  tolerance like ``tests/test_vllm.py``'s). Sampled decoding uses vLLM's seeded per-request sampler with the
  same seed for every member (as full-rank vLLM members), not the HF low-rank path's shared-uniform sampler.

Timing fields in ``MemberScores.seconds``: ``perturb`` is registering the adapters, ``generate`` the engine
call, ``restore`` 0 (nothing to undo: the base weights are never written while scoring).
"""

from __future__ import annotations

import time
from typing import Callable

from evolm.backends.base import Generator, SamplingParams
from evolm.es.population import LocalPopulation, MemberScores
from evolm.tasks.base import Example, Task


class LoRAPopulation(LocalPopulation):
    """Scores low-rank ES members as LoRA adapters of one vLLM engine, all N in one engine call."""

    def __init__(self, params, generator: Generator, task: Task, member_batch: int = 0):
        from evolm.errors import ConfigError

        if not getattr(generator, "lora_slots", 0):
            raise ConfigError(f"es.perturbation='lowrank' on vLLM needs an engine started with LoRA; "
                              f"generation.backend gives a {type(generator).__name__} without it")
        super().__init__(params, generator, task)
        self.member_batch = int(member_batch)
        targets = generator.rpc("es_lora_targets")[0]
        cannot = [name for name, where in targets.items() if where is None]
        if cannot:
            raise ConfigError(f"es.perturbation='lowrank' on vLLM perturbs through LoRA adapters, which cannot carry "
                              f"{cannot[0]} ({len(cannot)} selected tensors in all); set es.params=['attention','mlp'] "
                              f"(projection matrices only) or generation.backend='hf'")

    def score(self, iteration: int, layout: list[tuple[int, int]], sigma: float, examples: list[Example],
              prompts: list[str], sampling: SamplingParams, on_member: Callable[[], None] | None = None) -> MemberScores:
        out = MemberScores(fitness=[])
        per_call = self.member_batch or len(layout)
        for start in range(0, len(layout), per_call):
            block = layout[start:start + per_call]
            t0 = time.perf_counter()
            adapters = self.generator.register_members(iteration, block, sigma)
            t1 = time.perf_counter()
            results = self.generator.generate_members(prompts, sampling, adapters)
            out.seconds["perturb"] += t1 - t0
            out.seconds["generate"] += time.perf_counter() - t1
            for j, completions in enumerate(results):
                out.add(start + j, self.task, examples, completions, prompts)
                if on_member:
                    on_member()
        return out

    def close(self) -> None:
        """Remove this population's adapters from the engine (the engine itself belongs to the job)."""
        if getattr(self.generator, "llm", None) is not None:
            self.generator.clear_members()
