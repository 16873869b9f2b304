"""Populations: who scores the ES members of an iteration and applies the update to the weights.

A population has two calls, the seam where scale lives:

- ``score(iteration, layout, sigma, examples, prompts, sampling, on_member)`` -> ``MemberScores``: the
  fitness of every member ``(direction, sign)`` of ``layout`` (mean task reward over the iteration's
  prompts), in layout order, with cost counters;
- ``apply_update(iteration, update)``: add ``update.scale * sum_d c_d eps_d`` to the weights; returns
  the update as applied (marked skipped when ``ParamSet`` refused it because a weight would have
  become non-finite; a population returning None is taken to have applied it).

Members are pure functions of ``(run seed, iteration, direction, sign)``, so the result must not depend
on which process, backend or machine scored them. ``LocalPopulation`` scores them one after another
in this process: perturb (``ParamSet``), generate with the iteration's shared sampling seed, restore
bit for bit, score.

Design decisions:

- A reward function that raises gives the member a NaN fitness and its message
  (``score_completions``); ``compute_update`` then skips the update, so a broken reward never reaches
  the weights and never takes the run down.
- ``generator.sync_weights()`` follows every change of the weights, for backends that keep their own
  copy (the HF backend shares the tensors and does nothing).
- ``verify`` (``generation.verify``, HF backend, greedy): the centre's completions are decoded once per
  iteration with the centre weights, BEFORE the first member is perturbed, and every member is then
  verified against them (``backends/hf_verify.py``: one teacher-forced forward, decoding only from the
  first token where the member's argmax differs). The members' completions are their greedy ones (up
  to the floating-point caveat in that module's docstring), so fitness, the update and the seed log
  keep their meaning; ``gen_sequences`` / ``gen_tokens`` count the members' completions as without
  verification (the centre's decode is not counted: budgets stay comparable with plain runs). The
  acceptance profile is logged per update only while verification is on (computing it needs the
  centre's completions, an extra decode): ``verify_identical`` (fraction of the members' completions
  token for token the centre's), ``verify_prefix`` (mean over them of the shared-prefix fraction:
  leading tokens equal to the centre's / the centre's tokens), ``verify_decode_steps`` (sequential
  forward passes, the centre's included). ``"auto"`` turns verification off for the rest of the run
  once an update's ``verify_prefix`` is below ``AUTO_MIN_PREFIX`` (logged as ``verify_auto_off``; a
  resumed run reads it back from metrics.jsonl, so resuming does not switch it on again).
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Callable

import numpy as np

from evolm.backends.base import Generator, SamplingParams
from evolm.es.params import ParamSet
from evolm.es.update import Update
from evolm.tasks.base import Example, Task


AUTO_MIN_PREFIX = 0.5
"""``generation.verify = "auto"``: below this mean shared-prefix fraction the continuation decodes more
than half of every completion anyway, on top of the teacher-forced forward and the centre's decode,
so verification cannot pay; auto turns it off."""

NON_FINITE_WEIGHTS = "the update would have made weights non-finite (inf or NaN); update skipped, weights unchanged"


@dataclass
class MemberScores:
    fitness: list[float]
    errors: dict[int, str] = field(default_factory=dict)
    seconds: dict[str, float] = field(default_factory=lambda: {"generate": 0.0, "perturb": 0.0, "restore": 0.0})
    gen_sequences: int = 0
    gen_tokens: int = 0
    extra: dict = field(default_factory=dict)
    """Population-specific counters logged with the update (a Ray population: actors, restarts)."""
    unscored: list[int] = field(default_factory=list)
    """Members none of whose completions any reward function scored (each returned None: fitness 0)."""

    def add(self, member: int, task: Task, examples: list[Example], completions, prompts: list[str] | None = None) -> None:
        """Record member ``member``'s fitness (``score_completions``), its reward error if any, whether any of its
        completions was scored, and what it generated."""
        fitness, error, scored = score_completions(task, examples, completions, prompts)
        self.fitness.append(fitness)
        if error:
            self.errors[member] = error
        if not scored:
            self.unscored.append(member)
        self.gen_sequences += sum(len(c) for c in completions)
        self.gen_tokens += sum(x.num_tokens for c in completions for x in c)


def score_completions(task: Task, examples: list[Example], completions, prompts: list[str] | None = None
                      ) -> tuple[float, str | None, bool]:
    """``(fitness, error, scored)``: the mean reward over all completions of all examples (``task.score``: one
    batched call of the reward functions, if any; a completion no function scored counts 0); a reward that
    raises gives NaN and its message; ``scored``: whether any completion got a number from a reward function."""
    rows = [(ex, c.text, None if prompts is None else prompts[i]) for i, (ex, outs) in enumerate(zip(examples, completions))
            for c in outs]
    try:
        rewards = task.score([r[0] for r in rows], [r[1] for r in rows], None if prompts is None else [r[2] for r in rows],
                             unscored=None)
    except Exception as e:  # a broken reward must not take the run down or reach the weights
        return float("nan"), f"{type(e).__name__}: {e}", True
    scored = any(r is not None for r in rewards) or not rewards
    rewards = [0.0 if r is None else r for r in rewards]
    return (float(np.mean(rewards)) if rewards else float("nan")), None, scored


class LocalPopulation:
    """Scores ES members one after another on this process's model."""

    def __init__(self, params: ParamSet, generator: Generator, task: Task, verify: str = "off"):
        self.params = params
        self.generator = generator
        self.task = task
        self.verify = verify
        """off | on | auto (``generation.verify``); auto becomes off once acceptance is too low."""
        self.verifier = None
        if verify != "off":
            from evolm.backends.hf import HFGenerator
            from evolm.backends.hf_verify import HFVerifier
            from evolm.errors import ConfigError

            if not isinstance(generator, HFGenerator):
                raise ConfigError(f"generation.verify='{verify}' verifies members with the hf backend; "
                                  f"generation.backend gives a {type(generator).__name__} (set generation.verify='off')")
            self.verifier = HFVerifier(generator)

    def resume_from(self, metrics: list[dict]) -> None:
        """Continue a run: an ``auto`` verification that turned itself off stays off."""
        if self.verify == "auto" and any(r.get("verify_auto_off") for r in metrics):
            self.verify = "off"

    def score(self, iteration: int, layout: list[tuple[int, int]], sigma: float, examples: list[Example],
              prompts: list[str], sampling: SamplingParams, on_member: Callable[[], None] | None = None) -> MemberScores:
        out = MemberScores(fitness=[])
        centre = stats = None
        if self.verify != "off":  # the centre's completions, with the centre weights, before any member is perturbed
            from evolm.backends.hf_verify import VerifyStats

            t0 = time.perf_counter()
            centre = self.verifier.centre(prompts, sampling)
            out.seconds["generate"] += time.perf_counter() - t0
            stats = VerifyStats(decode_steps=centre.decode_steps)
            out.extra["seconds_verify_centre"] = time.perf_counter() - t0
        for m, (direction, sign) in enumerate(layout):
            t0 = time.perf_counter()
            self.params.perturb(iteration, direction, sign, sigma)
            self.generator.sync_weights()
            t1 = time.perf_counter()
            if centre is not None:
                completions, member_stats = self.verifier.generate(centre, sampling)
                stats.add(member_stats)
            else:
                completions = self.generator.generate(prompts, sampling)
            t2 = time.perf_counter()
            self.params.restore()
            self.generator.sync_weights()
            t3 = time.perf_counter()
            out.add(m, self.task, examples, completions, prompts)
            out.seconds["perturb"] += t1 - t0
            out.seconds["generate"] += t2 - t1
            out.seconds["restore"] += t3 - t2
            if on_member:
                on_member()
        if stats is not None:
            out.extra.update(verify_identical=stats.identical_fraction, verify_prefix=stats.prefix_fraction,
                             verify_decode_steps=stats.decode_steps)
            if self.verify == "auto" and stats.prefix_fraction < AUTO_MIN_PREFIX:
                self.verify = "off"
                out.extra["verify_auto_off"] = True
        return out

    def apply_update(self, iteration: int, update: Update) -> Update:
        """Apply ``update`` if it applies; returns it, or it marked skipped when the weights refused it."""
        if update.applies:
            if not self.params.apply_update(iteration, update.coefficients, update.scale):
                return update.skipped(NON_FINITE_WEIGHTS)
            self.generator.sync_weights()
        return update

    def sync(self) -> None:
        """Make the model this process holds current before it is read (checkpoint, probe, centre evaluation,
        the end): a ParamSet mirroring an engine's weights applies the updates it deferred."""
        self.params.catch_up()

    def checkpointed(self, directory, step: int) -> None:
        """The driver saved a checkpoint of the current weights (a Ray population restarts actors from it;
        the members of an in-process population live here: nothing to do)."""

    def close(self) -> None:
        """Release what the population holds (nothing for a population in this process)."""
