"""The Ray population against the local one: real Ray, real actor processes, real SIGKILL.

The K=2 runs must reach bit-identical weights, fitnesses and seed logs to the local (K=0) run of the
same config: every member's result is a pure function of (seed, iteration, direction, sign). The
tiny-model runs sample (temperature 1, the iteration's shared sampling seed); the real-model one is
greedy, as configs/es-arithmetic.toml.
Fast tests use a tiny random llama saved as a model directory (the spec every actor loads) and the
vowel task from conftest (shipped to the actors by value). The real-model comparison is slow.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
import torch

from conftest import Kill, kill_at

from evolm import config
from evolm.es.ray_population import actor_failure, first_mismatch

ITERATIONS = 4


# -- pure helpers and config (no Ray) ------------------------------------------------------------------

def test_first_mismatch_names_the_first_differing_tensor():
    names = ["a", "b", "c"]
    assert first_mismatch(names, [1, 2, 3], [1, 2, 3]) is None
    assert first_mismatch(names, [1, 2, 3], [1, 5, 6]) == "b"
    assert "2 tensors instead of 3" in first_mismatch(names, [1, 2, 3], [1, 2])


def test_actor_failure_keeps_the_python_exception_line():
    text = ("The actor died because of an error raised in its creation task, ray::Replica.__init__()\n"
            "Traceback (most recent call last):\n  File \"x.py\", line 3, in f\n"
            "evolm.errors.UserError: model spec 'nope' is not a file\n")
    assert actor_failure(RuntimeError(text)) == "evolm.errors.UserError: model spec 'nope' is not a file"
    assert actor_failure(RuntimeError("The actor died unexpectedly before finishing this task.\n\tpid: 3")) == \
        "The actor died unexpectedly before finishing this task."
    system = ("The actor died unexpectedly before finishing this task.\n\tclass_name: Replica\n\tactor_id: ab12\n\tpid: 7\n"
              "\tip: 192.0.2.2\nTask was killed due to the node running low on memory.\nMemory on the node was 23 GB")
    assert actor_failure(RuntimeError(system)) == "Task was killed due to the node running low on memory."


@pytest.mark.parametrize("override, message", [
    ("distributed.workers=-1", "distributed.workers must be >= 0"),
    ("distributed.max_restarts=-2", "distributed.max_restarts must be >= 0"),
    ("distributed.gpus=-0.5", "distributed.gpus must be >= 0"),
    ("distributed.address='nowhere'", "distributed.address must be"),
    ("distributed.workerz=2", "did you mean 'workers'"),
])
def test_distributed_config_validation_names_the_field(override, message):
    with pytest.raises(config.ConfigError, match=message):
        config.from_dict(config.ESJob, {}, [override])


def test_hf_actors_on_cuda_are_refused_because_the_driver_would_share_gpu_0():
    for gpus in ("0", "1", "0.5"):
        with pytest.raises(config.ConfigError, match=r"HF actors would put the driver's copy on GPU 0 beside actor 0 .*"
                                                     r"use vLLM actors"):
            config.from_dict(config.ESJob, {}, ["distributed.workers=2", "model.device='cuda'", f"distributed.gpus={gpus}"])
    for ok in (["distributed.address='auto'"], ["distributed.address='ray://head:10001'"], ["distributed.address='head-node:6379'"],
               ["distributed.workers=2", "model.device='cpu'"], ["model.device='cuda'"]):
        config.from_dict(config.ESJob, {}, ok)


def test_vllm_inside_ray_actors_is_accepted_and_layouts_that_cannot_work_are_refused():
    """vLLM actors perturb their own engines (tests/test_vllm_ray.py); what cannot work is one line."""
    pytest.importorskip("ray")
    ray_vllm = ["distributed.workers=2", "generation.backend='vllm'"]
    config.from_dict(config.ESJob, {}, ray_vllm)
    config.from_dict(config.ESJob, {}, ["distributed.workers=1", "generation.backend='vllm'"])  # one process, one engine
    config.from_dict(config.ESJob, {}, ray_vllm + ["generation.eval_backend='same'"])  # evaluated on the actors' engines
    with pytest.raises(config.ConfigError, match=r"generation.eval_backend='same' with generation.backend='vllm' and "
                                                 r"distributed.workers=2 and es.perturbation='lowrank' .*not tested; set "
                                                 r"generation.eval_backend='hf'"):
        config.from_dict(config.ESJob, {}, ray_vllm + ["generation.eval_backend='same'", "es.perturbation='lowrank'"])
    with pytest.raises(config.ConfigError, match=r"model.device='cuda' .* GPU 0 beside the actors' engines; set model.device='cpu'"):
        config.from_dict(config.ESJob, {}, ray_vllm + ["model.device='cuda'", "distributed.gpus=1"])
    with pytest.raises(config.ConfigError, match=r"distributed.gpus=0.5 puts 2 vLLM engines on one GPU, each asking "
                                                 r"generation.vllm_gpu_memory_utilization=0.9 .*at most 0.5"):
        config.from_dict(config.ESJob, {}, ray_vllm + ["distributed.gpus=0.5", "generation.vllm_gpu_memory_utilization=0.9"])
    shared = config.from_dict(config.ESJob, {}, ray_vllm + ["distributed.gpus=0.5"])  # auto takes at most the share
    assert shared.generation.vllm_gpu_memory_utilization <= 0.5
    config.from_dict(config.ESJob, {}, ray_vllm + ["distributed.gpus=0.5", "generation.vllm_gpu_memory_utilization=0.45"])
    config.from_dict(config.ESJob, {}, ray_vllm + ["distributed.gpus=1"])
    # low-rank members on actors go in blocks: 0 resolves to ceil(N / K), an explicit value is kept
    lowrank = config.from_dict(config.ESJob, {}, ["distributed.workers=3", "es.perturbation='lowrank'", "es.population=8"])
    assert lowrank.es.member_batch == 3
    kept = config.from_dict(config.ESJob, {}, ray_vllm + ["es.perturbation='lowrank'", "es.params=['attention','mlp']",
                                                          "es.population=8", "es.member_batch=2"])
    assert kept.es.member_batch == 2


@pytest.mark.parametrize("value", ["0", "1.5", "-0.1"])
def test_vllm_gpu_memory_utilization_is_a_fraction(value):
    with pytest.raises(config.ConfigError, match=r"generation.vllm_gpu_memory_utilization must be in \(0, 1\]"):
        config.from_dict(config.ESJob, {}, [f"generation.vllm_gpu_memory_utilization={value}"])
    assert "generation.vllm_gpu_memory_utilization" in config.RESUME_MAY_CHANGE  # how the run executes, not what it computes


def test_vllm_engine_options_carry_the_gpu_memory_fraction():
    from evolm.backends import engine_options

    cfg = config.from_dict(config.ESJob, {}, ["generation.vllm_gpu_memory_utilization=0.4", "generation.vllm_kv_cache_gb=2"])
    assert engine_options(cfg)["gpu_memory_utilization"] == 0.4 and engine_options(cfg)["kv_cache_gb"] == 2


def test_the_driver_of_vllm_actors_starts_no_engine(tiny_model, tokenizer, monkeypatch):
    """With vLLM actors the driver only mirrors updates and measures: HF for training-side calls and held-out."""
    pytest.importorskip("ray")
    import evolm.backends.vllm as vllm_backend
    from evolm.backends import actors_generate, make_generators
    from evolm.backends.hf import HFGenerator
    from evolm.es.engine import build_paramset
    from evolm.es.params import ParamSet

    def no_engine(*a, **k):
        raise AssertionError("the driver started a vLLM engine")

    monkeypatch.setattr(vllm_backend.VLLMGenerator, "__init__", no_engine)
    cfg = config.from_dict(config.ESJob, {}, ["distributed.workers=2", "generation.backend='vllm'"])
    assert actors_generate(cfg)
    train, heldout = make_generators(cfg, tiny_model, tokenizer)
    assert train is heldout and isinstance(train, HFGenerator)
    assert type(build_paramset(tiny_model, cfg, None, train)) is ParamSet  # the driver's plain mirror
    local = config.from_dict(config.ESJob, {}, ["generation.backend='vllm'"])
    assert not actors_generate(local)
    with pytest.raises(AssertionError, match="started a vLLM engine"):  # a local vLLM run does start one
        make_generators(local, tiny_model, tokenizer)


def test_gpu_capacity_and_a_private_instance_without_the_gpus_is_refused_before_anything_loads(tmp_path, monkeypatch):
    from evolm.errors import UserError
    from evolm.es.ray_population import check_local_gpus, gpu_capacity

    assert [gpu_capacity(g, 1) for g in (0, 1, 2, 8)] == [0, 1, 2, 8]
    assert gpu_capacity(1, 0.5) == 2 and gpu_capacity(2, 0.3) == 6 and gpu_capacity(4, 2) == 2 and gpu_capacity(3, 2) == 1
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    cfg = config.from_dict(config.ESJob, {}, ["distributed.workers=2", "distributed.gpus=1", f"run.out_dir='{tmp_path}'",
                                              "run.name='r'", "generation.backend='vllm'"])  # GPUs: vLLM actors only
    with pytest.raises(UserError, match=r"distributed.workers=2 actors x distributed.gpus=1 GPU need more GPUs than this "
                                        r"machine's 0 \(room for 0 actors\); set distributed.workers <= 0"):
        check_local_gpus(cfg)
    check_local_gpus(config.from_dict(config.ESJob, {}, ["distributed.workers=2", "distributed.gpus=1",
                                                         "distributed.address='auto'", "generation.backend='vllm'"]))  # a cluster: counted once joined
    from evolm.jobs import run_es

    with pytest.raises(UserError, match="need more GPUs"):
        run_es(cfg, quiet=True)
    assert not (tmp_path / "r").exists()  # refused before the model loads or the run directory exists


def test_a_ray_population_refuses_gpus_its_own_instance_lacks_and_warns_on_a_joined_cluster():
    from types import SimpleNamespace

    from evolm.es.ray_population import DistributedError, _check_gpus

    ray = SimpleNamespace(cluster_resources=lambda: {"CPU": 2.0, "GPU": 1.0})  # Ray's resource count stubbed
    said = []
    dist = config.from_dict(config.ESJob, {}, ["distributed.workers=2", "distributed.gpus=1",
                                              "generation.backend='vllm'"]).distributed  # GPUs: vLLM actors only
    with pytest.raises(DistributedError, match=r"need more GPUs than the 1 Ray sees \(room for 1 actors\); "
                                               r"set distributed.workers <= 1"):
        _check_gpus(ray, dist, True, said.append)
    _check_gpus(ray, dist, False, said.append)  # a cluster it joined may grow: said, and the placement's wait decides
    assert len(said) == 1 and "warning" in said[0] and "placement_timeout_s=60" in said[0]
    dist.gpus = 0.5  # two actors share the one GPU
    _check_gpus(ray, dist, False, said.append)
    assert len(said) == 1


def test_placement_arithmetic_names_what_is_missing():
    from evolm.es.ray_population import bundles_on, cluster_threads, placement_shortfall

    two_small = [{"CPU": 1.0}, {"CPU": 1.0}, {"memory": 1e9}]  # a head without CPUs and two 1-CPU nodes
    assert bundles_on({"CPU": 5.0}, {"CPU": 2.0}) == 2 and bundles_on({"CPU": 4.0}, {"CPU": 1.0, "GPU": 1.0}) == 0
    assert bundles_on({"CPU": 4.0, "GPU": 1.0}, {"CPU": 1.0, "GPU": 0.5}) == 2
    assert cluster_threads(two_small, 2) == 1 and cluster_threads([{"CPU": 8.0}, {"CPU": 4.0}], 2) == 4
    assert cluster_threads([{"CPU": 8.0}, {"CPU": 4.0}], 3) == 4 and cluster_threads([{"CPU": 8.0}], 3) == 2
    assert cluster_threads(two_small, 3) == 1  # nothing fits: the shortfall says so
    assert placement_shortfall(two_small, 2, {"CPU": 1.0}) is None
    assert placement_shortfall(two_small, 2, {"CPU": 2.0}) == (
        "distributed.workers=2 actors need 2 x {CPU: 2} but the cluster has 2 CPUs on 3 nodes (at most 1 per node): "
        "room for 0 actors; set distributed.threads=1, or add nodes")
    assert placement_shortfall(two_small, 3, {"CPU": 1.0}) == (
        "distributed.workers=3 actors need 3 x {CPU: 1} but the cluster has 2 CPUs on 3 nodes (at most 1 per node): "
        "room for 2 actors; distributed.workers=2, or add nodes")
    assert "1 GPUs on 2 nodes (at most 1 per node): room for 1 actor; distributed.workers=1" in placement_shortfall(
        [{"CPU": 4.0, "GPU": 1.0}, {"CPU": 4.0}], 2, {"CPU": 1.0, "GPU": 1.0})


def test_checksums_cover_masters_and_generation_weights(tokenizer):
    from conftest import make_tiny_model

    from evolm.es.engine import build_paramset
    from evolm.es.ray_population import checksum_names, weights_checksum

    cfg = config.from_dict(config.ESJob, {}, ["model.dtype='bfloat16'"])
    params = build_paramset(make_tiny_model(tokenizer).to(torch.bfloat16), cfg)
    assert params.masters is not None
    sums, names = weights_checksum(params), checksum_names(params)
    assert len(sums) == len(names) == 2 * len(params.names) and names[0].endswith("(float32 master)")
    with torch.no_grad():
        params.tensors[0].add_(1)  # the bf16 weights generation reads, apart from the masters
    assert weights_checksum(params)[len(params.names)] != sums[len(params.names)]

    class Engine:  # a ParamSet that lives in an engine reports the engine's own checksums
        masters, names = None, ["a"]

        def engine_checksums(self):
            return [7]

    assert weights_checksum(Engine()) == [7]


@pytest.mark.parametrize("one_load", [True, False])
def test_a_replica_builds_its_generator_first_and_perturbs_through_it(tmp_path, tokenizer, vowel_task, monkeypatch,
                                                                      one_load):
    """The wiring of a vLLM actor without vLLM: the generator comes first, build_paramset attaches the
    ParamSet to it, and the actor reports the checksums the generator's side computes. With the spec's
    safetensors files on this node (one load) the actor's model is a structure on ``meta`` and the engine is
    told which checkpoint to read (none here); without (a hub id not cached) the actor loads an HF copy."""
    from conftest import make_tiny_model

    from evolm.backends.hf import HFGenerator
    from evolm.es import ray_population
    from evolm.es.ray_population import Replica, ReplicaRecipe

    spec = tmp_path / "model"
    make_tiny_model(tokenizer).save_pretrained(spec)
    tokenizer.save_pretrained(spec)
    events = []

    class Engine(HFGenerator):  # stands in for VLLMGenerator: its own copy of the weights, attach_paramset
        def attach_paramset(self, local):
            events.append("attach")
            local.engine_checksums = lambda: [len(events)] * len(local.names)
            local.peaks = lambda: [1.0] * len(local.names)  # an engine's worker reads them
            return local

        def close(self):
            events.append("close")

    def make(backend, model, tok, batch_size=32, prefix_cache=True, **engine):
        events.append(("generator", backend, engine["threads"], engine["gpu_memory_utilization"]))
        events.append((next(model.parameters()).device.type, engine.get("checkpoint", "no checkpoint option")))
        return Engine(model, tok, batch_size=batch_size)

    monkeypatch.setattr(ray_population, "make_generator", make)
    monkeypatch.setattr(ray_population, "_check_engine_device", lambda cfg: None)
    if not one_load:
        monkeypatch.setattr(ray_population.models, "weights_location", lambda spec, revision="": None)
    cfg = config.from_dict(config.ESJob, {}, [f"model.spec='{spec}'", "generation.backend='vllm'", "model.threads=1"])
    replica = Replica(ReplicaRecipe(cfg=cfg, spec=str(spec), checkpoint=None, header=None, task=vowel_task, threads=1,
                                    replay=[(0, [1.0], 1e-3)]))
    loaded = ("meta", None) if one_load else ("cpu", "no checkpoint option")
    assert events == [("generator", "vllm", 1, 0.9), loaded, "attach"]
    info = replica.ready()
    assert info["checksum"] == [3] * len(replica.population.params.names)
    assert info["hf_loads"] == (0 if one_load else 1)
    replica.close()
    assert events[-1] == "close"
    ray = sys.modules.get("ray")  # built outside an actor, the replica asks Ray nothing (that would start an instance)
    assert ray is None or not ray.is_initialized()


def test_workers_without_ray_installed_is_a_one_line_config_error(monkeypatch):
    monkeypatch.setitem(sys.modules, "ray", None)  # what an environment without the distributed extra looks like
    with pytest.raises(config.ConfigError, match=r"needs Ray: pip install 'evolm\[distributed\]'"):
        config.from_dict(config.ESJob, {}, ["distributed.workers=2"])
    config.from_dict(config.ESJob, {}, ["distributed.workers=1"])  # local: no Ray needed


# -- real Ray on a tiny model ------------------------------------------------------------------------

@pytest.fixture(scope="module")
def ray_instance():
    """One private Ray instance for the module (run_es uses an initialised Ray as it is)."""
    ray = pytest.importorskip("ray")
    # Ray's memory monitor kills workers when the *machine* passes 95% memory, whoever holds it; on a
    # shared developer machine that is other people's jobs. The tests are about evolm, not that policy.
    os.environ.setdefault("RAY_memory_monitor_refresh_ms", "0")
    from evolm.es.ray_population import _connect

    assert _connect(ray, "", num_cpus=2)  # the private instance evolm starts (distributed.address = "")
    yield ray
    ray.shutdown()


@pytest.mark.ray
def test_private_instance_runs_workers_at_the_drivers_priority(ray_instance):
    # Ray's default worker_niceness is 15: beside other jobs its actors got ~5% of a core (docs/distributed.md)
    @ray_instance.remote
    def niceness():
        return os.nice(0)

    assert ray_instance.get(niceness.remote()) == os.nice(0)


def _cfg(root: Path, spec: Path, workers: int, **overrides) -> config.ESJob:
    sets = [f"model.spec='{spec}'", f"run.out_dir='{root}'", "run.name='run'", "run.progress=false", "run.checkpoint_every=0",
            "eval.before_after=false", "generation.max_new_tokens=8", "generation.temperature=1.0",  # sampled: the
            "es.population=8", "es.prompts_per_iteration=8",  # shared per-iteration seed must reach every actor
            f"es.iterations={ITERATIONS}", "es.sigma=0.02", "es.lr=0.01", f"distributed.workers={workers}"]
    sets += [f"{k}={v}" for k, v in overrides.items()]
    return config.from_dict(config.ESJob, {}, sets)


def _run(cfg, task, **kw):
    from evolm.jobs import run_es

    return run_es(cfg, task=task, **{"quiet": True, **kw})


def _final(run) -> dict[str, torch.Tensor]:
    from safetensors.torch import load_file

    state = {}
    for f in sorted((run.path / "final").glob("*.safetensors")):
        state.update(load_file(str(f)))
    return state


def _train(run) -> list[dict]:
    return [r for r in run.metrics() if r.get("kind") == "train"]


def _assert_same_run(run, reference):
    a, b = _final(run), _final(reference)
    assert a.keys() == b.keys()
    for name in a:
        assert torch.equal(a[name], b[name]), name
    assert [r["fitness"] for r in _train(run)] == [r["fitness"] for r in _train(reference)]
    assert run.seed_log() == reference.seed_log()


@pytest.fixture(scope="module")
def local_run(tmp_path_factory, tiny_dir):
    from conftest import make_vowel_task

    run = _run(_cfg(tmp_path_factory.mktemp("local"), tiny_dir, 0), make_vowel_task())
    assert "ray_actors" not in _train(run)[0]
    assert {r["update_status"] for r in _train(run)} == {"applied"}  # the comparison below is about real updates
    return run


@pytest.mark.ray
def test_two_actors_reach_the_local_weights_bit_for_bit(tmp_path, tiny_dir, local_run, ray_instance, vowel_task):
    run = _run(_cfg(tmp_path, tiny_dir, 2), vowel_task)
    _assert_same_run(run, local_run)
    records = _train(run)
    assert all(r["ray_actors"] == 2 and r["ray_restarts"] == 0 for r in records)
    assert all(sum(r["ray_members"].values()) == 8 for r in records)
    assert any(len(r["ray_members"]) == 2 for r in records)  # both actors took members (dynamic scheduling)
    assert records[0]["gen_sequences"] == 8 * 8  # cost counters come back from the actors
    assert all(0 <= r["driver_seconds"] < r["seconds"] + 60 for r in records)  # measured every update
    assert "driver_seconds" not in _train(local_run)[0]


@pytest.mark.ray
def test_lowrank_members_in_blocks_on_two_actors_reach_the_one_process_weights(tmp_path, tiny_dir, ray_instance,
                                                                              vowel_task):
    """Low-rank members (all of a block in one batched forward pass) on 2 HF actors: each actor call scores a block
    of members, es.member_batch = 0 resolves to ceil(N / K) = 4 (recorded), and the run equals a one-process run
    with es.member_batch = 4 bit for bit (fitnesses, seed log, final weights), with every update applied."""
    lowrank = {"es.perturbation": "'lowrank'", "es.rank": 2}
    local = _run(_cfg(tmp_path / "local", tiny_dir, 0, **lowrank, **{"es.member_batch": 4}), vowel_task)
    cfg = _cfg(tmp_path / "ray", tiny_dir, 2, **lowrank)
    run = _run(cfg, vowel_task)
    assert "member_batch = 4" in (run.path / "config.toml").read_text()
    _assert_same_run(run, local)
    records = _train(run)
    assert {r["update_status"] for r in records} == {"applied"}
    assert all(sorted(r["ray_members"].values()) in ([4, 4], [8]) for r in records)  # whole blocks per actor call
    assert records[0]["gen_sequences"] == 8 * 8


EVALUATED = {"eval.before_after": "true", "eval.count": 6, "eval.n_samples": 2, "eval.k": "[1,2]", "probe.every": 2,
             "probe.task": "''", "probe.count": 4, "probe.n_samples": 2, "probe.k": "[1,2]", "es.eval_center_every": 1,
             "generation.batch_size": 4,  # 2 prompts x 2 samples per call: an evaluation is several calls to share
             "run.checkpoint_every": 2}  # a checkpoint written while the driver holds no weights


def _table(report: dict) -> dict:
    return {k: v for k, v in report.items() if k != "seconds"}


def _weight_files(directory: Path) -> dict[str, bytes]:
    return {f.name: f.read_bytes() for f in sorted(directory.glob("*.safetensors"))}


@pytest.mark.ray
@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])  # bfloat16: float32 masters, saved from an actor too
def test_evaluations_run_on_two_hf_actors_and_equal_the_one_process_tables(tmp_path, tiny_dir, ray_instance, vowel_task,
                                                                            monkeypatch, dtype):
    from evolm.backends.hf import HFGenerator
    from evolm.es import ray_population

    local = _run(_cfg(tmp_path / "local", tiny_dir, 0, **EVALUATED, **{"model.dtype": dtype}), vowel_task)
    made = {}
    factory = ray_population.factory

    def keeping(comps, run, **kw):  # the driver's model and population, to look at after the run
        make = factory(comps, run, **kw)

        def keep(*a):
            made["model"], made["population"] = comps.model, make(*a)
            return made["population"]
        return keep

    monkeypatch.setattr(ray_population, "factory", keeping)
    driver_calls = []

    def never_on_the_driver(self, prompts, params):  # the driver process's HF generator (not the actors')
        driver_calls.append(len(prompts))
        raise AssertionError("the driver generated: every evaluation, the one before training too, belongs on the actors")

    monkeypatch.setattr(HFGenerator, "generate", never_on_the_driver)
    run = _run(_cfg(tmp_path / "ray", tiny_dir, 2, **EVALUATED, **{"model.dtype": dtype}), vowel_task)
    assert driver_calls == []
    _assert_same_run(run, local)
    # the driver kept the record, not the weights: no parameter, master or ParamSet tensor with storage here
    population = made["population"]
    assert population.remote
    assert all(p.device.type == "meta" for p in made["model"].parameters())
    assert all(t.device.type == "meta" for t in [*population.params.tensors, *(population.params.masters or [])])
    assert (population.params.masters is not None) == (dtype == "bfloat16")
    # ... and what it wrote from an actor is byte for byte what the one process wrote
    for name in ("checkpoints/step_000002", "final"):
        files = _weight_files(run.path / name)
        assert files and files == _weight_files(local.path / name), name
    assert ("masters.safetensors" in _weight_files(run.path / "checkpoints/step_000002")) == (dtype == "bfloat16")
    for label in ("before", "after"):  # the held-out tables, problem by problem, sample by sample
        read = lambda r: _table(json.loads((r.path / f"eval_{label}.json").read_text()))  # noqa: E731
        assert read(run) == read(local), label
    probes = [{k: v for k, v in r.items() if k != "probe_seconds"} for r in run.probes()]
    assert len(probes) == 3 and probes == [{k: v for k, v in r.items() if k != "probe_seconds"} for r in local.probes()]
    assert [r["center_reward"] for r in _train(run)] == [r["center_reward"] for r in _train(local)]


def _descendant_scoring_actor():
    """A Ray actor process of this test's own Ray instance that is scoring a member right now."""
    import psutil

    for child in psutil.Process().children(recursive=True):
        try:
            if child.cmdline()[:1] == ["ray::Replica.score"]:
                return child
        except (psutil.NoSuchProcess, psutil.AccessDenied, IndexError):
            continue
    return None


