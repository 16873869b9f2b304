"""The vLLM backend against a real vLLM engine on the embedded SmolLM2-135M (no mocks).

Marked ``vllm``; skipped where vLLM is not importable (the main environment), run with
``make test-vllm`` (``.venv-vllm``). One engine is shared by the whole module: it takes ~1-4 minutes
to start on a CPU (torch.compile). Weight identity is checked with SHA-256 of every tensor's bytes,
computed inside the worker for the engine's side.
"""

from __future__ import annotations

import copy
import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch

pytestmark = pytest.mark.vllm
pytest.importorskip("vllm")

from evolm import models  # noqa: E402
from evolm.backends import SamplingParams  # noqa: E402
from evolm.backends.hf import HFGenerator  # noqa: E402
from evolm.backends.vllm import VLLMGenerator  # noqa: E402
from evolm.backends.vllm import digest  # noqa: E402
from evolm.es.noise import make_noise  # noqa: E402
from evolm.es.params import ParamSet  # noqa: E402
from evolm.tasks import make_task  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def setup():
    """``(generator, driver model, reference HF model, tokenizer, prompts)``; one engine per module."""
    torch.set_num_threads(1)
    model, tok = models.load(models.DEFAULT_MODEL, threads=1)
    reference = copy.deepcopy(model)  # the HF backend's copy: ES on it must match ES inside the engine
    generator = VLLMGenerator(model, tok, threads=1)
    task = make_task("arithmetic", "qiu", None, digits=2, operators="+", terms=2)
    prompts = [task.render_prompt(e, tok) for e in task.examples("train", 16, seed=3)]
    yield generator, model, reference, tok, prompts
    generator.close()


def _hf_paramset(model, seed: int) -> ParamSet:
    """A ParamSet over all of ``model``'s tensors with the member-offset noise table of ``seed``."""
    params = ParamSet(model, None)
    params.noise = make_noise("table", seed, params.layout)
    return params


def _engine_digests(generator) -> dict[str, str]:
    return generator.rpc("es_digests", None)[0]


def _model_digests(model, names=None) -> dict[str, str]:
    params = dict(model.named_parameters(remove_duplicate=False))
    return {n: digest(params[n].detach()) for n in (names or params)}


def _texts(outs):
    return [[c.text for c in o] for o in outs]


def test_greedy_completions_match_hf(setup):
    generator, model, reference, tok, prompts = setup
    params = SamplingParams(max_new_tokens=16)
    ours = generator.generate(prompts, params)
    theirs = HFGenerator(reference, tok, batch_size=64).generate(prompts, params)
    same = [a[0].text == b[0].text and a[0].num_tokens == b[0].num_tokens and a[0].finished == b[0].finished
            for a, b in zip(ours, theirs)]
    # float32 on both sides; vLLM's attention and GEMM kernels differ from transformers', so a near-tie
    # may flip one greedy token: all but one prompt must agree (all 32 of 32 did when measured)
    assert sum(same) >= len(prompts) - 1, list(zip(_texts(ours), _texts(theirs)))
    assert all(c.entropy is None for o in ours for c in o)  # vLLM gives top-k log-probs only: no entropy


def test_engine_starts_with_the_driver_weights(setup):
    generator, model, reference, tok, prompts = setup
    assert _engine_digests(generator) == _model_digests(model)
    # from the model's own files: no copy of the model written at start-up, nothing pushed
    assert generator.source == Path(models.local_dir(models.DEFAULT_MODEL))
    assert not (generator.workdir / "model").exists() and generator.pushes == 0


def test_member_weights_bit_identical_to_hf_paramset_and_restore_exact(setup):
    generator, model, reference, tok, prompts = setup
    engine = generator.attach_paramset(_hf_paramset(model, 11))
    hf = _hf_paramset(reference, 11)
    before = _engine_digests(generator)
    for iteration, direction, sign in ((0, 0, 1), (0, 1, -1), (3, 5, 1)):
        engine.perturb(iteration, direction, sign, 1e-3)
        hf.perturb(iteration, direction, sign, 1e-3)
        member = _engine_digests(generator)
        assert member == _model_digests(reference), "a member's weights differ between vLLM and the HF ParamSet"
        assert sum(member[n] != before[n] for n in engine.names) == len(engine.names)  # every tensor moved
        engine.restore()
        hf.restore()
        assert _engine_digests(generator) == before  # restore is bit-exact inside the engine
    assert _model_digests(reference) == before


