"""A model's weights as one float32 state dict (tied tensors once), and the fingerprint of its content.

The analyses compare a trained model with the weights its run started from, so "the weights a run
started from" needs one identity that the training side can record and the analysis side can check:

- ``float32_state(model)``: the model's state dict on CPU, every tensor converted to float32 and tied
  aliases (SmolLM2's ``lm_head.weight`` is ``model.embed_tokens.weight``) dropped. For a bfloat16 or
  float16 model these are the *rounded* values, which is what ES's float32 masters start from.
- ``state_fingerprint(state)``: SHA-256 over the sorted names, shapes and float32 bit patterns
  (first 32 hex digits). Bit patterns, not values: -0.0 and 0.0 differ, and a fingerprint equal to a
  run's recorded one means the analysis sees exactly the run's step-0 weights.
- ``deduplicate_tied`` is the one rule for dropping aliases, shared by the in-memory side (here) and
  the file side (``evolm.analysis.weights.load_state_info``), so both see the same names.

Design decisions:

- Core layer, beside ``models``: the run lifecycle (``evolm.jobs``) fingerprints the starting weights
  when it creates a run directory, and the analyses (``evolm.analysis``) fingerprint the base they are
  given; neither imports the other.
- Hashing runs over the tensors' own memory (no copies for float32 CPU tensors; other tensors are
  converted one at a time), about 1-2 s for SmolLM2-135M's 538 MB.
"""

from __future__ import annotations

import hashlib

EMBEDDING_NAMES = ("model.embed_tokens.weight", "transformer.wte.weight", "gpt_neox.embed_in.weight",
                   "model.embed_in.weight", "embed_tokens.weight")
LM_HEAD_NAMES = ("lm_head.weight", "embed_out.weight")


def deduplicate_tied(state: dict, by_value: bool = False) -> tuple[dict, dict[str, str]]:
    """Drop names that alias another tensor of ``state``; return ``(state, {dropped: kept})``.

    Two names alias when they share storage (an in-memory tied model) or, with ``by_value``, when an
    LM-head tensor is bit-identical to the embedding (a file that stored both copies of tied weights).
    The embedding name is the one kept.
    """
    import torch  # local: torch is slow to import, and `evolm --help` imports the modules that import this one

    def rank(name: str) -> tuple:
        return (name in LM_HEAD_NAMES, name)  # keep embeddings over lm_head, else the first name

    seen: dict[tuple, str] = {}
    aliases: dict[str, str] = {}
    for name in sorted(state, key=rank):
        t = state[name]
        key = (t.data_ptr(), tuple(t.shape), t.dtype, t.stride()) if t.numel() else None
        if key is not None and key in seen:
            aliases[name] = seen[key]
        elif key is not None:
            seen[key] = name
    if by_value:
        emb = next((n for n in EMBEDDING_NAMES if n in state), None)
        for head in LM_HEAD_NAMES:
            if emb and head in state and head not in aliases and state[head].shape == state[emb].shape \
                    and torch.equal(state[head], state[emb]):
                aliases[head] = emb
    return {k: v for k, v in state.items() if k not in aliases}, aliases


def float32_state(model) -> dict:
    """``model``'s state dict as float32 CPU tensors, tied aliases once (float32 CPU tensors are not copied)."""
    import torch  # local: see deduplicate_tied

    state, _ = deduplicate_tied(model.state_dict())
    return {name: t.detach().to(device="cpu", dtype=torch.float32) for name, t in state.items()}


def state_fingerprint(state: dict) -> str:
    """SHA-256 (32 hex digits) of a state dict's sorted names, shapes and float32 bit patterns."""
    import torch  # local: see deduplicate_tied

    h = hashlib.sha256()
    for name in sorted(state):
        t = state[name].detach().to(device="cpu", dtype=torch.float32).contiguous()
        h.update(name.encode())
        h.update(str(tuple(t.shape)).encode())
        if t.numel():
            h.update(t.view(-1).numpy())
    return h.hexdigest()[:32]


def model_fingerprint(model) -> str:
    """``state_fingerprint(float32_state(model))``, the identity of the weights a run starts from, converting
    one tensor at a time (a GPU model is never copied to the CPU whole)."""
    return state_fingerprint(deduplicate_tied(model.state_dict())[0])


def lower_precision(model) -> list[str]:
    """The floating-point dtypes other than float32 among ``model``'s parameters (e.g. ``["bfloat16"]``)."""
    return sorted({str(p.dtype).replace("torch.", "") for p in model.parameters()
                   if p.is_floating_point() and str(p.dtype) != "torch.float32"})