@pytest.mark.ray
def test_an_actor_killed_mid_iteration_is_replaced_and_the_result_is_unchanged(tmp_path, tiny_dir, local_run, ray_instance,
                                                                                vowel_task):
    killed = []

    def kill_an_actor_soon(step, record):
        if step != 1:
            return

        def hunt():
            deadline = time.time() + 60
            while time.time() < deadline and not killed:
                victim = _descendant_scoring_actor()
                if victim is not None:
                    os.kill(victim.pid, signal.SIGKILL)
                    killed.append(victim.pid)
                time.sleep(0.005)

        threading.Thread(target=hunt, daemon=True).start()

    run = _run(_cfg(tmp_path, tiny_dir, 2), vowel_task, callbacks=(kill_an_actor_soon,))
    assert killed, "no scoring actor was found to kill"
    records = _train(run)
    assert records[-1]["ray_restarts"] == 1
    assert sum(r["ray_rescored"] for r in records) >= 1  # the killed actor's member was scored again
    assert records[-1]["ray_actors"] == 2
    assert records[-1]["ray_copied"] == 1 and records[-1]["ray_replayed"] == 0  # copied from the live actor
    _assert_same_run(run, local_run)  # the replacement copied the live actor's weights after update 1: same weights


@pytest.mark.ray
def test_resume_with_actors_loads_the_checkpoint_and_matches(tmp_path, tiny_dir, local_run, ray_instance, vowel_task):
    from evolm.jobs import run_es
    from evolm.runs import RunDir

    cfg = _cfg(tmp_path, tiny_dir, 2, **{"run.checkpoint_every": 2})
    with pytest.raises(Kill):
        _run(cfg, vowel_task, callbacks=(kill_at(3),))
    run = RunDir.open(tmp_path / "run")
    assert run.latest_checkpoint()[1]["step"] == 2
    run_es(cfg, resume=run, task=vowel_task, quiet=True)
    assert [r["step"] for r in _train(run)] == [1, 2, 3, 4]
    _assert_same_run(run, local_run)


