"""One forward pass for many ES members: per-row low-rank perturbations applied by batched matmuls.

Inside ``with MemberForward(model, params).members(iteration, members, sigma):`` the model's batch
is read as M equal, contiguous blocks of rows, block m belonging to member m = (direction d, sign s),
and every module holding a selected parameter computes what it would compute with that member's
weights ``theta + s sigma E_d`` (``evolm.es.lowrank``), without changing a weight:

- ``nn.Linear`` weight W (out x in): ``y = x W^T + (s sigma / sqrt(r)) (x B_d) A_d^T`` per block,
  two ``bmm`` over the M blocks: ``[M, rows, in] @ [M, in, r]`` then ``@ [M, r, out]``;
- ``nn.Linear`` bias: ``y += s sigma eps_d`` per block;
- ``nn.Embedding`` table E: ``y[t] = E[t] + (s sigma / sqrt(r)) A_d[t] B_d^T`` (the factor rows of the
  looked-up tokens, gathered per block); with tied embeddings the LM head is an ``nn.Linear`` on the
  same tensor and gets the first formula with the same A_d, B_d, i.e. exactly ``(E + s sigma E_d)``;
- a leaf module with 1-D parameters (RMSNorm / LayerNorm weights and biases): the module itself runs
  under ``torch.func.vmap`` over the M blocks with per-member parameters ``theta + s sigma eps_d``
  (``functional_call``), so any such module works without knowing its formula.

Design decisions:

- Forward hooks, registered on entering ``members(...)`` and removed on leaving it (also on an
  exception): outside the block the model is the untouched module tree, bit for bit, and the base
  weights are shared by all rows (no per-member copy, no in-place perturbation). The low-rank term
  is added into the module's freshly computed output in place (``baddbmm_``): a separate
  ``y + delta`` costs a full extra pass over the output, which for the LM head (49k logits per row)
  was a third of its GEMM's time on the CPU.
- The factors of the block's members are stacked once per block (``[M, out, r]``, ``[M, r, in]``, a
  few MB for SmolLM2 at r = 4) in the module's dtype; the base GEMM is the model's own, the extra
  work per matrix is ``2 r (in + out)`` multiply-adds per token (~3% of the base at r = 4 for a
  576 x 576 projection).
- Rows must be member-major with the same number of rows per member (``evolm.backends.hf_members``
  lays them out so, including the shared-prefix KV cache, which is computed with one row per member);
  a batch whose size is not a multiple of M raises.
- Arithmetic: ``x W^T + a (x B) A^T`` is not bit-identical to ``x (W + a A B^T)^T``; the equivalence
  test bounds the logit difference against the member materialised as full weights (``ParamSet``
  perturb) and requires identical greedy and sampled text.
"""

from __future__ import annotations

import math
from contextlib import contextmanager
from dataclasses import dataclass, field

import torch

from evolm.es.lowrank import LowRankParamSet


@dataclass
class MemberBlock:
    """The stacked perturbation data of the members of one batched call."""

    count: int
    matrices: dict[int, tuple[torch.Tensor, torch.Tensor, torch.Tensor]] = field(default_factory=dict)
    """k -> (A [M, out, r], B^T [M, r, in], a [M, 1, 1] = sign sigma / sqrt(r)) in the module's dtype."""
    deltas: dict[int, torch.Tensor] = field(default_factory=dict)
    """k -> [M, numel] additive perturbation ``sign sigma eps`` (Linear biases)."""
    values: dict[int, torch.Tensor] = field(default_factory=dict)
    """k -> [M, *shape] perturbed parameter value ``theta + sign sigma eps`` (leaf-module vectors)."""
    inside: bool = False

    def blocks(self, x: torch.Tensor) -> int:
        if x.shape[0] % self.count:
            raise RuntimeError(f"a batch of {x.shape[0]} rows cannot be split into {self.count} member blocks")
        return x.shape[0] // self.count


