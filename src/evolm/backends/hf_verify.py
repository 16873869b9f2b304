"""Exact verification of ES members against the centre's completions (HF backend, greedy decoding).

At sigma ~ 1e-3 most members decode most tokens exactly as the unperturbed model (the centre) does.
``HFVerifier`` decodes the centre once per iteration (``centre``, before any member is perturbed) and
then, per member (``generate``, with the member's weights in the model), checks the centre's
completions instead of decoding them:

1. ONE teacher-forced forward of the member over [prompt][centre completion] gives the member's own
   greedy choice (argmax of its logits, after Gemma's final soft-capping when the model has it) at
   every completion position t;
2. the member's completion equals the centre's up to the first position k where its choice differs;
   its token at k is its own choice there;
3. decoding continues from k + 1 on the member's weights (``HFGenerator``'s ``generate``, greedy, same
   end-of-sequence ids), for only the rows that diverged, from the teacher-forced KV cache cut at
   [prompt][centre[:k]]: the cache is cropped (``DynamicCache.crop``) to the latest cut of the rows
   and each row's slots past its own cut are masked out; position ids follow the attention mask, so
   every row continues at the positions it would have unpadded. A row stops at its end-of-sequence
   token or at ``max_new_tokens`` generated tokens in all (its k + 1 accepted tokens counted).

Rows whose centre completion ended with end-of-sequence and whose choices agree everywhere are the
centre's completion, ended likewise; a centre completion cut at ``max_new_tokens`` that the member
agrees with is the member's (cut likewise). Prompt batching, left padding and the shared-prefix KV
cache are ``HFGenerator``'s own (``_layout``, ``_prefix_cache``, computed with the member's weights).

Exactness (what is and is not bit-identical to plain decoding):

- In exact arithmetic the result is the member's greedy completion: greedy decoding is a pure function
  of the weights, and a token is accepted only where the member's argmax, given the same preceding
  tokens, is that token.
- In floating point, the member's logits at a position come from a batched forward over many positions
  (teacher forcing) rather than from one incremental step over a KV cache; the two differ in the last
  bits (matmul blocking), and the continuation decodes from cache entries the batched forward wrote.
  Where a member's top two logits are within that rounding (a near-tie), its argmax may flip, so the
  completion is the member's greedy completion under the batched forward's arithmetic and can differ
  from what plain ``HFGenerator.generate`` decodes. Plain batched decoding itself already depends on
  the batch's padding and composition in the same way. How often this happens on SmolLM2 for the
  shipped configs is measured by ``benchmarks/verify.py`` and in ``tests/test_verify.py``.
- Everything else is the same code as the plain path: completions are cut and decoded by
  ``HFGenerator._completion`` (text, ``num_tokens``, ``finished``).
- Not supported (refused): sampling (``temperature > 0``: ``HFGenerator`` samples with
  ``torch.multinomial`` from one generator over the whole batch at every step, so the numbers a row sees
  depend on the step count and on every other row of the call, not on (row, position) alone; a
  continuation from a cut point, over only the diverged rows, cannot see the plain path's numbers, and
  no acceptance rule is exact for it), token entropies, and a model whose sliding attention window is
  shorter than prompt + completion (the masked slots would shift its window). Measured on SmolLM2: the
  shipped arithmetic and countdown configs (4 members x 8 prompts at sigma 1e-3) and the smoke runs of
  ``benchmarks/verify.py`` (sigma 1e-3 and 1e-2, 64 tokens) gave every member's completion identical to
  plain decoding.

Counters per call (``VerifyStats``): members' rows identical to the centre, accepted tokens (the
shared prefix) over the centre's tokens, and sequential forward passes (decode steps), so the
acceptance profile and the decode-step saving can be logged next to each other.
"""

from __future__ import annotations

import warnings
from dataclasses import dataclass, field

import torch

from evolm.backends.base import Completion, SamplingParams
from evolm.backends.hf import HFGenerator, sliding_window

LOGIT_ROWS = 8
"""Rows per chunk of the vocabulary projection over all completion positions (bounds its memory)."""


@dataclass
class CentreBatch:
    """One prompt batch of the centre's completions: the rows' layout and token ids."""

    ids: list[list[int]]
    """Padded prompt token ids per row (``HFGenerator._layout``)."""
    mask: list[list[int]]
    prefix: list[int]
    """The shared prefix run once ([] when none)."""
    tokens: list[list[int]]
    """The centre's completion tokens per row, up to and including its end-of-sequence token."""


@dataclass
class Centre:
    """The centre's completions of one ``generate`` call (what members are verified against)."""

    params: SamplingParams
    batches: list[CentreBatch]
    completions: list[list[Completion]]
    """In ``Generator.generate``'s shape: per prompt, ``params.n`` completions."""
    decode_steps: int = 0
    """Sequential forward passes the centre's decoding took."""


