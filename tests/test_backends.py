"""The Hugging Face backend: shared-prefix caching gives the same completions as plain left padding.

Its logits are not bit-identical to plain left padding (the prefix runs at batch 1 and is read back from
the KV cache, so matmuls and attention round differently): they are compared within ``LOGIT_TOL``, and
greedy token ids exactly, on tiny float32 models."""

from __future__ import annotations

import pytest
import torch

from evolm.backends.base import SamplingParams
from evolm.backends.hf import HFGenerator

PREFIX = ("You are a careful calculator. Here is how to answer: read the question, add the numbers, "
          "and reply with the sum only.\n")
PROMPTS = [PREFIX + q for q in ("What is 1 + 2?", "What is 40 + 41 plus 17 minus 3?", "Sum 7 and 8.", "9 + 9 =")]


LOGIT_TOL = 1e-5
"""Max |logit difference| allowed between cached-prefix and plain prefill (logits of size ~1.5; seen: ~4e-7)."""


def _texts(out):
    return [[c.text for c in row] for row in out]


def _first_step_logits(gen, prompts, max_new_tokens=4, n=1):
    """The logits every row's first new token is chosen from (the LM head's last output over all rows)."""
    rows = len(prompts) * n
    seen = []
    hook = gen.model.get_output_embeddings().register_forward_hook(
        lambda module, args, out: seen.append(out[:, -1].clone()) if out.shape[0] == rows and not seen else None)
    try:
        out = gen.generate(prompts, SamplingParams(n=n, max_new_tokens=max_new_tokens))
    finally:
        hook.remove()
    return seen[0], out


def _plain_and_cached(model, tokenizer, prompts, batch_size=8, max_new_tokens=4, n=1):
    """(first-step logits, completions) without and with the shared-prefix cache, and whether it was used."""
    plain = HFGenerator(model, tokenizer, batch_size=batch_size, prefix_cache=False)
    cached = HFGenerator(model, tokenizer, batch_size=batch_size, prefix_cache=True)
    used = []
    run_prefix = cached._prefix_cache
    cached._prefix_cache = lambda prefix, **kw: used.append(len(prefix)) or run_prefix(prefix, **kw)
    return _first_step_logits(plain, prompts, max_new_tokens, n), _first_step_logits(cached, prompts, max_new_tokens, n), used


def test_prefix_cache_is_used_and_changes_nothing(tiny_model, tokenizer):
    plain = HFGenerator(tiny_model, tokenizer, batch_size=8, prefix_cache=False)
    cached = HFGenerator(tiny_model, tokenizer, batch_size=8, prefix_cache=True)
    enc = cached._encode(PROMPTS, 8)
    assert "past_key_values" in enc  # the shared prefix is long enough to be cached
    lengths = {len(tokenizer(p, add_special_tokens=False)["input_ids"]) for p in PROMPTS}
    assert len(lengths) > 1  # suffixes of different lengths: padding sits between prefix and suffix
    for params in (SamplingParams(n=1, max_new_tokens=8, return_entropy=True),
                   SamplingParams(n=2, temperature=1.0, max_new_tokens=8, seed=4, return_entropy=True)):
        a, b = plain.generate(PROMPTS, params), cached.generate(PROMPTS, params)
        assert _texts(a) == _texts(b)
        for ra, rb in zip(a, b):
            for ca, cb in zip(ra, rb):
                assert ca.num_tokens == cb.num_tokens and abs(ca.entropy - cb.entropy) < 1e-4


def test_short_or_missing_common_prefix_uses_plain_padding(tiny_model, tokenizer):
    gen = HFGenerator(tiny_model, tokenizer, batch_size=8)
    assert "past_key_values" not in gen._encode(["Hello there", "Completely different"], 8)
    assert "past_key_values" not in gen._encode([PROMPTS[0]], 8)  # a single prompt has nothing to share
    (logits_a, out_a), (logits_b, out_b), used = _plain_and_cached(gen.model, tokenizer, ["Hello there", "Completely different"])
    assert used == [] and torch.equal(logits_a, logits_b) and _texts(out_a) == _texts(out_b)


def test_cached_prefix_logits_match_plain_padding_within_rounding(tiny_model, tokenizer):
    (logits_a, out_a), (logits_b, out_b), used = _plain_and_cached(tiny_model, tokenizer, PROMPTS, max_new_tokens=12)
    assert used and used[0] >= 16
    assert (logits_a - logits_b).abs().max() < LOGIT_TOL
    assert torch.equal(logits_a.argmax(-1), logits_b.argmax(-1)) and _texts(out_a) == _texts(out_b)


