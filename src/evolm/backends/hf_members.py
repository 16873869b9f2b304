"""Generation for several ES members in one Hugging Face ``generate`` call (member-major rows).

``HFMemberGenerator(generator).generate(prompts, params, members=M)`` runs, per batch of prompts,
ONE ``generate`` over ``M x len(batch)`` rows: rows ``[m * P, (m + 1) * P)`` are member m's copy of
the P prompts. It does not know what a member is: the caller makes the model apply member m's
weights to block m (``evolm.es.member_forward``) around the call, or passes ``members=1`` to a plain
model (the reference the batched path is tested against).

Design decisions:

- The shared prompt prefix (``HFGenerator``'s KV-cache reuse) is run with one row per member (M rows,
  so each member's prefix cache comes from its own weights) and repeated over that member's P rows.
- Greedy decoding is ``HFGenerator``'s own. Sampling cannot reuse its ``torch.multinomial`` stream:
  that stream is consumed across all rows of a call, so member m's row p would see different random
  numbers in an M-member call than in a call of its own. Instead ``SharedUniformSampler`` draws one
  uniform u[p, t] per (prompt row p, step t) from the call's seed and picks the token by inverse CDF
  of the row's distribution (after temperature and top-p) at u[p, t]. Every member's copy of prompt
  p uses the same u[p, t]: common random numbers in the strongest sense (members whose next-token
  distributions agree pick the same token), and a member's completions are the same whether it is
  generated alone or among M members (up to the floating-point differences of the batched matmuls).
  Sampled low-rank members are therefore not the completions ``HFGenerator`` would sample with the
  same seed — same distribution, different random stream.
- Uniforms come from a CPU ``torch.Generator`` seeded with ``params.seed * 1_000_003 + batch`` (as
  ``HFGenerator`` seeds a batch), so a call is reproducible and leaves the global RNG alone.
"""

from __future__ import annotations

import torch
from transformers import LogitsProcessor

from evolm.backends.base import Completion, SamplingParams
from evolm.backends.hf import HFGenerator


class SharedUniformSampler(LogitsProcessor):
    """Inverse-CDF sampling with uniforms ``u[p, t]`` shared by every member's copy of prompt row p.

    Returns scores that are 0 at the chosen token and -inf elsewhere, so greedy decoding picks it."""

    def __init__(self, uniforms: torch.Tensor, input_len: int):
        self.uniforms = uniforms  # [P, max_new_tokens]
        self.input_len = input_len

    def __call__(self, input_ids, scores):
        step = input_ids.shape[1] - self.input_len
        rows = scores.shape[0]
        u = self.uniforms[:, step].to(scores.device).repeat(rows // self.uniforms.shape[0])
        probs = torch.softmax(scores.float(), dim=-1)
        cdf = torch.cumsum(probs, dim=-1)
        token = torch.searchsorted(cdf, (u * cdf[:, -1]).unsqueeze(1), right=True).squeeze(1)
        positive = probs > 0
        last = positive.shape[1] - 1 - positive.flip(1).to(torch.int8).argmax(dim=1)  # rounding guard
        token = torch.minimum(token, last)
        out = torch.full_like(scores, float("-inf"))
        out.scatter_(1, token.unsqueeze(1), 0.0)
        return out


class HFMemberGenerator:
    """Member-major batched generation over an ``HFGenerator``'s model, tokenizer and batching."""

    def __init__(self, generator: HFGenerator):
        self.base = generator

    @property
    def model(self):
        return self.base.model

    def uniforms(self, seed: int, rows: int, steps: int) -> torch.Tensor:
        g = torch.Generator(device="cpu").manual_seed(int(seed))
        return torch.rand(rows, steps, generator=g, dtype=torch.float32)

    @torch.no_grad()
    def generate(self, prompts: list[str], params: SamplingParams, members: int) -> list[list[list[Completion]]]:
        """``out[m][i]``: the ``params.n`` completions of prompt i for member m (block m of the rows)."""
        base = self.base
        sequences = [p for p in prompts for _ in range(params.n)]
        per_member: list[list[Completion]] = [[] for _ in range(members)]
        with base.kernels():
            self._generate_into(per_member, sequences, params, members)
        n = params.n
        return [[per_member[m][i * n:(i + 1) * n] for i in range(len(prompts))] for m in range(members)]

    def _generate_into(self, per_member: list[list[Completion]], sequences: list[str], params: SamplingParams, members: int) -> None:
        base = self.base
        for b, start in enumerate(range(0, len(sequences), base.batch_size)):
            chunk = sequences[start:start + base.batch_size]
            seed = params.seed * 1_000_003 + b
            ids, mask, prefix = base._layout(chunk, params.max_new_tokens)
            enc = {"input_ids": torch.tensor(ids * members, device=base.device),
                   "attention_mask": torch.tensor(mask * members, device=base.device)}
            if prefix:
                enc["past_key_values"] = base._prefix_cache(prefix, copies=members, repeat=len(chunk))
            sampler = None
            if not params.greedy:
                sampler = SharedUniformSampler(self.uniforms(seed, len(chunk), params.max_new_tokens), len(ids[0]))
            flat = base._generate_encoded(enc, params, seed, sampler)
            for m in range(members):
                per_member[m] += flat[m * len(chunk):(m + 1) * len(chunk)]
