"""A Ray population of vLLM actors against the local vLLM run and the HF run (real engines, real Ray).

``generation.backend = "vllm"`` with ``distributed.workers = 2``: every actor starts its own vLLM-CPU
engine and perturbs inside it, the driver holds no engine. Once this trained nothing (each actor
perturbed its HF copy while its engine scored the base weights: every member equal, every update
"zero"), so besides bit-identical weights the module checks that the actors' members differ.

Marked ``vllm`` and ``ray``; skipped where either is missing, run by ``make test-vllm`` (.venv-vllm has
Ray). One HF run, one local vLLM run and two K = 2 runs of the same config (the second with an actor
killed after update 1), shared by the module: six engine start-ups in all, on the embedded
SmolLM2-135M in float32 at 2 updates of N = 4 members x 8 prompts x 8 greedy tokens. The task is the
vowel-share toy task of conftest (a continuous reward: members whose completions differ score
differently; arithmetic at 8 tokens scored every member 0), shipped to the actors by value. The two vLLM
runs evaluate on their engines (``generation.eval_backend = "same"``, 4 problems before and after): the
actors' tables must be the local run's, the driver must not generate, and it drops its copy of the weights.
"""

from __future__ import annotations

import json
import os
import signal
import time
from pathlib import Path

import pytest
import torch

pytestmark = [pytest.mark.vllm, pytest.mark.ray]
pytest.importorskip("vllm")
pytest.importorskip("ray")

from evolm import config  # noqa: E402
from evolm.runs import RunDir  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
ITERATIONS = 2
POPULATION = 4


def _cfg(root: Path, name: str, backend: str, workers: int) -> config.ESJob:
    # the vLLM runs evaluate on their engines (eval_backend "same"): the actors' tables must be the local run's
    evals = (["generation.eval_backend='same'", "eval.before_after=true", "eval.count=4", "eval.n_samples=2",
              "eval.k=[1, 2]", "eval.max_new_tokens=8"] if backend == "vllm" else ["eval.before_after=false"])
    sets = [f"run.out_dir='{root}'", f"run.name='{name}'", "run.progress=false", "run.checkpoint_every=0",
            *evals, "probe.every=0", "model.threads=1", "generation.max_new_tokens=8",
            f"es.iterations={ITERATIONS}", f"es.population={POPULATION}", "es.prompts_per_iteration=8",
            "es.sigma=0.02",  # members' greedy completions differ at 0.02 (at 1e-3 they all scored alike)
            f"es.noise_table_size={1 << 25}",  # >= the embedding's 28.3M entries; 134 MB per process, not 670 MB
            f"generation.backend='{backend}'", "generation.vllm_enforce_eager=true", "generation.vllm_kv_cache_gb=0.25",
            "generation.vllm_max_model_len=512", f"distributed.workers={workers}", "distributed.threads=1"]
    return config.load(config.ESJob, ROOT / "configs" / "es-arithmetic.toml", sets)


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    from evolm.backends import vllm as vllm_backend
    from evolm.backends.hf import HFGenerator
    from evolm.jobs import run_es

    from conftest import make_vowel_task

    os.environ.setdefault("RAY_memory_monitor_refresh_ms", "0")  # a shared machine's memory is not the test's (test_ray_population)
    root = tmp_path_factory.mktemp("vllm-ray")
    task = make_vowel_task()
    out, seconds = {}, {}
    for name, backend, workers in (("hf", "hf", 0), ("vllm", "vllm", 0)):
        t0 = time.perf_counter()
        out[name] = run_es(_cfg(root, name, backend, workers), task=task, quiet=True)
        seconds[name] = time.perf_counter() - t0

    def no_driver_engine(*args, **kwargs):
        raise AssertionError("the driver of a Ray population of vLLM actors started a vLLM engine")

    def no_driver_generation(*args, **kwargs):
        raise AssertionError("the driver generated: the vLLM actors evaluate (generation.eval_backend = 'same')")

    from evolm.es import ray_population

    factory, made = ray_population.factory, []

    def keeping(comps, run, **kw):  # the population, to read what its actors reported once they were up
        make = factory(comps, run, **kw)
        return lambda *a: made.append(make(*a)) or made[-1]

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(vllm_backend.VLLMGenerator, "__init__", no_driver_engine)  # the actors' processes are not patched
        mp.setattr(HFGenerator, "generate", no_driver_generation)
        mp.setattr(ray_population, "factory", keeping)
        t0 = time.perf_counter()
        out["ray"] = run_es(_cfg(root, "ray", "vllm", 2), task=task, quiet=True)
        seconds["ray"] = time.perf_counter() - t0

        def kill_an_actor(step, record):  # after update 1: SIGKILL the second actor (its engine dies with it)
            if step == 1:
                os.kill(max(made[-1]._info.values(), key=lambda info: info["pid"])["pid"], signal.SIGKILL)

        t0 = time.perf_counter()
        out["killed"] = run_es(_cfg(root, "killed", "vllm", 2), task=task, quiet=True, callbacks=(kill_an_actor,))
        seconds["killed"] = time.perf_counter() - t0
    out["replaced"] = made[1].copied, made[1].replayed, made[1].restarts
    out["actors"] = [dict(info) for info in made[0]._info.values()]
    out["unwaited"] = made[0].unwaited
    out["remote"] = made[0].remote
    for name, run in ((k, v) for k, v in out.items() if k not in ("actors", "unwaited", "remote", "replaced")):  # with -s: the figures docs/vllm.md quotes
        per_update = [round(r["seconds"], 1) for r in _train(run)]
        print(f"\n[vllm-ray] {name}: {seconds[name]:.0f} s in all (start-up included), seconds per update {per_update}")
    return out


