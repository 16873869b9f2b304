"""Hugging Face ``generate`` backend: batched, left-padded, greedy or sampled, with token entropy.

Design decisions:

- Prompts are expanded ``n`` times and cut into batches of ``batch_size`` sequences; prompts are
  batched in their given order (ES prompts have near-equal lengths, so sorting buys little).
- Sampling runs inside ``torch.random.fork_rng`` seeded from ``(params.seed, batch index)``, so a
  call is reproducible without disturbing the caller's global random state, and every ES member of
  an iteration sees the same random stream.
- Prompts of a batch that share a long token prefix (a task's system message and worked
  demonstrations: 50 of the 61 tokens of an arithmetic prompt) have that prefix run once and its KV
  cache repeated over the batch (``_encode``); rows are laid out ``[prefix][padding][suffix]`` with
  the padding masked and position ids following the mask. On SmolLM2-135M this cut greedy generation
  of 32 arithmetic prompts by ~40% on the CPU, with identical completions (tested).
  ``generation.prefix_cache = false`` turns it off. The prefix must leave every prompt at least one
  token of its own to run with the batch (the last position's logits start decoding): a prompt that is
  a prefix of another, or a batch of one prompt repeated ``n`` times, shares all but its last token.
  The logits are not bit-identical to plain left padding: the prefix's matmuls run at batch 1 and
  the suffix's attention reads it from the cache, so they round differently (first-step max |Δ|:
  ~4e-7 on a tiny float32 llama; on SmolLM2-135M 0 for arithmetic prompts and 3.8e-5 for Qiu-style
  Countdown ones, logits up to ~40); greedy token ids agree except at near-ties.
  Not with a sliding attention window (Mistral, Gemma-3's local layers) that the rows can outgrow:
  the mask counts the window in cache slots, so padding between prefix and suffix would push prefix
  tokens out of a padded row's window early (logits off by ~0.4 on a tiny Mistral); such batches,
  when their prompts differ in length and prompt + ``max_new_tokens`` reaches the window, fall back
  to plain left padding.
- Temperature and top-p are applied by our own logits-processor list (the generation config keeps
  temperature 1 and top_p 1, so transformers adds no warpers of its own). That fixes the order:
  the entropy recorder sees the raw logits, then temperature, then top-p.
"""

from __future__ import annotations

import warnings

import torch
from transformers import GenerationConfig, LogitsProcessor, LogitsProcessorList
from transformers.generation.logits_process import TemperatureLogitsWarper, TopPLogitsWarper

from evolm.backends.base import Completion, Generator, SamplingParams
from evolm.backends import cpu_matmul as matmul


class _EntropyRecorder(LogitsProcessor):
    """Records, per generation step, the entropy of softmax(raw_logits / temperature) for every row."""

    def __init__(self, temperature: float):
        self.temperature = temperature
        self.steps: list[torch.Tensor] = []

    def __call__(self, input_ids, scores):
        logp = torch.log_softmax(scores.float() / self.temperature, dim=-1)
        self.steps.append(-(logp.exp() * logp).nansum(dim=-1).cpu())
        return scores


def sliding_window(model) -> int | None:
    """The model's sliding attention window in tokens when any of its layers attends through one, else None."""
    cfg = model.config
    cfg = cfg.get_text_config() if hasattr(cfg, "get_text_config") else cfg
    window = getattr(cfg, "sliding_window", None)
    layer_types = getattr(cfg, "layer_types", None) or []
    sliding = any("sliding" in str(t) for t in layer_types) or (window and not layer_types)
    return int(window) if sliding and window else None


