"""Parameter categories: which part of a transformer a Hugging Face parameter name belongs to.

One function, ``param_category(name)``, is the single definition shared by the analyses (drift,
localisation, compression scopes) and the ES engine (which selects parameter subsets with it), so
"norm" means the same coordinates everywhere. ``param_subcategory(name)`` gives finer labels for
breakdowns, always of the form ``<category>.<part>.<leaf>`` (e.g. ``attention.q.bias``,
``norm.input_layernorm.weight``, ``mlp.down.weight``, ``embedding.tokens.weight``).

Design decisions:

- Names are matched on their dot-separated components, not substrings of the whole name, so a
  module called ``normalizer_mlp`` is not mistaken for anything. Recognised families: llama, qwen2,
  mistral, gemma/gemma3 (``pre_feedforward_layernorm``, ``q_norm``), gpt2 (``ln_1``, ``attn.c_attn``,
  ``mlp.c_fc``, ``wte``/``wpe``), gpt-neox/phi (``attention.query_key_value``, ``dense``, ``fc1``).
- Order of the rules matters and is fixed: ``lm_head`` first, then embeddings, then norms (so a
  query/key norm inside ``self_attn`` such as gemma3's ``self_attn.q_norm`` counts as a norm, the
  "LayerNorm" family of "Understanding Evolution Strategies for LLM Reasoning", arXiv 2608.27351), then
  attention, then MLP; anything else is ``other``.
- Stdlib only, at the bottom of the package: the config, the ES engine and the analyses all import it.
"""

from __future__ import annotations

import re

CATEGORIES = ("norm", "attention", "mlp", "embedding", "lm_head", "other")
"""Every value ``param_category`` can return, in display order."""

_EMBEDDING_PARTS = {
    "embed_tokens": "tokens", "wte": "tokens", "word_embeddings": "tokens", "embed_in": "tokens",
    "wpe": "positions", "embed_positions": "positions", "position_embeddings": "positions",
    "token_type_embeddings": "token_types",
}
_ATTENTION_PARTS = {"self_attn", "attn", "attention", "self_attention", "cross_attn"}
_MLP_PARTS = {"mlp", "feed_forward", "ffn", "block_sparse_moe"}
_ATTENTION_PROJ = {
    "q_proj": "q", "k_proj": "k", "v_proj": "v", "o_proj": "o", "query": "q", "key": "k", "value": "v",
    "c_attn": "qkv", "qkv_proj": "qkv", "query_key_value": "qkv", "Wqkv": "qkv",
    "c_proj": "o", "out_proj": "o", "dense": "o",
}
_MLP_PROJ = {
    "gate_proj": "gate", "up_proj": "up", "down_proj": "down", "gate_up_proj": "gate_up",
    "c_fc": "up", "fc1": "up", "dense_h_to_4h": "up", "w1": "gate", "w3": "up",
    "c_proj": "down", "fc2": "down", "dense_4h_to_h": "down", "w2": "down",
}
_LAYER = re.compile(r"(?:^|\.)(?:layers|h|layer|blocks)\.(\d+)\.")


def _is_norm(part: str) -> bool:
    p = part.lower()
    return "norm" in p or p.startswith("ln_") or p == "ln"


def param_category(name: str) -> str:
    """One of ``CATEGORIES`` for a parameter name such as ``model.layers.3.self_attn.q_proj.bias``."""
    parts = name.split(".")
    if "lm_head" in parts:
        return "lm_head"
    if any(p in _EMBEDDING_PARTS for p in parts):
        return "embedding"
    if any(_is_norm(p) for p in parts):
        return "norm"
    if any(p in _ATTENTION_PARTS for p in parts):
        return "attention"
    if any(p in _MLP_PARTS for p in parts):
        return "mlp"
    return "other"


def param_subcategory(name: str) -> str:
    """A finer label ``<category>.<part>.<leaf>``: ``attention.q.weight``, ``norm.final.weight``, ..."""
    category = param_category(name)
    parts = name.split(".")
    leaf = parts[-1] if len(parts) > 1 else "weight"
    modules = parts[:-1] if len(parts) > 1 else parts
    if category == "lm_head":
        return f"lm_head.{leaf}"
    if category == "embedding":
        part = next(_EMBEDDING_PARTS[p] for p in modules if p in _EMBEDDING_PARTS)
        return f"embedding.{part}.{leaf}"
    if category == "norm":
        module = next(p for p in reversed(modules) if _is_norm(p))
        if layer_index(name) is None and module in ("norm", "ln_f", "final_layernorm", "final_layer_norm"):
            module = "final"
        return f"norm.{module}.{leaf}"
    if category in ("attention", "mlp"):
        table = _ATTENTION_PROJ if category == "attention" else _MLP_PROJ
        part = next((table[p] for p in reversed(modules) if p in table), None)
        if part is None:
            part = modules[-1] if modules else "other"
        return f"{category}.{part}.{leaf}"
    return f"other.{leaf}"


def layer_index(name: str) -> int | None:
    """The transformer block a parameter lives in (``model.layers.7.mlp...`` -> 7), None outside blocks."""
    m = _LAYER.search(name)
    return int(m.group(1)) if m else None