def _train(run: RunDir) -> list[dict]:
    return [r for r in run.metrics() if r.get("kind") == "train"]


def _final(run: RunDir) -> dict[str, torch.Tensor]:
    from safetensors.torch import load_file

    state = {}
    for f in sorted((run.path / "final").glob("*.safetensors")):
        state.update(load_file(str(f)))
    return state


def _assert_same_run(run: RunDir, reference: RunDir) -> None:
    a, b = _final(run), _final(reference)
    assert a.keys() == b.keys()
    assert not any("qkv_proj" in n or "gate_up_proj" in n for n in a)  # Hugging Face names, not the engine's
    for name in a:
        assert torch.equal(a[name], b[name]), name
    assert [r["fitness"] for r in _train(run)] == [r["fitness"] for r in _train(reference)]
    assert run.seed_log() == reference.seed_log()


def test_the_members_differ_inside_the_actors_engines(runs):
    """The silent no-op this replaced: every actor's engine scored the base weights, so all N fitnesses
    of an update were equal and no update applied. Where the local vLLM run's members differ, the
    actors' must too."""
    out = runs
    local, ray = _train(out["vllm"]), _train(out["ray"])
    assert len(local) == len(ray) == ITERATIONS
    for mine, theirs in zip(ray, local):
        assert len(set(theirs["fitness"])) > 1, "the local vLLM run's members scored alike: the config cannot tell"
        assert len(set(mine["fitness"])) > 1, f"update {mine['step']}: every Ray+vLLM member scored {mine['fitness'][0]}"
    assert {r["update_status"] for r in ray} == {"applied"}


def test_two_vllm_actors_reach_the_local_vllm_run_bit_for_bit(runs):
    out = runs
    _assert_same_run(out["ray"], out["vllm"])


def test_two_vllm_actors_reach_the_hf_run_bit_for_bit(runs):
    out = runs
    _assert_same_run(out["ray"], out["hf"])