@pytest.mark.ray
def test_an_actor_with_other_weights_stops_the_run_in_one_line(tmp_path, tiny_dir, tokenizer, ray_instance, vowel_task):
    # The driver's replica is a different model than the one the actors load from the spec: the
    # checksum comparison after loading must refuse to start.
    from conftest import make_tiny_model

    from evolm.es.engine import build_paramset
    from evolm.es.ray_population import DistributedError, RayPopulation

    cfg = _cfg(tmp_path, tiny_dir, 1)  # one actor is enough (RayPopulation itself takes any K)
    other = make_tiny_model(tokenizer, seed=1)
    params = build_paramset(other, cfg)
    with pytest.raises(DistributedError, match=r"Ray actor 0 on (?!\?)\S+ diverged from the driver's weights after loading "
                                               r"\(first differing tensor: model\.embed_tokens\.weight\)"):
        RayPopulation(cfg, params, None, vowel_task, spec=str(tiny_dir), say=lambda *a: None)
    assert ray_instance.is_initialized()  # a Ray the population did not start is left running


@pytest.mark.ray
def test_the_driver_copy_waits_for_sync_and_is_checked_against_the_actors(tmp_path, tiny_dir, tokenizer, ray_instance,
                                                                          vowel_task):
    """Updates reach the actors at once and the driver's copy only at ``sync`` (no CPU pass per update),
    bit-identical then; a driver copy that replays differently stops the run in one line."""
    from conftest import make_tiny_model

    from evolm.es.engine import build_paramset
    from evolm.es.ray_population import DistributedError, RayPopulation, weights_checksum
    from evolm.es.update import Update

    cfg = _cfg(tmp_path, tiny_dir, 1)
    params = build_paramset(make_tiny_model(tokenizer), cfg)
    reference = build_paramset(make_tiny_model(tokenizer), cfg)
    base = weights_checksum(params)
    population = RayPopulation(cfg, params, type("NoEngine", (), {"sync_weights": lambda self: None})(), vowel_task,
                               spec=str(tiny_dir), say=lambda *a: None)
    try:
        for iteration in range(2):
            assert population.apply_update(iteration, Update([1.0, -0.5, 0.25, 0.75], 1e-2, "applied")).applies
            assert reference.apply_update(iteration, [1.0, -0.5, 0.25, 0.75], 1e-2)
        assert params.deferred == 2 and weights_checksum(params) == base  # the driver's copy is untouched so far
        population.confirm_update()  # the last update's answers (the driver did not wait for them)
        assert population._checksum == weights_checksum(reference) != base  # the actor's weights moved
        population.sync()
        assert params.deferred == 0 and all(torch.equal(a, b) for a, b in zip(params.tensors, reference.tensors))
        assert population.apply_update(2, Update([1.0], 1e-2, "applied")).applies
        with torch.no_grad():
            params.tensors[1].add_(1e-3)  # the driver's copy drifts from the actors'
        with pytest.raises(DistributedError, match=r"rebuilt from the seed log, differs from the Ray actors' \(first "
                                                   r"differing tensor: "):
            population.sync()
    finally:
        population.close()


