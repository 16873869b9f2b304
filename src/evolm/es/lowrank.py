"""Low-rank ES perturbations (EGGROLL, "Evolution Strategies at the Hyperscale", arXiv 2511.16652).

With ``es.perturbation = "lowrank"`` member (direction d, sign s) moves every selected parameter by
``s * sigma * E_d`` where, instead of a dense Gaussian matrix, E_d is

- for a weight matrix W (out x in; an ``nn.Linear`` weight or an ``nn.Embedding`` table):
  ``E_d = A_d B_d^T / sqrt(r)`` with A_d (out x r) and B_d (in x r) standard normal. Each entry of
  E_d has mean 0 and variance 1, as a full-rank entry does, so sigma and lr mean the same thing in
  both kinds; an embedding row t moves by ``A_d[t] B_d^T / sqrt(r)``, and a tied LM head (SmolLM2's)
  is the same tensor and sees the same perturbation;
- for a vector (norm weights, biases): the full-rank Gaussian vector, exactly as ``perturbation = "full"``.

The update is the ES update on those directions, ``theta += scale * sum_d c_d E_d``: for a matrix
``Delta W = scale * sum_d c_d A_d B_d^T / sqrt(r)``, of rank <= D r.

Design decisions:

- Same key derivation as the full-rank noise: the factors of parameter p for (iteration, direction)
  are ONE draw of ``(out + in) * r`` values from the run's noise source (``table`` or ``stream``) at
  the key ``(iteration, direction, p)``, split into A (first out*r values, row-major) and B. The
  source's parameter layout is the layout of these draws (``draw_layout``), so with the table one
  member's factors for all parameters are one contiguous stretch of it and no value is used twice
  (the member scheme of ``es/noise.py``; the default table is the draws plus 2^25 entries). A
  low-rank run is therefore as reproducible and replayable as a full-rank one; antithetic pairs
  share the direction and so share A_d, B_d with opposite signs.
- ``LowRankNoise`` wraps the run's noise source. ``factors(...)`` gives (A, B); ``direction(...)`` —
  the call every full-rank consumer makes — gives the dense E_d, flattened. So ``LowRankParamSet``
  inherits ``ParamSet``'s in-place perturb / bit-exact restore unchanged: a member materialised as
  full weights ``W + s sigma A B^T / sqrt(r)``. That is the reference the batched forward
  (``evolm.es.member_forward``) is tested against, and what ``evolm.es.measure`` (diversity,
  update variance) uses on a low-rank run's config.
- ``LowRankParamSet``'s update (``_add_update``, called by ``ParamSet.apply_update``) does not materialise D dense directions: per matrix it is one
  float32 GEMM ``[A_1 c_1, ..., A_D c_D] / sqrt(r) @ [B_1, ..., B_D]^T`` over row blocks, scaled,
  then added (``mul`` then ``add``, no fused multiply-add); vectors accumulate ``sum_d c_d eps_d``
  in float32 like the full-rank update. The order of operations is fixed, so replaying a seed log
  reproduces the weights bit for bit on the same software stack and thread count.
- Only parameters the batched forward can apply per row are accepted: ``nn.Linear`` / ``nn.Embedding``
  weights, ``nn.Linear`` biases and 1-D parameters of leaf modules (norms). Anything else is a
  ``ConfigError`` naming the parameter and the fix (``es.params`` / ``es.param_regex`` / ``full``).
"""

from __future__ import annotations

import math

import torch

from evolm.errors import ConfigError
from evolm.es.noise import NoiseSource
from evolm.es.params import CHUNK, ParamSet, select_parameters


def draw_size(shape: tuple[int, ...], rank: int) -> int:
    """Noise values one member needs for a parameter of ``shape``: (out + in) r for a matrix, numel otherwise."""
    return (shape[0] + shape[1]) * rank if len(shape) == 2 else math.prod(shape)


def split_factors(raw: torch.Tensor, out: int, inner: int, rank: int) -> tuple[torch.Tensor, torch.Tensor]:
    """``(A, B)`` views of one draw: A = raw[:out r] as (out, r), B = raw[out r:] as (in, r)."""
    return raw[:out * rank].view(out, rank), raw[out * rank:(out + inner) * rank].view(inner, rank)