def test_update_matches_hf_and_driver(setup):
    generator, model, reference, tok, prompts = setup
    engine = generator.attach_paramset(_hf_paramset(model, 11))
    hf = _hf_paramset(reference, 11)
    coefficients, scale = [1.0, -0.5, 0.25, 0.0], 2e-4
    before = _model_digests(model)
    assert engine.apply_update(7, coefficients, scale)
    hf.apply_update(7, coefficients, scale)
    assert _engine_digests(generator) == _model_digests(reference) != before
    assert engine.deferred == 1 and _model_digests(model) == before  # the driver's copy waits until it is read
    assert engine.catch_up() == 1  # checks the driver against the workers' checksum (raises otherwise)
    assert _engine_digests(generator) == _model_digests(reference) == _model_digests(model)


def test_prefix_cache_does_not_leak_across_weight_changes(setup):
    generator, model, reference, tok, prompts = setup
    engine = generator.attach_paramset(_hf_paramset(model, 5))
    params = SamplingParams(max_new_tokens=12)
    sigma = 0.02  # large enough to change greedy completions
    base = generator.generate(prompts, params)  # fills the prefix cache with the base weights' KV
    engine.perturb(1, 0, 1, sigma)
    member = generator.generate(prompts, params)
    generator.reset_prefix_cache()
    fresh = generator.generate(prompts, params)  # computed from scratch at the perturbed weights
    engine.restore()
    assert _texts(member) == _texts(fresh)
    assert _texts(member) != _texts(generator.generate(prompts, params))  # the perturbation matters
    # the check can fail: perturbing without a reset reuses the stale prefix and changes completions
    generator.generate(prompts, params)  # base weights' KV in the cache again
    generator.rpc("es_perturb", 1, 0, 1, sigma)
    stale = generator.generate(prompts, params)
    generator.rpc("es_restore")
    generator.reset_prefix_cache()
    assert _texts(stale) != _texts(fresh)
    assert _texts(generator.generate(prompts, params)) == _texts(base)


def test_sampling_is_seeded_and_shared(setup):
    generator, model, reference, tok, prompts = setup
    params = SamplingParams(n=3, temperature=1.0, max_new_tokens=12, seed=42)
    first = generator.generate(prompts[:6], params)
    assert [len(o) for o in first] == [3] * 6
    assert _texts(first) == _texts(generator.generate(prompts[:6], params))
    other = generator.generate(prompts[:6], SamplingParams(n=3, temperature=1.0, max_new_tokens=12, seed=43))
    assert _texts(first) != _texts(other)
    assert all(1 <= c.num_tokens <= 12 and (c.finished or c.num_tokens == 12) for o in first for c in o)


def test_weights_changed_outside_es_are_pushed(setup):
    generator, model, reference, tok, prompts = setup
    state = {n: t.detach().clone() for n, t in model.state_dict().items()}
    with torch.no_grad():
        model.model.norm.weight.mul_(1.5)  # an in-place change, as a loaded checkpoint or a GRPO step makes
    generator.sync_weights()
    assert _engine_digests(generator) == _model_digests(model)
    model.load_state_dict(state)
    generator.sync_weights()
    assert _engine_digests(generator) == _model_digests(model)
    assert _model_digests(model, ["model.norm.weight"])["model.norm.weight"] == digest(state["model.norm.weight"])


def test_heldout_evaluation_through_the_engine_gives_the_hf_records(setup):
    """``generation.eval_backend = "same"``: held-out evaluation on the engine writes the same per-problem
    records as the HF backend (greedy: the same answers and verdicts), only token entropy is absent."""
    from evolm.evaluate import evaluate_task

    generator, model, reference, tok, prompts = setup
    task = make_task("arithmetic", "qiu", None, digits=2, operators="+", terms=2)
    examples = task.examples("test", 12, seed=5)
    sampling = SamplingParams(n=1, temperature=0.0, max_new_tokens=16, seed=7)
    on_engine = evaluate_task(generator, task, tok, examples, sampling, ks=(1,), progress=False)
    on_hf = evaluate_task(HFGenerator(model, tok), task, tok, examples, sampling, ks=(1,), progress=False)
    assert [p.id for p in on_engine.problems] == [p.id for p in on_hf.problems] == [str(e.id) for e in examples]
    assert [p.answers for p in on_engine.problems] == [p.answers for p in on_hf.problems]
    assert [p.correct for p in on_engine.problems] == [p.correct for p in on_hf.problems]
    assert on_engine.summary["pass@1"] == on_hf.summary["pass@1"] and on_engine.sampling == on_hf.sampling
    assert all(e is None for p in on_engine.problems for e in p.entropy)
    assert all(e is not None for p in on_hf.problems for e in p.entropy)


