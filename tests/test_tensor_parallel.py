"""Tensor-parallel shards (``evolm.shards``) against the unsharded tensors, bit for bit, without vLLM:
plain torch tensors split the way vLLM's TP layers split them (column-parallel rows, replicated k/v
heads, row-parallel columns, padded vocabulary), perturbed shard by shard with the counter noise of the
full tensor at each element's global index, equal ``ParamSet.perturb`` on the whole model."""

from __future__ import annotations

import pytest
import torch
from transformers import LlamaConfig, LlamaForCausalLM

from evolm import shards
from evolm.es import shard_noise
from evolm.es.noise import make_noise
from evolm.es.params import ParamSet

HEAD_DIM = 16


def _model():
    torch.manual_seed(0)
    cfg = LlamaConfig(vocab_size=1000, hidden_size=64, intermediate_size=96, num_hidden_layers=2,
                      num_attention_heads=4, num_key_value_heads=2, head_dim=HEAD_DIM, tie_word_embeddings=True)
    return LlamaForCausalLM(cfg).float()


def _specs(model):
    return {n: shards.shard_spec(n, tuple(p.shape), HEAD_DIM) for n, p in model.named_parameters()}


def _bits(t: torch.Tensor) -> torch.Tensor:
    return t.contiguous().view(torch.int32)


def test_specs_follow_vllm_splits():
    specs = _specs(_model())
    kinds = {n.split("layers.0.")[-1]: s.kind for n, s in specs.items() if "layers.1" not in n}
    assert kinds["self_attn.q_proj.weight"] == "rows" and kinds["self_attn.k_proj.weight"] == "heads"
    assert kinds["self_attn.o_proj.weight"] == "columns" and kinds["mlp.down_proj.weight"] == "columns"
    assert kinds["mlp.gate_proj.weight"] == kinds["mlp.up_proj.weight"] == "rows"
    assert kinds["model.embed_tokens.weight"] == "vocab" and kinds["input_layernorm.weight"] == "replicated"


@pytest.mark.parametrize("size", [2, 4])
def test_shards_cover_the_full_tensor(size):
    """Every element of every HF tensor is held by some rank; a rank's slice equals the full tensor at its
    indices; k/v heads fewer than the ranks are replicated (size 4, 2 kv heads); the vocabulary's padding
    (1000 -> 1024 rows) is no element of the HF tensor."""
    model = _model()
    for name, p in model.named_parameters():
        spec = shards.shard_spec(name, tuple(p.shape), HEAD_DIM)
        seen = torch.zeros(p.numel(), dtype=torch.int64)
        for rank in range(size):
            idx = shards.local_indices(spec, rank, size)
            local = shards.local_slice(p.detach(), spec, rank, size)
            assert tuple(local.shape) == shards.local_shape(spec, rank, size)
            assert torch.equal(_bits(local).view(-1), _bits(p.detach()).view(-1)[idx])
            seen[idx] += 1
        assert bool((seen >= 1).all()), name
        if spec.kind in ("rows", "columns", "vocab") or (spec.kind == "heads" and size == 2):
            assert bool((seen == 1).all()), name
    vocab = shards.shard_spec("model.embed_tokens.weight", (1000, 64))
    assert [shards.local_rows(vocab, r, 4) for r in range(4)] == [(0, 256), (256, 256), (512, 256), (768, 232)]


def test_fused_offsets_stack_q_k_v():
    model = _model()
    specs = _specs(model)
    names = [f"model.layers.0.self_attn.{m}_proj.weight" for m in "qkv"]
    assert shards.fused_offsets([specs[n] for n in names], 0, 2) == [(0, 32), (32, 16), (48, 16)]
    assert shards.fused_offsets([specs[n] for n in names], 1, 4) == [(0, 16), (16, 16), (32, 16)]  # kv replicated


@pytest.mark.parametrize("size", [1, 2, 4])
def test_sharded_perturbation_equals_the_full_tensor_bit_for_bit(size):
    """Member (iteration 3, direction 5, sign -1) of counter noise: ParamSet on the whole float32 model, and
    each rank's slice perturbed alone with the full tensor's noise at its global indices, hold the same bits."""
    model = _model()
    params = ParamSet(model, None)
    params.noise = make_noise("counter", 7, params.layout)
    original = {n: p.detach().clone() for n, p in model.named_parameters()}
    sigma, sign = 0.03, -1
    params.perturb(3, 5, sign, sigma)
    perturbed = dict(model.named_parameters())
    index_of = dict(zip(params.names, params.indices))
    checked = 0
    for name, full in original.items():
        if name not in index_of:
            continue
        spec = shards.shard_spec(name, tuple(full.shape), HEAD_DIM)
        keys = params.noise.keys(3, 5, index_of[name])
        for rank in range(size):
            idx = shards.local_indices(spec, rank, size)
            local = shards.local_slice(full, spec, rank, size)
            shard_noise.perturb_shard(local, params.noise, keys, idx, sign * sigma)
            want = shards.local_slice(perturbed[name].detach(), spec, rank, size)
            assert torch.equal(_bits(local), _bits(want)), (name, rank)
            checked += 1
    assert checked >= len(original) * size - size  # every selected tensor, every rank (a tied head counts once)
    params.restore()
    assert all(torch.equal(_bits(p.detach()), _bits(original[n])) for n, p in model.named_parameters())