def dense_direction(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """``A B^T / sqrt(r)`` in float32 (out x in)."""
    rank = a.shape[1]
    return torch.mm(a.float(), b.float().t()).div_(math.sqrt(rank))


def member_scale(sign: int, sigma: float, rank: int) -> torch.Tensor:
    """``sign * sigma / sqrt(r)`` as the float32 scalar the batched HF forward multiplies ``x B`` by
    (``evolm.es.member_forward``) and a LoRA adapter folds into its B matrix (``adapter_factors``)."""
    return torch.tensor(sign * sigma / math.sqrt(rank), dtype=torch.float32)


def adapter_factors(a: torch.Tensor, b: torch.Tensor, sign: int, sigma: float) -> tuple[torch.Tensor, torch.Tensor]:
    """A member's perturbation of one matrix as a LoRA adapter's ``(lora_a, lora_b)`` (PEFT/vLLM layout:
    ``delta W = lora_b @ lora_a``): ``lora_a = B^T`` (r x in, the factor itself) and
    ``lora_b = A * (sign sigma / sqrt(r))`` (out x r, one float32 product per entry), so that
    ``lora_b @ lora_a = s sigma A B^T / sqrt(r)``, the member's ``E_d`` times ``s sigma``."""
    scale = member_scale(sign, sigma, a.shape[1]).to(a.device)
    return b.float().t().contiguous(), a.float().mul(scale)


class LowRankNoise(NoiseSource):
    """Low-rank directions over a base noise source (``table`` or ``stream``), keyed like full-rank noise."""

    kind = "lowrank"

    def __init__(self, base: NoiseSource, shapes: dict[int, tuple[int, ...]], rank: int):
        if rank < 1:
            raise ValueError("rank must be >= 1")
        self.base = base
        self.shapes = {int(k): tuple(int(x) for x in v) for k, v in shapes.items()}
        self.rank = int(rank)

    def is_matrix(self, param_index: int) -> bool:
        return len(self.shapes[param_index]) == 2

    def factors(self, iteration: int, direction: int, param_index: int) -> tuple[torch.Tensor, torch.Tensor]:
        """A (out x r) and B (in x r) of a matrix parameter (views into the base noise when it is a table)."""
        out, inner = self.shapes[param_index]
        raw = self.base.direction(iteration, direction, param_index, (out + inner) * self.rank)
        return split_factors(raw, out, inner, self.rank)

    def vector(self, iteration: int, direction: int, param_index: int) -> torch.Tensor:
        """The full-rank noise of a vector parameter (flat)."""
        return self.base.direction(iteration, direction, param_index, math.prod(self.shapes[param_index]))

    def direction(self, iteration: int, direction: int, param_index: int, numel: int) -> torch.Tensor:
        """E_d of the parameter, flat: dense ``A B^T / sqrt(r)`` for a matrix, the noise itself for a vector."""
        if math.prod(self.shapes[param_index]) != numel:
            raise ValueError(f"parameter {param_index} has {math.prod(self.shapes[param_index])} elements, not {numel}")
        if not self.is_matrix(param_index):
            return self.vector(iteration, direction, param_index)
        return dense_direction(*self.factors(iteration, direction, param_index)).view(-1)

    def describe(self) -> dict:
        return {"kind": self.kind, "rank": self.rank, "base": self.base.describe()}

    def to(self, device) -> "LowRankNoise":
        self.base = self.base.to(device)
        return self


def _owners(model, parameter: torch.nn.Parameter) -> list[tuple[str, torch.nn.Module, str]]:
    """``(module name, module, attribute)`` of every module that holds ``parameter`` directly."""
    found = []
    for mname, module in model.named_modules():
        for pname, p in module._parameters.items():
            if p is parameter:
                found.append((mname, module, pname))
    return found


def _check_batchable(name: str, shape: tuple[int, ...], owners) -> None:
    fix = "restrict es.params / es.param_regex to exclude it, or use es.perturbation='full'"
    for mname, module, pname in owners:
        kind = type(module).__name__
        if len(shape) == 2:
            if isinstance(module, torch.nn.Linear) and pname == "weight":
                continue
            if isinstance(module, torch.nn.Embedding) and pname == "weight":
                if module.max_norm is not None:
                    raise ConfigError(f"es.perturbation='lowrank' cannot perturb {name}: its embedding renormalises rows (max_norm); {fix}")
                continue
            raise ConfigError(f"es.perturbation='lowrank' perturbs matrices of nn.Linear and nn.Embedding only; {name} belongs to a {kind}; {fix}")
        elif len(shape) == 1:
            if isinstance(module, torch.nn.Linear) and pname == "bias":
                continue
            if isinstance(module, (torch.nn.Linear, torch.nn.Embedding)) or any(True for _ in module.children()):
                raise ConfigError(f"es.perturbation='lowrank' cannot batch {name} (a 1-D parameter of a {kind} with submodules); {fix}")
        else:
            raise ConfigError(f"es.perturbation='lowrank' handles matrices and vectors; {name} has shape {list(shape)}; {fix}")


class LowRankParamSet(ParamSet):
    """``ParamSet`` whose directions are low-rank for matrices; batched-forward metadata; GEMM update."""

    def __init__(self, model, noise: NoiseSource | None, categories=("all",), regex: str = "", rank: int = 4,
                 *, masters_elsewhere: bool = False):
        super().__init__(model, noise, categories, regex, masters_elsewhere=masters_elsewhere)
        self.rank = int(rank)
        self.shapes = [tuple(t.shape) for t in self.tensors]
        self.owners = []
        for (_, name, p), shape in zip(select_parameters(model, categories, regex), self.shapes):
            owners = _owners(model, p)
            _check_batchable(name, shape, owners)
            self.owners.append(owners)

    @classmethod
    def from_tensors(cls, noise: NoiseSource, indices: list[int], names: list[str], tensors: list[torch.Tensor],
                     rank: int = 4) -> "LowRankParamSet":
        """A low-rank ParamSet over tensors chosen by the caller (a vLLM engine's views, ``evolm.es.vllm_worker``):
        same indices and noise, so the same factors, members and updates as over the Hugging Face model.
        It has no module owners: the batched HF forward cannot run on it (the engine's LoRA adapters do)."""
        self = super().from_tensors(noise, indices, names, tensors)
        self.rank = int(rank)
        self.shapes = [tuple(t.shape) for t in self.tensors]
        self.owners = []
        return self

    @property
    def draw_layout(self) -> list[tuple[int, int]]:
        """``(noise index, values drawn per member)`` of every selected tensor: the noise source's layout."""
        return [(i, draw_size(s, self.rank)) for i, s in zip(self.indices, self.shapes)]

    @property
    def noise_numel(self) -> int:
        """Noise values one member draws: (out + in) r per matrix, numel per vector."""
        return sum(n for _, n in self.draw_layout)

    def is_matrix(self, k: int) -> bool:
        return len(self.shapes[k]) == 2

    def factors(self, k: int, iteration: int, direction: int) -> tuple[torch.Tensor, torch.Tensor]:
        return self.noise.factors(iteration, direction, self.indices[k])

    def vector(self, k: int, iteration: int, direction: int) -> torch.Tensor:
        return self.noise.vector(iteration, direction, self.indices[k])

    # apply_update is ParamSet's (refuses non-finite scales and coefficients, then a check pass, then the
    # write); only the bound and the arithmetic of the update differ here.

    def _provably_finite(self, coefficients: list[float], scale: float) -> bool:
        """No cheap bound for ``|A B^T|``: always run the check pass (the GEMMs twice; the update is ~2% of
        an iteration)."""
        return False

    def update_bound(self, coefficients, scale: float) -> float:
        """No cheap bound for ``|A B^T|`` (the noise's largest value bounds neither factor's product): infinite,
        so the driver of Ray actors waits for every low-rank update's answers (``RayPopulation.apply_update``)."""
        return math.inf

    @torch.no_grad()
    def _add_update(self, iteration: int, coefficients: list[float], scale: float, write: bool) -> bool:
        """``theta += scale * sum_d c_d E_d`` (``write``): one float32 GEMM per matrix (rank <= D r),
        float32 sums for vectors; or only check that every new value would be finite (False if not)."""
        active = [(d, c) for d, c in enumerate(coefficients) if c != 0.0]
        root = math.sqrt(self.rank)
        for k, live in enumerate(self.tensors):
            target = self.masters[k] if self.masters is not None else live
            chunks = []
            if active and self.is_matrix(k):
                pairs = [self.factors(k, iteration, d) for d, _ in active]
                a = torch.cat([p[0].float() * (c / root) for p, (_, c) in zip(pairs, active)], dim=1)  # out x D r
                b = torch.cat([p[1].float() for p in pairs], dim=1)  # in x D r
                rows = max(1, CHUNK // target.shape[1])
                chunks = ((target[i:i + rows], torch.mm(a[i:i + rows], b.t())) for i in range(0, target.shape[0], rows))
            elif active:
                flat = target.view(-1)
                noises = [(c, self.vector(k, iteration, d)) for d, c in active]

                def sums(flat=flat, noises=noises):
                    for i in range(0, flat.numel(), CHUNK):
                        acc = torch.zeros(min(CHUNK, flat.numel() - i), dtype=torch.float32, device=flat.device)
                        for c, eps in noises:
                            acc.add_(eps[i:i + CHUNK].float().mul(c))
                        yield flat[i:i + CHUNK], acc
                chunks = sums()
            for part, delta in chunks:
                delta.mul_(scale)
                if write:
                    part.add_(delta)
                    continue
                new = part + delta
                if not bool(torch.isfinite(new).all()) or not bool(torch.isfinite(new.to(live.dtype)).all()):
                    return False
            if write and self.masters is not None:
                live.copy_(self.masters[k].view_as(live))
        return True