@pytest.mark.ray
def test_the_driver_sends_an_update_without_waiting_and_waits_only_for_one_that_may_overflow(tmp_path, tiny_dir, tokenizer,
                                                                                            ray_instance, vowel_task):
    """An update the driver's bound proves finite (the actors' max |theta| at start plus every update's largest
    step) is sent and the driver goes on at once (the next work queues behind it) and checks the answers later;
    one the bound cannot prove is waited for, and refused by every replica alike when it would overflow."""
    from conftest import make_tiny_model

    from evolm.backends.base import SamplingParams
    from evolm.es.engine import build_paramset
    from evolm.es.ray_population import RayPopulation, weights_checksum
    from evolm.es.update import Update

    cfg = _cfg(tmp_path, tiny_dir, 2)
    params = build_paramset(make_tiny_model(tokenizer), cfg)
    reference = build_paramset(make_tiny_model(tokenizer), cfg)
    population = RayPopulation(cfg, params, type("NoEngine", (), {"sync_weights": lambda self: None})(), vowel_task,
                               spec=str(tiny_dir), say=lambda *a: None)
    try:
        assert population.apply_update(0, Update([1.0, -0.5], 1e-2, "applied")).applies
        assert reference.apply_update(0, [1.0, -0.5], 1e-2)
        assert population._pending is not None  # sent, its answers not awaited
        population.generate(["Say a"], SamplingParams(n=1, max_new_tokens=2, temperature=0.0, seed=1))  # confirms it
        assert population._pending is None and population._checksum == weights_checksum(reference)
        assert population.update_seconds is not None and population.update_seconds > 0
        huge = population.apply_update(1, Update([1.0], 1e39, "applied"))  # overflows float32: refused by all
        assert not huge.applies and huge.status != "applied" and population._pending is None
        assert population._checksum == weights_checksum(reference)  # nothing moved
        population.sync()
        assert all(torch.equal(a, b) for a, b in zip(params.tensors, reference.tensors))
    finally:
        population.close()


