"""Ask/tell ES for users with their own generation and scoring loop (evosax's interface, evolm's numerics).

    es = AskTell(model, population=8, sigma=1e-3, lr=5e-4, seed=0)
    for _ in range(iterations):
        fitness = []
        for member in es.ask():
            with member:                      # the model's weights are theta + sign * sigma * eps inside
                fitness.append(my_score(model))
        es.tell(fitness)                      # theta += scale * sum_d c_d eps_d (float32), logged
    es.seed_log                               # replayable: es_engine.replay(base_model, es.seed_log, es.job)

Design decisions:

- Nothing of its own: the ``ParamSet`` (selection, exact restore, float32 masters for lower-precision
  models, the non-finite guard), the noise, the member layout and ``compute_update`` are the engine's,
  built from the same config (``config.ESJob``, any ``es.*`` field through ``overrides``), so a member
  here is bit for bit the member ``evolm es`` scores with the same seed and settings, and the seed log
  replays with ``evolm.es.engine.replay`` (tested against a run of the engine).
- A member perturbs on ``__enter__`` and restores exactly on ``__exit__`` (also when the body raises);
  only one member may be active at a time, and ``tell`` refuses while one is.
- ``tell`` takes one fitness per member of the last ``ask`` in order; a non-finite fitness skips the
  update (as in the engine) and is logged as skipped.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

from evolm import config as config_mod
from evolm.errors import UserError
from evolm.es.engine import build_paramset, float32_copy, run_header
from evolm.es.update import Update, compute_update, member_layout


@dataclass
class Member:
    """One perturbed model of an iteration: ``with member:`` puts theta + sign * sigma * eps_direction in place."""

    index: int
    iteration: int
    direction: int
    sign: int
    _owner: "AskTell"

    def __enter__(self) -> "Member":
        self._owner._enter(self)
        return self

    def __exit__(self, *exc) -> None:
        self._owner._exit(self)


class AskTell:
    """ES as ask (the iteration's members) and tell (their fitnesses); see the module docstring."""

    def __init__(self, model, *, population: int = 8, sigma: float = 1e-3, lr: float = 5e-4, seed: int = 0,
                 estimator: str = "one_point", shaping: str = "zscore", overrides: Sequence[str] = ()):
        sets = [f"es.population={population}", f"es.sigma={sigma!r}", f"es.lr={lr!r}", f"run.seed={seed}",
                f"es.estimator='{estimator}'", f"es.shaping='{shaping}'", *overrides]
        self.job = config_mod.from_dict(config_mod.ESJob, {}, sets)
        if self.job.es.perturbation != "full":
            raise UserError("AskTell perturbs one member at a time in place: es.perturbation must be 'full'")
        if self.job.es.arithmetic != "exact":
            raise UserError(f"AskTell's seed log replays updates only; es.arithmetic='{self.job.es.arithmetic}' (whose weights "
                            "depend on every perturb/restore) runs through evolm es: set es.arithmetic='exact'")
        self.model = model
        self.params = build_paramset(model, self.job)
        self.layout = member_layout(self.job.es.estimator, self.job.es.population)
        self.iteration = 0
        self.seed_log: list[dict] = [run_header(self.params, self.job, self.layout)]
        self._asked: list[Member] = []
        self._active: Member | None = None

    def ask(self) -> list[Member]:
        """The members of the current iteration, in the order ``tell`` expects their fitnesses."""
        self._asked = [Member(i, self.iteration, d, s, self) for i, (d, s) in enumerate(self.layout)]
        return list(self._asked)

    def _enter(self, member: Member) -> None:
        if self._active is not None:
            raise UserError(f"member {self._active.index} is still in place; leave its `with` block first")
        if member.iteration != self.iteration:
            raise UserError(f"member of iteration {member.iteration}, but the strategy is at iteration {self.iteration}")
        self.params.perturb(member.iteration, member.direction, member.sign, self.job.es.sigma)
        self._active = member

    def _exit(self, member: Member) -> None:
        if self._active is member:
            self.params.restore()
            self._active = None

    def tell(self, fitness: Sequence[float]) -> Update:
        """Apply the update of the asked members' ``fitness``; returns it (status applied, zero or skipped)."""
        if self._active is not None:
            raise UserError(f"member {self._active.index} is still in place; leave its `with` block before tell()")
        if len(fitness) != len(self.layout) or not self._asked:
            raise UserError(f"tell() takes one fitness per member of the last ask() ({len(self.layout)}), got {len(fitness)}")
        es = self.job.es
        fitness = [float(f) for f in fitness]
        update = compute_update(fitness, estimator=es.estimator, shaping=es.shaping, lr=es.lr, sigma=es.sigma,
                                divide_by_sigma=es.divide_by_sigma)
        if update.applies and not self.params.apply_update(self.iteration, update.coefficients, update.scale):
            update = update.skipped("the update would have made weights non-finite; update skipped")
        self.iteration += 1
        self.seed_log.append({"step": self.iteration, "iteration": self.iteration - 1, "coefficients": update.coefficients,
                              "scale": update.scale, "status": update.status, "fitness": fitness})
        self._asked = []
        return update

    def float32_model(self):
        """The model with its float32 master weights (a lower-precision model's masters; the model itself in float32)."""
        return float32_copy(self.model, self.params)