def test_es_cli_end_to_end_two_iterations(tmp_path):
    """``evolm es --set generation.backend="vllm"``: a real run; final/ in HF names; the seed log replays
    the final weights bit for bit on the base model with the HF-side ParamSet. sigma 0.02 makes the
    members' greedy completions differ (at 1e-3 all four members scored the same and no update applied)."""
    out = tmp_path / "runs"
    cmd = [sys.executable, "-m", "evolm", "es", "--config", str(ROOT / "configs" / "es-arithmetic.toml"),
           "--set", 'generation.backend="vllm"', "--set", "es.iterations=2", "--set", "es.population=4",
           "--set", "es.prompts_per_iteration=8", "--set", "es.sigma=0.02", "--set", "eval.before_after=false", "--set", "probe.every=0",
           "--set", "run.checkpoint_every=1", "--set", f'run.out_dir="{out}"', "--set", 'run.name="vllm-e2e"',
           "--set", "run.progress=false"]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=1800)
    assert proc.returncode == 0, proc.stderr[-3000:]
    run = out / "vllm-e2e"
    records = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    train = [r for r in records if r.get("kind") == "train"]
    assert [r["step"] for r in train] == [1, 2] and all(r["gen_tokens"] > 0 for r in train)
    from safetensors.torch import load_file

    final = load_file(str(run / "final" / "model.safetensors"))
    assert "model.layers.0.self_attn.q_proj.weight" in final
    assert not any("qkv_proj" in n or "gate_up_proj" in n for n in final)
    from evolm import config as config_mod
    from evolm.es.engine import replay

    cfg = config_mod.load(config_mod.ESJob, run / "config.toml")
    base, _ = models.load(models.DEFAULT_MODEL, threads=1)
    seed_log = [json.loads(x) for x in (run / "seed_log.jsonl").read_text().splitlines()]
    assert any(r.get("status") == "applied" for r in seed_log)
    replay(base, seed_log, cfg)
    replayed = dict(base.named_parameters())
    assert all(torch.equal(replayed[n], t) for n, t in final.items() if n in replayed)


def test_bf16_run_keeps_its_masters_in_the_engine_and_checkpoints_resume_and_replay_them(tmp_path):
    """bfloat16 generation with float32 masters on vLLM: the masters live in the worker only (the
    driver's ParamSet holds none), yet the step-1 checkpoint's ``masters.safetensors`` and ``final/`` are
    the float32 masters that replaying the seed log on the HF side gives, bit for bit, and a resume from
    the step-1 checkpoint (masters sent back to the worker) ends on the same weights as the whole run."""
    out = tmp_path / "runs"

    def es(*extra):
        cmd = [sys.executable, "-m", "evolm", "es", "--config", str(ROOT / "configs" / "es-arithmetic.toml"),
               "--set", 'generation.backend="vllm"', "--set", 'model.dtype="bfloat16"', "--set", "es.iterations=2",
               "--set", "es.population=4", "--set", "es.prompts_per_iteration=8", "--set", "es.sigma=0.02",
               "--set", "eval.before_after=false", "--set", "probe.every=0", "--set", "run.checkpoint_every=1",
               "--set", "run.keep_checkpoints=2", "--set", f'run.out_dir="{out}"', "--set", "run.progress=false", *extra]
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=1800)
        assert proc.returncode == 0, proc.stderr[-3000:]

    es("--set", 'run.name="bf16"')
    run = out / "bf16"
    from safetensors.torch import load_file

    from evolm import config as config_mod
    from evolm.es.engine import replay

    seed_log = [json.loads(x) for x in (run / "seed_log.jsonl").read_text().splitlines()]
    assert [r.get("status") for r in seed_log if "iteration" in r] == ["applied", "applied"]  # training moved the weights
    cfg = config_mod.load(config_mod.ESJob, run / "config.toml")
    replayed = {}
    for step in (1, 2):
        base, _ = models.load(models.DEFAULT_MODEL, threads=1, dtype="bfloat16")
        params = replay(base, [r for r in seed_log if int(r.get("step", 0)) <= step], cfg)
        assert params.masters is not None  # the HF side of the same arithmetic keeps them
        replayed[step] = params.state_dict()
    assert any(not torch.equal(replayed[1][n], replayed[2][n]) for n in replayed[1])
    ckpt = load_file(str(run / "checkpoints" / "step_000001" / "masters.safetensors"))
    assert ckpt.keys() == replayed[1].keys() and all(torch.equal(ckpt[n], replayed[1][n]) for n in ckpt)
    final = load_file(str(run / "final" / "model.safetensors"))
    assert all(final[n].dtype == torch.float32 and torch.equal(final[n], replayed[2][n]) for n in replayed[2] if n in final)

    # one load, as a Ray actor starts: the HF model is only a structure on meta; the engine reads the spec's
    # files, then the step-1 checkpoint's, the masters come from the checkpoint; it holds the replayed step 1
    from evolm.checksum import tensor_checksum
    from evolm.es.engine import build_paramset, load_masters, seed_log_header
    from evolm.runs import RunDir

    structure, tok = models.load_structure(models.DEFAULT_MODEL, dtype="bfloat16")
    step1 = run / "checkpoints" / "step_000001"
    generator = VLLMGenerator(structure, tok, threads=1, checkpoint=step1)
    try:
        params = build_paramset(structure, cfg, seed_log_header(RunDir(run).seed_log()), generator)
        load_masters(params, step1, structure)
        masters = [replayed[1][n] for n in params.names]
        assert params.engine_checksums() == ([tensor_checksum(m) for m in masters]
                                             + [tensor_checksum(m.to(torch.bfloat16)) for m in masters])
        assert all(p.device.type == "meta" for p in structure.parameters()) and generator.pushes == 0
    finally:
        generator.close()

    resumed = tmp_path / "resumed"
    import shutil

    shutil.copytree(run, resumed)
    shutil.rmtree(resumed / "final")
    shutil.rmtree(resumed / "checkpoints" / "step_000002", ignore_errors=True)
    proc = subprocess.run([sys.executable, "-m", "evolm", "es", "--resume", str(resumed), "--set", "run.progress=false"],
                          capture_output=True, text=True, timeout=1800)
    assert proc.returncode == 0, proc.stderr[-3000:]
    again = load_file(str(resumed / "final" / "model.safetensors"))
    assert all(torch.equal(again[n], final[n]) for n in final)