# -- an engine's processes die with the process that started it ------------------------------------------

STAND_IN_ENGINE = """
import fcntl, os, sys, time
import evolm.es.vllm_worker  # what vLLM imports in every engine process as it starts
gpu = open({lock!r}, "w")
fcntl.flock(gpu, fcntl.LOCK_EX | fcntl.LOCK_NB)  # the GPU: a second engine cannot start while this one holds it
open({lock!r} + ".held", "w").write(str(os.getpid()))
time.sleep(600)
"""
"""A stand-in for a vLLM engine process: it imports what vLLM's engine processes import of evolm, then holds
a lock standing for its GPU (test_ray_cluster.py starts it from Ray actors)."""

START_ENGINE = """
import multiprocessing, os, sys, time
from evolm.backends import vllm
if sys.argv[2] == "mark":
    vllm.mark_engine_parent()  # what VLLMGenerator does before vLLM starts its engine
    vllm._engine_starting = True  # ... and while it starts it
engine = multiprocessing.get_context(sys.argv[3]).Process(target=exec, args=(sys.argv[1],))  # as vLLM starts it
engine.start()
print(engine.pid, flush=True)
time.sleep(600)
"""


def engine_holding(lock: Path, seconds: float = 60) -> int:
    """The pid of the stand-in engine once it holds the lock (the "GPU")."""
    held = Path(f"{lock}.held")
    deadline = time.time() + seconds
    while time.time() < deadline:
        if held.exists() and held.read_text():
            return int(held.read_text())
        time.sleep(0.1)
    raise AssertionError(f"no engine took {lock} within {seconds:.0f} s")