@pytest.mark.parametrize("case", ["identical", "one_is_a_prefix_of_another", "one_prompt_n_times"])
def test_the_prefix_leaves_every_row_a_token_of_its_own(tiny_model, tokenizer, case):
    """All prompts equal, a prompt that is another's prefix, one prompt sampled n times: the cached prefix
    stops one token short of the shortest prompt, so every row still has last-position logits to start from."""
    prompts, n = {"identical": ([PROMPTS[1]] * 3, 1), "one_is_a_prefix_of_another": ([PROMPTS[3], PROMPTS[3] + " 18"], 1),
                  "one_prompt_n_times": ([PROMPTS[2]], 3)}[case]
    (logits_a, out_a), (logits_b, out_b), used = _plain_and_cached(tiny_model, tokenizer, prompts, n=n, max_new_tokens=8)
    shortest = min(len(tokenizer(p, add_special_tokens=False)["input_ids"]) for p in prompts)
    assert used == [shortest - 1]
    assert (logits_a - logits_b).abs().max() < LOGIT_TOL and _texts(out_a) == _texts(out_b)


def test_sampling_n_per_prompt_with_a_cached_prefix_draws_the_same_tokens(tiny_model, tokenizer):
    plain = HFGenerator(tiny_model, tokenizer, batch_size=5, prefix_cache=False)  # batches of 5 rows: n copies split
    cached = HFGenerator(tiny_model, tokenizer, batch_size=5, prefix_cache=True)
    for params in (SamplingParams(n=4, temperature=1.0, max_new_tokens=10, seed=7),
                   SamplingParams(n=3, temperature=0.7, top_p=0.9, max_new_tokens=10, seed=1)):
        a, b = plain.generate(PROMPTS, params), cached.generate(PROMPTS, params)
        assert _texts(a) == _texts(b) and len(set(c.text for row in a for c in row)) > len(PROMPTS)


def _tiny_mistral(tokenizer, window: int):
    from transformers import MistralConfig, MistralForCausalLM

    torch.manual_seed(0)
    cfg = MistralConfig(vocab_size=len(tokenizer), hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                        num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=512, sliding_window=window,
                        tie_word_embeddings=True, bos_token_id=tokenizer.bos_token_id, eos_token_id=tokenizer.eos_token_id,
                        pad_token_id=tokenizer.pad_token_id)
    model = MistralForCausalLM(cfg).eval()
    model.generation_config.eos_token_id = model.generation_config.pad_token_id = tokenizer.eos_token_id
    return model


def test_a_sliding_window_the_rows_outgrow_falls_back_to_plain_padding(tokenizer):
    """The sliding-window mask counts cache slots: padding between the cached prefix and a shorter row's
    suffix would push prefix tokens out of that row's window early (logits off by ~0.4 here). A window
    the rows cannot reach still gets the cached prefix."""
    short_window = _tiny_mistral(tokenizer, window=12)
    (logits_a, _), (logits_b, _), used = _plain_and_cached(short_window, tokenizer, PROMPTS)
    assert (logits_a - logits_b).abs().max() < LOGIT_TOL
    assert used == []
    long_window = _tiny_mistral(tokenizer, window=256)
    (logits_a, out_a), (logits_b, out_b), used = _plain_and_cached(long_window, tokenizer, PROMPTS)
    assert used and (logits_a - logits_b).abs().max() < LOGIT_TOL and _texts(out_a) == _texts(out_b)


def test_vllm_backend_is_a_config_choice_and_explains_a_missing_install(tiny_model, tokenizer):
    import importlib.util

    from evolm import config
    from evolm.backends import make_generator
    from evolm.errors import ConfigError, UserError

    cfg = config.from_dict(config.ESJob, {}, ["generation.backend='vllm'", "generation.vllm_kv_cache_gb=0.5"])
    assert cfg.generation.backend == "vllm" and cfg.generation.eval_backend == "hf"
    with pytest.raises(ConfigError, match="generation.backend"):
        config.from_dict(config.ESJob, {}, ["generation.backend='sglang'"])
    with pytest.raises(ConfigError, match="generation.vllm_kv_cache_gb"):
        config.from_dict(config.ESJob, {}, ["generation.vllm_kv_cache_gb=-1"])  # 0 is allowed: vLLM sizes it (CUDA engines)
    with pytest.raises(ConfigError, match="generation.backend must be hf in a pipeline"):
        from evolm.pipeline import PipelineJob

        config.from_dict(PipelineJob, {}, ["generation.backend='vllm'"])
    if importlib.util.find_spec("vllm") is None:  # the main environment: one line naming the fix
        with pytest.raises(UserError, match="make vllm"):
            make_generator("vllm", tiny_model, tokenizer)


def test_an_engine_starts_from_the_models_own_files_when_it_has_them(tiny_dir, tiny_model):
    """``backends.vllm._weights_dir``: a model loaded from a directory with config and safetensors starts
    its vLLM engine from those files (no copy written); a model built in memory has none to start from."""
    from transformers import AutoModelForCausalLM

    from evolm.backends.vllm import _weights_dir

    assert _weights_dir(AutoModelForCausalLM.from_pretrained(tiny_dir)) == tiny_dir
    tiny_model.config._name_or_path = ""
    assert _weights_dir(tiny_model) is None
    tiny_model.config._name_or_path = str(tiny_dir.parent)  # a folder without the model's files
    assert _weights_dir(tiny_model) is None
