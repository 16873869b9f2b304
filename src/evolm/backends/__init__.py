"""Generation backends behind one interface (``evolm.backends.base.Generator``)."""

from __future__ import annotations

from evolm.backends.base import Completion, Generator, SamplingParams
from evolm.errors import ConfigError


def make_generator(backend: str, model, tokenizer, batch_size: int = 32, prefix_cache: bool = True) -> Generator:
    """Build the backend named in ``generation.backend`` around a loaded model."""
    if backend == "hf":
        from evolm.backends.hf import HFGenerator  # torch + transformers: not for code that only reads results

        return HFGenerator(model, tokenizer, batch_size=batch_size, prefix_cache=prefix_cache)
    raise ConfigError(f"generation.backend must be 'hf' (got '{backend}')")


__all__ = ["Completion", "Generator", "SamplingParams", "make_generator"]