def gone(pid: int, seconds: float = 20) -> bool:
    """Whether process ``pid`` ends (or is a zombie) within ``seconds``."""
    import psutil

    deadline = time.time() + seconds
    while time.time() < deadline:
        try:
            if psutil.Process(pid).status() == psutil.STATUS_ZOMBIE:
                return True
        except psutil.NoSuchProcess:
            return True
        time.sleep(0.1)
    return False


def test_an_engine_process_dies_with_the_process_that_started_it(tmp_path):
    """The driver of a local vLLM run, killed with SIGKILL, used to leave its engine running (no Ray to clean
    up); the same holds for Ray actors on nodes without Ray's process-group clean-up (test_ray_cluster.py)."""
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[1] / "src")}
    # spawned (vLLM on the CPU, in Ray actors, after CUDA): the stand-in arms as it imports evolm.es.vllm_worker,
    # as vLLM's engine core does through evolm's vllm.general_plugins entry point; forked: the fork hook arms it
    forked = STAND_IN_ENGINE.replace("import evolm.es.vllm_worker", "pass")  # a forked engine core imports nothing
    for mark, method in (("no-mark", "spawn"), ("mark", "spawn"), ("no-mark", "fork"), ("mark", "fork")):
        lock = tmp_path / f"gpu-{mark}-{method}"
        stand_in = (STAND_IN_ENGINE if method == "spawn" else forked).format(lock=str(lock))
        parent = subprocess.Popen([sys.executable, "-c", START_ENGINE, stand_in, mark, method],
                                  stdout=subprocess.PIPE, text=True, env=env)
        engine = int(parent.stdout.readline())
        assert engine_holding(lock) == engine
        parent.kill()
        parent.wait()
        try:
            assert gone(engine, seconds=10) == (mark == "mark"), f"{mark}, {method}: the engine outlived its parent"
        finally:
            if not gone(engine, seconds=0):
                os.kill(engine, signal.SIGKILL)