def test_both_actors_scored_on_their_own_engines_and_released_them(runs):
    out = runs
    records = _train(out["ray"])
    assert all(r["ray_actors"] == 2 and r["ray_restarts"] == 0 for r in records)
    assert all(sum(r["ray_members"].values()) == POPULATION for r in records)
    assert any(len(r["ray_members"]) == 2 for r in records)  # both actors took members
    assert all(r["gen_tokens"] > 0 for r in records)  # cost counters come back from the actors' engines
    # one engine per actor, each reported by its actor (the listings after each update once missed one); none in
    # the driver (patched out), and none outlives the run
    reported = [set(info["engine_pids"]) for info in out["actors"]]
    assert len(reported) == 2 and all(reported) and not reported[0] & reported[1], reported
    pids = reported[0] | reported[1]
    deadline = time.time() + 30
    while any(_alive(pid) for pid in pids) and time.time() < deadline:
        time.sleep(0.5)
    assert not any(_alive(pid) for pid in pids), "an actor's vLLM engine outlived the run"


def _alive(pid: int) -> bool:
    import psutil

    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


def test_each_actor_loads_the_weights_once_into_its_engine(runs):
    """An actor's HF model is a structure on ``meta`` (``models.load_structure``): its engine reads the weights
    from the spec's files, the only copy it ever holds (bit-identical runs: the tests above). Before, it loaded
    an HF copy to start its engine from, then dropped it."""
    out = runs
    assert len(out["actors"]) == 2
    assert all(info["hf_copy_bytes"] == 0 for info in out["actors"]), out["actors"]
    assert all(info["hf_loads"] == 0 for info in out["actors"]), out["actors"]  # one load: the engine's


def test_the_actors_evaluate_on_their_engines_and_the_driver_holds_no_weights(runs):
    """With ``generation.eval_backend = "same"`` the held-out evaluations before and after training run on the
    actors' engines (the driver's generator is patched to fail), and their tables are the local vLLM run's
    bit for bit; the driver dropped its copy (``final/`` was read from an actor: equal to the local run's,
    ``_assert_same_run`` above). Before, eval_backend "same" was refused and the driver kept an HF copy."""
    out = runs
    assert out["remote"], "the driver kept its copy of the weights"
    drop = ("seconds", "time")
    for label in ("before", "after"):
        mine, theirs = (json.loads((out[k].path / f"eval_{label}.json").read_text()) for k in ("ray", "vllm"))
        assert mine["problems"] and _without(mine, drop) == _without(theirs, drop), label


def _without(value, keys):
    if isinstance(value, dict):
        return {k: _without(v, keys) for k, v in value.items() if not any(t in k for t in keys)}
    if isinstance(value, list):
        return [_without(v, keys) for v in value]
    return value


def test_a_killed_vllm_actor_is_replaced_by_copying_a_live_ones_engine_and_the_run_is_unchanged(runs):
    """An actor killed after update 1 is replaced; the replacement's engine loads the spec and then receives the
    live actor's selected tensors from its engine (``es_piece`` -> ``es_put``), replaying nothing (vLLM
    replacements replayed every update since the newest checkpoint before). Weights, fitnesses, seed log and
    the held-out table after training are the uninterrupted local run's."""
    out = runs
    copied, replayed, restarts = out["replaced"]
    assert (copied, replayed, restarts) == (1, 0, 1), out["replaced"]
    _assert_same_run(out["killed"], out["vllm"])
    mine, theirs = (json.loads((out[k].path / "eval_after.json").read_text()) for k in ("killed", "vllm"))
    assert _without(mine, ("seconds", "time")) == _without(theirs, ("seconds", "time"))


def test_the_driver_sends_the_vllm_actors_updates_without_waiting(runs):
    """The engines report max |theta| (computed in their workers), so the driver's bound proves these updates
    finite and sends each without a round trip (it waited for every vLLM update before); the bit-identical runs
    above show the answers checked later agreed."""
    out = runs
    assert all(info["peaks"] is not None and len(info["peaks"]) > 0 for info in out["actors"])
    assert out["unwaited"] == ITERATIONS
