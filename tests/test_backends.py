"""The Hugging Face backend: shared-prefix caching gives the same completions as plain left padding."""

from __future__ import annotations

import pytest

from evolm.backends.base import SamplingParams
from evolm.backends.hf import HFGenerator

PREFIX = ("You are a careful calculator. Here is how to answer: read the question, add the numbers, "
          "and reply with the sum only.\n")
PROMPTS = [PREFIX + q for q in ("What is 1 + 2?", "What is 40 + 41 plus 17 minus 3?", "Sum 7 and 8.", "9 + 9 =")]


def _texts(out):
    return [[c.text for c in row] for row in out]


def test_prefix_cache_is_used_and_changes_nothing(tiny_model, tokenizer):
    plain = HFGenerator(tiny_model, tokenizer, batch_size=8, prefix_cache=False)
    cached = HFGenerator(tiny_model, tokenizer, batch_size=8, prefix_cache=True)
    enc = cached._encode(PROMPTS)
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
    assert "past_key_values" not in gen._encode(["Hello there", "Completely different"])
    assert "past_key_values" not in gen._encode([PROMPTS[0]])  # a single prompt has nothing to share


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
        config.from_dict(config.ESJob, {}, ["generation.vllm_kv_cache_gb=0"])
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