@pytest.mark.parametrize("sets, message", [
    (["generation.vllm_tensor_parallel_size=0"], "vllm_tensor_parallel_size must be >= 1"),
    (["generation.vllm_tensor_parallel_size=2"], "splits a vLLM engine; generation.backend='hf' has none"),
    (["generation.vllm_tensor_parallel_size=2", "generation.backend='vllm'", "es.perturbation='lowrank'",
      "es.params=['attention','mlp']"], "es.perturbation='lowrank' (LoRA members) is untested"),
    (["generation.vllm_tensor_parallel_size=2", "generation.backend='vllm'", "distributed.workers=2"],
     "distributed.workers=2 (Ray actors, one engine each) is untested"),
    (["generation.vllm_tensor_parallel_size=2", "generation.backend='vllm'", "model.dtype='bfloat16'"],
     "model.dtype='bfloat16' is untested"),
    (["generation.vllm_tensor_parallel_size=2", "generation.backend='vllm'", "model.dtype='float32'", "es.noise='table'"],
     "es.noise='table': TP shards draw counter noise"),
    (["generation.vllm_tensor_parallel_size=2", "generation.backend='vllm'", "model.dtype='float32'", "CUDA"],
     "on CUDA is untested"),
])
def test_tensor_parallel_is_refused_in_one_line(sets, message, monkeypatch):
    from evolm import config, machine
    from evolm.errors import UserError

    cuda = "CUDA" in sets
    monkeypatch.setattr(machine, "cuda_available", lambda: cuda)
    monkeypatch.setattr(machine, "cuda_free_fraction", lambda device="cuda": (60.0, 80.0))
    sets = [s for s in sets if s != "CUDA"]

    with pytest.raises(UserError, match=message.replace("(", r"\(").replace(")", r"\)").replace("[", r"\[")) as e:
        config.from_dict(config.ESJob, {}, ["model.device='cpu'", "distributed.workers=0", *sets])
    assert "\n" not in str(e.value)


@pytest.mark.parametrize("size", [2, 4])
def test_paramset_over_shards_with_shard_noise_equals_the_full_model(size):
    """What a TP worker runs: ``ParamSet.from_tensors`` over each rank's slices with ``ShardNoise`` (noise by
    global index, torch ops) perturbs, restores and updates to the full model's bits (ParamSet with the
    compiled kernel where it builds)."""
    model = _model()
    params = ParamSet(model, None)
    params.noise = make_noise("counter", 11, params.layout)
    specs = {n: shards.shard_spec(n, tuple(t.shape), HEAD_DIM) for n, t in zip(params.names, params.tensors)}
    ranks = []
    for rank in range(size):
        maps = {i: shards.local_indices(specs[n], rank, size) for i, n in zip(params.indices, params.names)}
        views = [shards.local_slice(t.detach(), specs[n], rank, size) for n, t in zip(params.names, params.tensors)]
        ranks.append(ParamSet.from_tensors(shard_noise.ShardNoise(11, maps), params.indices, params.names, views))

    def agree():
        for rank, ps in enumerate(ranks):
            for n, full, local in zip(params.names, params.tensors, ps.tensors):
                assert torch.equal(_bits(local), _bits(shards.local_slice(full.detach(), specs[n], rank, size))), (n, rank)

    for ps in [params, *ranks]:
        ps.perturb(2, 1, 1, 0.05)
    agree()
    for ps in [params, *ranks]:
        ps.restore()
    agree()
    for ps in [params, *ranks]:
        assert ps.apply_update(2, [0.5, -1.25, 0.0, 2.0], 1e-3)
    agree()


def test_tensor_parallel_two_on_the_cpu_validates(monkeypatch):
    from evolm import config, machine

    monkeypatch.setattr(machine, "cuda_available", lambda: False)
    cfg = config.from_dict(config.ESJob, {}, ["model.device='cpu'", "distributed.workers=0", "model.dtype='float32'",
                                              "generation.backend='vllm'", "generation.vllm_tensor_parallel_size=2"])
    assert cfg.generation.vllm_tensor_parallel_size == 2


def test_grpo_refuses_tensor_parallel_in_one_line():
    from evolm import config, grpo
    from evolm.errors import UserError

    with pytest.raises(UserError, match="evolm grpo has none") as e:
        config.from_dict(grpo.GRPOJob, {}, ["generation.vllm_tensor_parallel_size=2"])
    assert "\n" not in str(e.value)