class HFGenerator(Generator):
    def __init__(self, model, tokenizer, batch_size: int = 32, prefix_cache: bool = True, min_prefix: int = 16,
                 cpu_matmul: str = "auto"):
        self.model = model
        self.cpu_matmul = cpu_matmul
        matmul.resolve(cpu_matmul)  # a bad choice fails here, not at the first generate
        self.tokenizer = tokenizer
        self.batch_size = batch_size
        self.prefix_cache = prefix_cache
        self.min_prefix = min_prefix
        eos = model.generation_config.eos_token_id
        self.eos_ids = set(eos if isinstance(eos, (list, tuple)) else [eos if eos is not None else tokenizer.eos_token_id])
        self.eos_ids.add(tokenizer.eos_token_id)
        self.eos_ids.discard(None)

    @property
    def device(self):
        return next(self.model.parameters()).device

    def kernels(self):
        """The block in which this generator's forward passes run (float32 CPU linears through oneDNN unless
        ``generation.cpu_matmul = "torch"``: ``evolm.backends.cpu_matmul``)."""
        return matmul.cpu_matmul(self.model, self.cpu_matmul)

    def generate(self, prompts: list[str], params: SamplingParams) -> list[list[Completion]]:
        sequences = [p for p in prompts for _ in range(params.n)]
        flat: list[Completion] = []
        with self.kernels():
            for b, start in enumerate(range(0, len(sequences), self.batch_size)):
                flat += self._generate_batch(sequences[start:start + self.batch_size], params, seed=params.seed * 1_000_003 + b)
        return [flat[i * params.n:(i + 1) * params.n] for i in range(len(prompts))]

    def _encode(self, prompts: list[str], max_new_tokens: int) -> dict:
        """Token ids, attention mask and (when the prompts share a long prefix) its KV cache.

        Without a shared prefix: ordinary left padding. With one of >= ``min_prefix`` tokens (a task's
        system message and worked demonstrations), the prefix is run once at batch size 1, its cache
        is repeated over the batch, and each row is laid out as ``[prefix][padding][own suffix]``
        with the padding masked out; position ids follow the attention mask, so every row sees the
        positions it would see unpadded. ``max_new_tokens``: how far the rows will grow (``_shared_prefix``).
        """
        ids, mask, prefix = self._layout(prompts, max_new_tokens)
        enc = {"input_ids": torch.tensor(ids, device=self.device), "attention_mask": torch.tensor(mask, device=self.device)}
        if prefix:
            enc["past_key_values"] = self._prefix_cache(prefix, copies=1, repeat=len(ids))
        return enc

    def _layout(self, prompts: list[str], max_new_tokens: int) -> tuple[list[list[int]], list[list[int]], list[int]]:
        """Padded token ids and attention mask per prompt, and the shared prefix ([] when none is used)."""
        rows = [self.tokenizer(p, add_special_tokens=False)["input_ids"] for p in prompts]
        prefix = self._shared_prefix(rows, max_new_tokens)
        pad = self.tokenizer.pad_token_id
        if not prefix:
            width = max(len(r) for r in rows)
            ids = [[pad] * (width - len(r)) + r for r in rows]
            mask = [[0] * (width - len(r)) + [1] * len(r) for r in rows]
            return ids, mask, []
        width = max(len(r) for r in rows) - prefix
        ids = [r[:prefix] + [pad] * (width - len(r) + prefix) + r[prefix:] for r in rows]
        mask = [[1] * prefix + [0] * (width - len(r) + prefix) + [1] * (len(r) - prefix) for r in rows]
        return ids, mask, rows[0][:prefix]

    def _shared_prefix(self, rows: list[list[int]], max_new_tokens: int) -> int:
        """Tokens of the rows' common prefix to run once: 0 (plain left padding) when caching is off, for a
        single row, below ``min_prefix``, or when a sliding attention window would see the padding."""
        if not self.prefix_cache or len(rows) < 2:
            return 0
        shortest, longest = min(len(r) for r in rows), max(len(r) for r in rows)
        prefix = 0
        while prefix < shortest - 1 and all(r[prefix] == rows[0][prefix] for r in rows):  # leave each row a token
            prefix += 1
        if prefix < self.min_prefix:
            return 0
        window = sliding_window(self.model)
        if window is not None and shortest < longest and longest + max_new_tokens >= window:
            return 0  # padding between prefix and suffix would count toward the window (module docstring)
        return prefix

    @torch.no_grad()
    def _prefix_cache(self, prefix: list[int], copies: int, repeat: int):
        """KV cache of ``prefix`` run as ``copies`` identical rows, each row repeated ``repeat`` times. The
        decoder alone (``base_model``): the prefix's logits are never read, so the LM head is not run."""
        cache = self.model.base_model(torch.tensor([prefix] * copies, device=self.device), use_cache=True).past_key_values
        cache.batch_repeat_interleave(repeat)
        return cache

    @torch.no_grad()
    def _generate_batch(self, prompts: list[str], params: SamplingParams, seed: int) -> list[Completion]:
        return self._generate_encoded(self._encode(prompts, params.max_new_tokens), params, seed)

    @torch.no_grad()
    def _generate_encoded(self, enc: dict, params: SamplingParams, seed: int, sampler: LogitsProcessor | None = None) -> list[Completion]:
        """Generate from encoded rows. ``sampler``, when given, picks every sampled token itself (after
        temperature and top-p; it must leave one finite score per row) and decoding runs as greedy."""
        new, entropies = self._generate_ids(enc, params, seed, sampler)
        return [self._completion(new[row].tolist(), None if entropies is None else entropies[row]) for row in range(new.shape[0])]

    @torch.no_grad()
    def _generate_ids(self, enc: dict, params: SamplingParams, seed: int, sampler: LogitsProcessor | None = None
                      ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """The new token ids ``[rows, steps]`` (padding after a row's end-of-sequence token) and, when
        ``params.return_entropy``, the per-step entropies ``[rows, steps]``."""
        processors = LogitsProcessorList()
        recorder = None
        if params.return_entropy:
            recorder = _EntropyRecorder(params.temperature if params.temperature > 0 else 1.0)
            processors.append(recorder)
        if not params.greedy:
            processors.append(TemperatureLogitsWarper(params.temperature))
            if params.top_p < 1.0:
                processors.append(TopPLogitsWarper(params.top_p))
            if sampler is not None:
                processors.append(sampler)
        do_sample = not params.greedy and sampler is None
        sampling = {"temperature": 1.0, "top_p": 1.0, "top_k": 0} if do_sample else {}
        config = GenerationConfig(
            max_new_tokens=params.max_new_tokens, do_sample=do_sample, **sampling,
            pad_token_id=self.tokenizer.pad_token_id, eos_token_id=sorted(self.eos_ids),
        )
        devices = [self.device] if self.device.type == "cuda" else []
        with torch.random.fork_rng(devices=devices), warnings.catch_warnings():
            # transformers 5.2x renames generate's past_key_values to cache; the old name works up to 6.0
            warnings.filterwarnings("ignore", message=".*past_key_values.*deprecated", category=FutureWarning)
            torch.manual_seed(seed)
            out = self.model.generate(**enc, generation_config=config, logits_processor=processors)
        new = out[:, enc["input_ids"].shape[1]:].cpu()
        entropies = torch.stack(recorder.steps, dim=1) if recorder and recorder.steps else None
        return new, entropies

    def _completion(self, ids: list[int], entropies: torch.Tensor | None = None) -> Completion:
        """A row's new token ids cut after its first end-of-sequence token, decoded."""
        length, finished = len(ids), False
        for i, tok in enumerate(ids):
            if tok in self.eos_ids:
                length, finished = i + 1, True
                break
        entropy = float(entropies[:length].mean()) if entropies is not None and length else None
        text = self.tokenizer.decode(ids[:length], skip_special_tokens=True)
        return Completion(text=text, num_tokens=length, entropy=entropy, finished=finished)