def test_a_bf16_driver_holds_no_masters_of_its_own(setup):
    """The driver's ParamSet of a bfloat16 vLLM run keeps no float32 copy (4 B per parameter): the
    masters the worker holds come back, when asked, equal to the driver's weights cast up."""
    from evolm import config as config_mod
    from evolm.es.engine import build_paramset

    model, tok = models.load(models.DEFAULT_MODEL, threads=1, dtype="bfloat16")
    generator = VLLMGenerator(model, tok, threads=1)
    try:
        cfg = config_mod.from_dict(config_mod.ESJob, {}, ["model.dtype='bfloat16'", "generation.backend='vllm'"])
        params = build_paramset(model, cfg, generator=generator)
        assert params.masters_in_engine and params.local.masters is None and params.keeps_masters
        assert params.perturb_path == "masters"
        masters = params.masters
        assert all(m.dtype == torch.float32 and torch.equal(m, t.float()) for m, t in zip(masters, params.tensors))
        with pytest.raises(RuntimeError, match="masters live in its replica"):
            params.local.perturb(0, 0, 1, 1e-3)
    finally:
        generator.close()


ENGINE_PARENT = """
import sys, time


def main():
    import psutil
    import torch

    torch.set_num_threads(1)
    from evolm import models
    from evolm.backends.vllm import VLLMGenerator

    model, tok = models.load(models.DEFAULT_MODEL, threads=1)
    generator = VLLMGenerator(model, tok, threads=1)
    print("ENGINE_PIDS", *(p.pid for p in psutil.Process().children(recursive=True)), flush=True)
    time.sleep(600)


if __name__ == "__main__":  # vLLM spawns its engine core on the CPU: the main module is imported again there
    main()
"""


def test_a_killed_parent_leaves_no_engine_process(tmp_path):
    """SIGKILL the process that started an engine: vLLM's engine core and its worker go with it (they arm
    PR_SET_PDEATHSIG through evolm's vllm.general_plugins entry point and evolm.es.vllm_worker). Before,
    both kept running (seen: VLLM::EngineCore and VLLM::Worker left after their parent was killed)."""
    import importlib.metadata
    import os
    import signal
    import time

    import psutil

    plugins = {e.value for e in importlib.metadata.entry_points(group="vllm.general_plugins")}
    assert "evolm.backends.vllm:die_with_parent" in plugins, "evolm's entry points are stale: reinstall it (make vllm)"
    script = tmp_path / "parent.py"
    script.write_text(ENGINE_PARENT)
    parent = subprocess.Popen([sys.executable, str(script)], stdout=subprocess.PIPE, text=True)
    try:
        line = next((line for line in parent.stdout if line.startswith("ENGINE_PIDS")), "")
        engine = [int(pid) for pid in line.split()[1:]]
        assert engine, "the engine started no process"
    finally:
        parent.kill()
        parent.wait()
    deadline, left = time.time() + 20, engine
    while left and time.time() < deadline:
        left = [p for p in engine if psutil.pid_exists(p) and psutil.Process(p).status() != psutil.STATUS_ZOMBIE]
        time.sleep(0.2)
    for pid in left:
        os.kill(pid, signal.SIGKILL)
    assert not left, f"engine processes outlived their parent: {left}"