@dataclass
class VerifyStats:
    """Acceptance counters summed over members' rows (and over members, with ``add``)."""

    rows: int = 0
    identical: int = 0
    """Rows whose completion is token for token the centre's."""
    accepted_tokens: int = 0
    """Leading tokens equal to the centre's (the shared prefix), summed over rows."""
    centre_tokens: int = 0
    prefix_fraction_sum: float = 0.0
    """Sum over rows of accepted / centre tokens (a row's shared-prefix fraction)."""
    decode_steps: int = 0
    """Sequential forward passes (teacher-forced forward, prefix cache, continuation steps)."""
    accepted: list[int] = field(default_factory=list)
    """Per row, in call order: leading tokens equal to the centre's (a row identical to it: all of them)."""
    seconds: dict = field(default_factory=lambda: {"verify": 0.0, "continue": 0.0})

    def add(self, other: "VerifyStats") -> None:
        self.rows += other.rows
        self.identical += other.identical
        self.accepted_tokens += other.accepted_tokens
        self.centre_tokens += other.centre_tokens
        self.prefix_fraction_sum += other.prefix_fraction_sum
        self.decode_steps += other.decode_steps
        self.accepted += other.accepted
        for k, v in other.seconds.items():
            self.seconds[k] = self.seconds.get(k, 0.0) + v

    @property
    def identical_fraction(self) -> float:
        return self.identical / self.rows if self.rows else float("nan")

    @property
    def prefix_fraction(self) -> float:
        """Mean over rows of the shared-prefix fraction."""
        return self.prefix_fraction_sum / self.rows if self.rows else float("nan")


def check_supported(params: SamplingParams) -> None:
    if not params.greedy:
        raise ValueError("verification needs greedy decoding (temperature 0): the hf sampler's random stream is "
                         "not keyed by position, so no acceptance rule is exact; set generation.verify='off'")
    if params.return_entropy:
        raise ValueError("verification does not measure token entropy; generate without return_entropy")