class MemberForward:
    """Hooks a model so that a forward over member-major rows applies each row's member perturbation."""

    def __init__(self, model, params: LowRankParamSet):
        self.model = model
        self.params = params
        self._modules: dict[int, tuple[torch.nn.Module, list[tuple[int, str]]]] = {}
        for k, owners in enumerate(params.owners):
            for _, module, pname in owners:
                self._modules.setdefault(id(module), (module, []))[1].append((k, pname))

    @torch.no_grad()
    def block(self, iteration: int, members: list[tuple[int, int]], sigma: float) -> MemberBlock:
        """Stack the factors / vectors of ``members`` = [(direction, sign), ...] for one batched call."""
        p = self.params
        out = MemberBlock(count=len(members))
        root = math.sqrt(p.rank)
        for k in range(len(p.tensors)):
            dtype = p.tensors[k].dtype
            if p.is_matrix(k):
                pairs = [p.factors(k, iteration, d) for d, _ in members]
                a = torch.stack([pr[0] for pr in pairs]).to(dtype)
                b = torch.stack([pr[1].t() for pr in pairs]).to(dtype)  # [M, r, in]: 3-4x faster x @ B than [M, in, r]
                scale = torch.tensor([s * sigma / root for _, s in members], dtype=torch.float32, device=a.device)
                out.matrices[k] = (a, b, scale.to(dtype).view(-1, 1, 1))
                continue
            base = (p.masters[k] if p.masters is not None else p.tensors[k]).reshape(-1).float()
            deltas = torch.stack([p.vector(k, iteration, d).float() * float(s * sigma) for d, s in members])
            if self._is_bias(k):
                out.deltas[k] = deltas.to(dtype)
            else:
                out.values[k] = (base.unsqueeze(0) + deltas).to(dtype).view(len(members), *p.shapes[k])
        return out

    def _is_bias(self, k: int) -> bool:
        return any(isinstance(m, torch.nn.Linear) and pname == "bias" for _, m, pname in self.params.owners[k])

    @contextmanager
    def members(self, iteration: int, members: list[tuple[int, int]], sigma: float):
        """Within the block, forwards apply member m's perturbation to the m-th block of rows."""
        state = self.block(iteration, members, sigma)
        handles = []
        try:
            for module, terms in self._modules.values():
                handles.append(module.register_forward_hook(self._hook(module, terms, state)))
            yield state
        finally:
            for h in handles:
                h.remove()

    def _hook(self, module, terms, state: MemberBlock):
        if isinstance(module, torch.nn.Linear):
            weight = next((k for k, n in terms if n == "weight"), None)
            bias = next((k for k, n in terms if n == "bias"), None)

            def linear(mod, args, y):
                x = args[0]
                m = state.count
                state.blocks(x)
                blocks = y.view(m, -1, y.shape[-1])  # the module's fresh output, updated in place
                if weight is not None:
                    a, b, scale = state.matrices[weight]
                    t = torch.bmm(x.reshape(m, -1, x.shape[-1]), b.transpose(1, 2)).mul_(scale)  # [M, L, r]
                    blocks.baddbmm_(t, a.transpose(1, 2))
                if bias is not None:
                    blocks.add_(state.deltas[bias].unsqueeze(1))
                return y

            return linear
        if isinstance(module, torch.nn.Embedding):
            (k, _), = terms

            def embedding(mod, args, y):
                ids = args[0]
                m = state.count
                state.blocks(ids)
                a, b, scale = state.matrices[k]
                rows = torch.arange(m, device=ids.device).unsqueeze(1)
                gathered = a[rows, ids.reshape(m, -1)].mul_(scale)  # [M, L, r]
                y.view(m, -1, y.shape[-1]).baddbmm_(gathered, b)
                return y

            return embedding

        def vectors(mod, args, y):
            if state.inside:  # the vmapped call below runs this module again
                return None
            x, rest = args[0], args[1:]
            m = state.count
            per = state.blocks(x)
            values = {pname: state.values[k] for k, pname in terms}

            def one(p, xi):
                return torch.func.functional_call(mod, p, (xi, *rest))

            state.inside = True
            try:
                out = torch.func.vmap(one)(values, x.reshape(m, per, *x.shape[1:]))
            finally:
                state.inside = False
            return out.reshape(y.shape)

        return vectors
