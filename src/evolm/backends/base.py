"""The generation interface every backend implements (Hugging Face now; vLLM and Ray behind the same calls).

Design decisions:

- ``generate(prompts, params)`` takes fully rendered prompt strings and returns, per prompt, a list of
  ``params.n`` completions. Prompt rendering (chat templates) belongs to tasks, not backends.
- ``params.seed`` makes sampling reproducible *and shared*: the ES engine passes the same seed to
  every population member of an iteration, so members differ only by their weights (common random
  numbers). Greedy decoding (``temperature == 0``) ignores it.
- Token entropy is measured during generation, from the raw next-token logits at the sampling
  temperature (temperature 1 for greedy), over the full vocabulary (before top-p truncation), and
  averaged over each completion's generated tokens up to and including its end-of-sequence token.
  No second forward pass.
- ``sync_weights()`` is the one call a backend that keeps its own copy of the weights (vLLM, a Ray
  actor) needs after the ES engine changed the model's tensors; the HF backend shares the tensors
  and does nothing.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass


@dataclass(frozen=True)
class SamplingParams:
    n: int = 1
    """Completions per prompt."""
    temperature: float = 0.0
    """0 means greedy."""
    top_p: float = 1.0
    max_new_tokens: int = 32
    seed: int = 0
    """Seed of the sampling random stream (shared across ES members of one iteration)."""
    return_entropy: bool = False
    """Measure mean token entropy per completion."""

    @property
    def greedy(self) -> bool:
        return self.temperature == 0


@dataclass
class Completion:
    text: str
    """Decoded completion without special tokens."""
    num_tokens: int
    """Generated tokens, including the end-of-sequence token when one was produced."""
    entropy: float | None = None
    """Mean next-token entropy (nats) over the generated tokens, when requested."""
    finished: bool = True
    """False when the completion hit ``max_new_tokens`` without an end-of-sequence token."""


class Generator(ABC):
    """Turns rendered prompts into completions with the model's *current* weights."""

    @abstractmethod
    def generate(self, prompts: list[str], params: SamplingParams) -> list[list[Completion]]:
        """``params.n`` completions for each prompt, in prompt order."""

    def sync_weights(self) -> None:
        """Make generation see the model tensors' current values (no-op when they are shared)."""

    def close(self) -> None:
        """Release backend resources."""