def test_die_with_parent_is_armed_only_in_engine_processes(monkeypatch):
    from evolm.backends import vllm as vllm_backend

    monkeypatch.delenv(vllm_backend.ENGINE_PARENT, raising=False)
    assert vllm_backend.die_with_parent() is False  # the driver, pytest, any process that is not an engine's
    monkeypatch.setenv(vllm_backend.ENGINE_PARENT, str(os.getpid()))
    assert vllm_backend.die_with_parent() is False  # the process that starts the engine (vLLM runs plugins there too)
    code = ("import os, sys; os.environ['EVOLM_ENGINE_PARENT'] = str(os.getppid());"
            "from evolm.backends.vllm import die_with_parent; print(die_with_parent())")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120,
                         env={**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[1] / "src")})
    assert out.stdout.strip() == "True", out.stderr[-2000:]


# -- the command line, with its own private Ray, on the real model -----------------------------------

@pytest.mark.slow  # `make test-all`; the tiny-model twin runs in `make test`
@pytest.mark.ray
def test_cli_with_two_workers_matches_the_local_run_on_the_real_model(tmp_path):
    repo = Path(__file__).resolve().parents[1]
    common = ["--config", str(repo / "configs" / "es-arithmetic.toml"), "--set", f"run.out_dir='{tmp_path}'",
              # one update of 12-token answers: the actors' members score real answers (fitness 0.6 each; with 8
              # tokens every fitness was 0); updates applied on the actors are checked by the tiny-model runs above
              "--set", "es.iterations=1", "--set", "es.prompts_per_iteration=4", "--set", "es.population=4",
              "--set", "generation.max_new_tokens=12", "--set", "eval.before_after=false", "--set", "probe.every=0",
              "--set", "run.checkpoint_every=0", "--set", "run.progress=false"]
    env = {**os.environ, "PYTHONPATH": str(repo / "src"), "RAY_memory_monitor_refresh_ms": "0"}  # see ray_instance
    runs = {}
    for workers in (0, 2):
        out = subprocess.run([sys.executable, "-m", "evolm", "es", *common, "--set", f"run.name='k{workers}'",
                              "--set", f"distributed.workers={workers}"], capture_output=True, text=True, env=env, timeout=900)
        assert out.returncode == 0, out.stderr[-2000:]
        from evolm.runs import RunDir

        runs[workers] = RunDir.open(tmp_path / f"k{workers}")
    assert "Ray population: 2 actors" in out.stdout
    _assert_same_run(runs[2], runs[0])
    assert any(f > 0 for r in _train(runs[0]) for f in r["fitness"]), "compared on real scores, not all zeros"
    assert json.loads((runs[2].path / "run.json").read_text())["status"] == "finished"
    assert all(r["ray_actors"] == 2 for r in _train(runs[2]))
