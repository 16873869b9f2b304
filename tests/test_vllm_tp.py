"""Tensor parallelism on vLLM's CPU backend: a TP = 2 engine's perturbed members and updated weights equal a
TP = 1 engine's bit for bit (``evolm.shards``: each rank perturbs its slice with the noise of the element's
index in the full HF tensor).

Marked ``vllm`` (``make test-vllm``). SmolLM2-135M has 9 attention heads and 3 key/value heads, which do not
split over 2 ranks, so the test cuts it down: 8 heads, 2 key/value heads, 2 layers, hidden size 512, its
weights the real model's leading slices, saved as safetensors in a temporary directory. The engines run
one after the other (two engines in one process are not what evolm does)."""

from __future__ import annotations

import pytest
import torch

pytestmark = pytest.mark.vllm
pytest.importorskip("vllm")

from evolm import models, shards  # noqa: E402
from evolm.backends import SamplingParams  # noqa: E402
from evolm.backends.vllm import VLLMGenerator  # noqa: E402
from evolm.es.noise import make_noise  # noqa: E402
from evolm.es.params import ParamSet  # noqa: E402

PROMPTS = ["1 + 2 =", "The capital of France is", "def add(a, b):", "Once upon a time"]
MEMBERS = [(0, 1, 0.02), (1, -1, 0.02), (2, 1, 0.05)]  # (direction, sign, sigma) of iteration 0


def cut_down_smollm2(out):
    """SmolLM2-135M with 8 heads (2 key/value heads), 2 layers: the real weights' leading slices."""
    from transformers import LlamaConfig, LlamaForCausalLM

    model, tok = models.load(models.DEFAULT_MODEL, threads=1)
    cfg = model.config
    head_dim = cfg.hidden_size // cfg.num_attention_heads
    small = LlamaForCausalLM(LlamaConfig(**{**cfg.to_dict(), "hidden_size": 8 * head_dim, "num_attention_heads": 8,
                                           "num_key_value_heads": 2, "num_hidden_layers": 2, "head_dim": head_dim}))
    full = model.state_dict()
    small.load_state_dict({n: full[n][tuple(slice(0, s) for s in p.shape)].clone()
                           for n, p in small.state_dict().items()})
    small.save_pretrained(out, safe_serialization=True)
    tok.save_pretrained(out)
    return tok


def _run(path, tok, tp):
    """Greedy completions of the centre and of each member, then one update: the texts and every HF tensor
    as the engine holds it afterwards (TP ranks' slices reassembled)."""
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(path, torch_dtype=torch.float32)
    gen = VLLMGenerator(model, tok, threads=1, kv_cache_gb=0.25, enforce_eager=True, max_model_len=256,
                        tensor_parallel_size=tp)
    try:
        local = ParamSet(model, None)
        local.noise = make_noise("counter", 5, local.layout)
        ps = gen.attach_paramset(local)
        params = SamplingParams(max_new_tokens=12)
        texts = [[c[0].text for c in gen.generate(PROMPTS, params)]]
        for direction, sign, sigma in MEMBERS:
            ps.perturb(0, direction, sign, sigma)
            texts.append([c[0].text for c in gen.generate(PROMPTS, params)])
            ps.restore()
        assert ps.apply_update(0, [1.0, -0.5, 2.0], 1e-2)
        ps.catch_up()  # the driver's replay against every rank's checksums of its slices
        names = list(dict(model.named_parameters()))
        from safetensors.torch import load_file

        files, ranks = gen.rpc("es_local", names, str(path) + f".tp{tp}"), [r for r, _ in gen.rpc("es_rank")]
        answers = [load_file(f) for f in files]
        weights = {}
        for name in names:
            full = dict(model.named_parameters())[name].detach()
            out = torch.full_like(full, float("nan")).view(-1)
            spec = shards.shard_spec(name, tuple(full.shape), model.config.head_dim)
            for rank, answer in zip(ranks, answers):
                out[shards.local_indices(spec, rank, tp)] = answer[name].reshape(-1)
            weights[name] = out.view_as(full)
        return texts, weights
    finally:
        gen.close()


def test_tp2_members_and_update_equal_tp1_bit_for_bit(tmp_path):
    torch.set_num_threads(1)
    tok = cut_down_smollm2(tmp_path / "smollm2-8h")
    texts1, weights1 = _run(tmp_path / "smollm2-8h", tok, 1)
    texts2, weights2 = _run(tmp_path / "smollm2-8h", tok, 2)
    assert texts2 == texts1
    assert len({tuple(t) for t in texts1}) > 1  # the members generate differently from the centre
    for name, w in weights1.items():
        assert torch.equal(w.view(torch.int32), weights2[name].view(torch.int32)), name
