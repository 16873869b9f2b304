"""Parameter categories by Hugging Face name (stdlib only; shared by the ES engine and the analyses)."""

from __future__ import annotations


def param_category(name: str) -> str:
    """One of norm, attention, mlp, embedding, lm_head, other."""
    n = name.lower()
    if "norm" in n or ".ln_" in n or n.startswith("ln_"):
        return "norm"
    if "lm_head" in n:
        return "lm_head"
    if "embed" in n or ".wte." in n or ".wpe." in n:
        return "embedding"
    if "attn" in n or "attention" in n:
        return "attention"
    if "mlp" in n or "feed_forward" in n:
        return "mlp"
    return "other"