class HFVerifier:
    """Centre completions once, then members verified against them (see the module docstring)."""

    def __init__(self, generator: HFGenerator):
        self.base = generator

    @property
    def model(self):
        return self.base.model

    @torch.no_grad()
    def centre(self, prompts: list[str], params: SamplingParams) -> Centre:
        """Decode the current weights' (the centre's) completions, keeping their token ids."""
        check_supported(params)
        with self.base.kernels():
            return self._centre(prompts, params)

    def _centre(self, prompts: list[str], params: SamplingParams) -> Centre:
        base = self.base
        sequences = [p for p in prompts for _ in range(params.n)]
        batches, flat, steps = [], [], 0
        for b, start in enumerate(range(0, len(sequences), base.batch_size)):
            ids, mask, prefix = base._layout(sequences[start:start + base.batch_size], params.max_new_tokens)
            enc = {"input_ids": torch.tensor(ids, device=base.device), "attention_mask": torch.tensor(mask, device=base.device)}
            if prefix:
                enc["past_key_values"] = base._prefix_cache(prefix, copies=1, repeat=len(ids))
            new, _ = base._generate_ids(enc, params, seed=params.seed * 1_000_003 + b)
            steps += new.shape[1] + (1 if prefix else 0)
            rows = [base._completion(new[r].tolist()) for r in range(new.shape[0])]
            tokens = [new[r, :c.num_tokens].tolist() for r, c in enumerate(rows)]
            self._check_window(len(ids[0]) + params.max_new_tokens)
            batches.append(CentreBatch(ids=ids, mask=mask, prefix=prefix, tokens=tokens))
            flat += rows
        n = params.n
        return Centre(params=params, batches=batches, completions=[flat[i * n:(i + 1) * n] for i in range(len(prompts))],
                      decode_steps=steps)

    def _check_window(self, length: int) -> None:
        window = sliding_window(self.model)
        if window is not None and length > window:
            raise ValueError(f"verification: prompt + completion ({length} tokens) exceeds the model's sliding "
                             f"attention window ({window}); set generation.verify='off'")

    @torch.no_grad()
    def generate(self, centre: Centre, params: SamplingParams) -> tuple[list[list[Completion]], VerifyStats]:
        """The current weights' (a member's) greedy completions of the centre's prompts, and the counters."""
        check_supported(params)
        if params != centre.params:
            raise ValueError("verification: the member's sampling parameters differ from the centre's")
        stats = VerifyStats()
        flat: list[Completion] = []
        with self.base.kernels():
            for batch in centre.batches:
                flat += self._verify_batch(batch, params, stats)
        n = params.n
        return [flat[i * n:(i + 1) * n] for i in range(len(flat) // n)], stats

    def _choices(self, batch: CentreBatch, stats: VerifyStats):
        """Teacher-forced forward over [prompt][centre tokens but the last]: the member's argmax at every
        completion position ``[rows, longest]``, the KV cache, the input ids and mask it covers."""
        base, model = self.base, self.model
        pad = base.tokenizer.pad_token_id
        width = len(batch.ids[0])
        longest = max(len(t) for t in batch.tokens)
        forced = longest - 1
        ids = [row + t[:-1] + [pad] * (forced - len(t) + 1) for row, t in zip(batch.ids, batch.tokens)]
        mask = [m + [1] * (len(t) - 1) + [0] * (forced - len(t) + 1) for m, t in zip(batch.mask, batch.tokens)]
        ids_t = torch.tensor(ids, device=base.device)
        mask_t = torch.tensor(mask, device=base.device)
        positions = (mask_t.long().cumsum(-1) - 1).clamp(min=0)
        start = len(batch.prefix)
        cache = None
        if batch.prefix:
            cache = base._prefix_cache(batch.prefix, copies=1, repeat=len(ids))
            stats.decode_steps += 1
        with warnings.catch_warnings():  # transformers 5.2x renames past_key_values to cache; the old name works up to 6.0
            warnings.filterwarnings("ignore", message=".*past_key_values.*deprecated", category=FutureWarning)
            out = model.base_model(input_ids=ids_t[:, start:], attention_mask=mask_t, position_ids=positions[:, start:],
                                   past_key_values=cache, use_cache=True)
        stats.decode_steps += 1
        hidden = out.last_hidden_state[:, width - 1 - start:width - 1 - start + longest]
        head = model.get_output_embeddings()
        cap = getattr(model.config, "final_logit_softcapping", None)
        choices = []
        for r in range(0, hidden.shape[0], LOGIT_ROWS):
            logits = head(hidden[r:r + LOGIT_ROWS])
            if cap:
                logits = torch.tanh(logits / cap) * cap
            choices.append(logits.float().argmax(dim=-1))
        return torch.cat(choices).cpu(), out.past_key_values, ids, mask

    def _verify_batch(self, batch: CentreBatch, params: SamplingParams, stats: VerifyStats) -> list[Completion]:
        import time

        base = self.base
        t0 = time.perf_counter()
        choices, cache, ids, mask = self._choices(batch, stats)
        width = len(batch.ids[0])
        rows: list[list[int]] = []
        cont: list[tuple[int, int]] = []  # (row, cut) of rows that continue decoding
        for r, centre in enumerate(batch.tokens):
            mine = choices[r, :len(centre)].tolist()
            k = next((t for t, (a, b) in enumerate(zip(mine, centre)) if a != b), None)
            stats.rows += 1
            stats.centre_tokens += len(centre)
            stats.accepted.append(len(centre) if k is None else k)
            if k is None:
                rows.append(list(centre))
                stats.identical += 1
                stats.accepted_tokens += len(centre)
                stats.prefix_fraction_sum += 1.0
                continue
            stats.accepted_tokens += k
            stats.prefix_fraction_sum += k / len(centre)
            rows.append(centre[:k] + [mine[k]])
            if mine[k] not in base.eos_ids and k + 1 < params.max_new_tokens:
                cont.append((r, width + k))
        t1 = time.perf_counter()
        stats.seconds["verify"] += t1 - t0
        if cont:
            self._continue(rows, cont, cache, ids, mask, width, params, stats)
        stats.seconds["continue"] += time.perf_counter() - t1
        return [base._completion(row) for row in rows]

    def _continue(self, rows, cont, cache, ids, mask, width: int, params: SamplingParams, stats: VerifyStats) -> None:
        """Greedy decoding of the diverged rows from their cut, on the current weights; extends ``rows``."""
        base = self.base
        latest = max(cut for _, cut in cont)
        surplus = cache.get_seq_length() - latest
        if surplus:
            cache.crop(-surplus)  # negative: remove that many slots (the spelling every transformers accepts)
        if len(cont) < len(rows):
            cache.batch_select_indices(torch.tensor([r for r, _ in cont], device=base.device))
        input_ids, attention = [], []
        for r, cut in cont:
            input_ids.append(ids[r][:latest] + [rows[r][-1]])
            attention.append(mask[r][:cut] + [0] * (latest - cut) + [1])
        budget = [params.max_new_tokens - (cut - width) - 1 for _, cut in cont]  # cut - width = accepted tokens
        enc = {"input_ids": torch.tensor(input_ids, device=base.device),
               "attention_mask": torch.tensor(attention, device=base.device), "past_key_values": cache}
        new, _ = base._generate_ids(enc, SamplingParams(max_new_tokens=max(budget)), seed=0)
        stats.decode_steps += new.shape[1]
        for j, ((r, _), left) in enumerate(zip(cont, budget)):
            rows[r] += new[j, :left].tolist()
