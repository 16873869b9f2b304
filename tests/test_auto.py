"""The "auto" defaults (model.device, model.dtype, model.threads, distributed.workers, generation.vllm_*):
what they resolve to on a given machine, that the run records the resolved values, and that the Ray
population auto picks on a multi-core CPU reaches the one-process 1-thread run's weights bit for bit.

The suite pins one core (tests/conftest.py sets OMP_NUM_THREADS=1); these tests set the machine they need
by patching ``evolm.machine``.
"""

from __future__ import annotations

import os

import pytest
import torch

from evolm import config, machine
from evolm.errors import UserError


@pytest.fixture
def cores(monkeypatch):
    """A machine with ``n`` usable cores, Ray installed, no GPU and no AMX (call it to set n)."""
    def set_cores(n: int, ray: bool = True, cuda: bool = False, amx: bool = False):
        monkeypatch.setattr(machine, "usable_cores", lambda: (n, f"{n} cores"))
        monkeypatch.setattr(machine, "cpu_bf16_native", lambda: (amx, "a CPU with AMX bf16 matrix units" if amx
                                                                 else "a CPU without AMX"))
        monkeypatch.setattr(machine, "ray_importable", lambda: ray)
        monkeypatch.setattr(machine, "cuda_available", lambda: cuda)
        monkeypatch.setattr(machine, "cuda_free_fraction", lambda device="cuda": (60.0, 80.0))
        monkeypatch.setattr(machine, "available_ram_gb", lambda: 20.0)
    return set_cores


# -- reading the machine -------------------------------------------------------------------------------

def test_usable_cores_honours_omp_num_threads_then_affinity_capped_by_the_cgroup_quota(monkeypatch):
    monkeypatch.setenv("OMP_NUM_THREADS", "3")
    assert machine.usable_cores() == (3, "OMP_NUM_THREADS=3")
    monkeypatch.delenv("OMP_NUM_THREADS")
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: {0, 1, 2, 3, 4, 5, 6, 7})
    monkeypatch.setattr(machine, "cgroup_cpu_limit", lambda: None)
    assert machine.usable_cores() == (8, "8 cores")
    monkeypatch.setattr(machine, "cgroup_cpu_limit", lambda: 2.5)
    assert machine.usable_cores() == (2, "cgroup quota 2.5 CPUs")
    monkeypatch.setattr(machine, "cgroup_cpu_limit", lambda: 0.5)  # never below one core
    assert machine.usable_cores()[0] == 1
    monkeypatch.setenv("OMP_NUM_THREADS", "lots")  # not a number: ignored
    assert machine.usable_cores()[0] == 1


def test_cgroup_quota_reads_v2_and_v1_files(tmp_path):
    assert machine.cgroup_cpu_limit(tmp_path) is None
    (tmp_path / "cpu.max").write_text("max 100000\n")
    assert machine.cgroup_cpu_limit(tmp_path) is None
    (tmp_path / "cpu.max").write_text("200000 100000\n")
    assert machine.cgroup_cpu_limit(tmp_path) == 2.0
    (tmp_path / "cpu.max").unlink()
    (tmp_path / "cpu").mkdir()
    (tmp_path / "cpu" / "cpu.cfs_quota_us").write_text("150000")
    (tmp_path / "cpu" / "cpu.cfs_period_us").write_text("100000")
    assert machine.cgroup_cpu_limit(tmp_path) == 1.5
    (tmp_path / "cpu" / "cpu.cfs_quota_us").write_text("-1")
    assert machine.cgroup_cpu_limit(tmp_path) is None


# -- resolution ------------------------------------------------------------------------------------------

def test_cpu_with_two_cores_and_ray_scores_on_ray_actors_at_one_thread(cores):
    cores(2)
    cfg = config.from_dict(config.ESJob, {})
    m, d = cfg.model, cfg.distributed
    assert (m.device, m.dtype, m.threads, d.workers, d.threads) == ("cpu", "float32", 1, 2, 1)  # driver: 1 thread too
    assert config.parallelism(cfg) == "parallelism: 2 Ray actors x 1 thread (auto: 2 cores)"
    text = config.to_toml(cfg)
    assert "auto" not in text  # the run directory records what was used
    again = config.from_dict(config.ESJob, config.tomllib.loads(text))  # resume / replay / eval --like read it back
    assert config.to_dict(again) == config.to_dict(cfg) and again.auto_notes == []
    assert config.parallelism(again) == "parallelism: 2 Ray actors x 1 thread (as configured)"
    assert config.from_dict(config.ESJob, {}, ["es.population=2"]).distributed.workers == 2
    explicit = config.from_dict(config.ESJob, {}, ["model.threads=2"])  # an explicit driver thread count stays
    assert (explicit.model.threads, explicit.distributed.workers, explicit.distributed.threads) == (2, 2, 1)
    cores(16)
    assert config.from_dict(config.ESJob, {}).distributed.workers == 8  # no more actors than members


def test_explicit_workers_share_the_cores_among_the_actors_when_threads_are_auto(cores):
    """issue 44.1: --set distributed.workers=2 on 2 cores ran 2 actors x 2 threads (4 threads on 2 cores)."""
    cores(2)
    cfg = config.from_dict(config.ESJob, {}, ["distributed.workers=2"])
    assert (cfg.distributed.threads, cfg.model.threads) == (1, 1)  # driver at the actors' count: bit-identical
    assert config.parallelism(cfg) == "parallelism: 2 Ray actors x 1 thread (auto: 2 cores shared by 2 actors)"
    cores(8)
    cfg = config.from_dict(config.ESJob, {}, ["distributed.workers=3"])
    assert (cfg.distributed.threads, cfg.model.threads) == (2, 2)  # floor(8 / 3)
    assert "3 Ray actors x 2 threads (auto: 8 cores shared by 3 actors)" in config.parallelism(cfg)
    cores(2)
    cfg = config.from_dict(config.ESJob, {}, ["distributed.workers=4"])  # more actors than cores: at least 1 each
    assert cfg.distributed.threads == 1
    assert "4 Ray actors x 1 thread" in config.parallelism(cfg) and "over-subscribes" in config.parallelism(cfg)
    cfg = config.from_dict(config.ESJob, {}, ["distributed.workers=2", "distributed.threads=2"])  # explicit: kept
    assert cfg.distributed.threads == 2
    assert "4 threads on 2 cores: over-subscribes" in config.parallelism(cfg)


@pytest.mark.parametrize("sets, n, ray, reason", [
    ([], 1, True, "1 cores"),
    ([], 2, False, "Ray is not installed"),
    (["es.iterations=1", "es.population=4", "es.prompts_per_iteration=8", "generation.max_new_tokens=16"], 2, True,
     "512 member tokens < 8192"),
    (["es.perturbation='lowrank'"], 2, True, "lowrank scores in one process"),
    (["generation.backend='vllm'"], 2, True, "vllm engine threads in one process"),
    (["distributed.address='auto'"], 2, True, "set distributed.workers to use the Ray cluster"),
])
def test_threads_in_one_process_where_ray_cannot_help(cores, sets, n, ray, reason):
    cores(n, ray=ray)
    cfg = config.from_dict(config.ESJob, {}, sets)
    assert cfg.distributed.workers == 0 and cfg.model.threads == n and cfg.distributed.threads == 0
    assert reason in config.parallelism(cfg)
    assert config.parallelism(cfg).startswith(f"parallelism: one process x {n} thread")


def test_cuda_means_bf16_generation_for_es_and_float32_for_grpo(cores):
    from evolm.grpo import GRPOJob

    cores(8, cuda=True)
    cfg = config.from_dict(config.ESJob, {})
    assert (cfg.model.device, cfg.model.dtype, cfg.distributed.workers) == ("cuda", "bfloat16", 0)
    assert config.from_dict(config.ESJob, {}, ["model.dtype='float32'"]).model.dtype == "float32"  # explicit: kept
    grpo = config.from_dict(GRPOJob, {})
    assert (grpo.model.device, grpo.model.dtype) == ("cuda", "float32")
    vllm = config.from_dict(config.ESJob, {}, ["generation.backend='vllm'"])
    assert vllm.generation.vllm_gpu_memory_utilization == 0.67  # 0.9 x 60/80 free, rounded down
    assert vllm.generation.vllm_kv_cache_gb == 15.0  # a quarter of 60 GiB free
    actors = config.from_dict(config.ESJob, {}, ["generation.backend='vllm'", "distributed.workers=4", "distributed.gpus=0.25"])
    assert actors.model.device == "cpu"  # the driver of vLLM actors stays off the GPUs
    assert actors.generation.vllm_gpu_memory_utilization == 0.25 and actors.generation.vllm_kv_cache_gb == 3.75


def test_a_cpu_with_amx_means_bf16_generation_for_es_and_float32_for_grpo(cores):
    from evolm.grpo import GRPOJob

    cores(2, amx=True)
    cfg = config.from_dict(config.ESJob, {})
    assert (cfg.model.device, cfg.model.dtype, cfg.distributed.workers, cfg.model.threads) == ("cpu", "bfloat16", 2, 1)
    assert "model.dtype = bfloat16 (auto: ES on a CPU with AMX bf16 matrix units, float32 masters)" in cfg.auto_notes
    assert config.from_dict(config.ESJob, {}, ["model.dtype='float32'"]).model.dtype == "float32"  # explicit: kept
    assert config.from_dict(GRPOJob, {}).model.dtype == "float32"  # trains its own weights
    cores(2, amx=False)
    assert config.from_dict(config.ESJob, {}).model.dtype == "float32"


def test_the_amx_reading_honours_evolm_cpu_bf16_then_asks_torch(monkeypatch):
    monkeypatch.setenv("EVOLM_CPU_BF16", "1")
    assert machine.cpu_bf16_native() == (True, "EVOLM_CPU_BF16=1")
    monkeypatch.setenv("EVOLM_CPU_BF16", "0")
    assert machine.cpu_bf16_native() == (False, "EVOLM_CPU_BF16=0")
    monkeypatch.delenv("EVOLM_CPU_BF16")
    assert machine.cpu_bf16_native()[0] == bool(torch.cpu._is_amx_tile_supported())


def test_vllm_on_cpu_sizes_the_kv_cache_from_available_ram_and_explicit_values_stay(cores):
    cores(2)
    cfg = config.from_dict(config.ESJob, {}, ["generation.backend='vllm'"])
    assert cfg.generation.vllm_kv_cache_gb == 4.0 and cfg.generation.vllm_gpu_memory_utilization == 0.9  # 20 GiB / 4, capped at 4
    explicit = config.from_dict(config.ESJob, {}, ["generation.backend='vllm'", "generation.vllm_kv_cache_gb=2",
                                                   "model.threads=1", "distributed.workers=0", "model.device='cpu'"])
    assert explicit.generation.vllm_kv_cache_gb == 2.0 and explicit.model.threads == 1
    assert config.from_dict(config.ESJob, {}).generation.vllm_kv_cache_gb == 1.0  # hf backend: unused, fixed


@pytest.mark.parametrize("override, message", [
    ("model.threads='many'", "model.threads must be an integer or 'auto' (got 'many')"),
    ("model.threads=0", "model.threads must be >= 1 or 'auto'"),
    ("distributed.workers='x'", "distributed.workers must be an integer or 'auto'"),
    ("model.dtype='auto16'", "model.dtype must be one of ['auto', 'float32'"),
    ("model.device='tpu'", "model.device must be auto, cpu"),
    ("generation.vllm_gpu_memory_utilization='half'", "must be a number or 'auto'"),
])
def test_bad_values_are_one_line_errors(override, message):
    with pytest.raises(config.ConfigError, match=message.replace("[", r"\[").replace("(", r"\(").replace(")", r"\)")):
        config.from_dict(config.ESJob, {}, [override])


def test_config_prints_auto_as_the_default():
    lines = config.describe(config.ESJob)
    for key in ("model.device", "model.dtype", "model.threads", "distributed.workers", "generation.vllm_kv_cache_gb"):
        assert any(line.strip().startswith(f'{key} = "auto"') for line in lines), key


# -- runs ------------------------------------------------------------------------------------------------

def _sets(root, spec, *extra):
    return [f"model.spec='{spec}'", f"run.out_dir='{root}'", "run.name='run'", "run.progress=false",
            "run.checkpoint_every=0", "eval.before_after=false", "generation.max_new_tokens=32",
            "generation.temperature=1.0", "es.population=8", "es.prompts_per_iteration=8", "es.iterations=2",
            "es.sigma=0.02", "es.lr=0.01", *extra]


def test_a_resume_reuses_the_recorded_values_and_refuses_another_dtype(tmp_path, tiny_dir, vowel_task, cores, capsys):
    from evolm.jobs import run_es
    from evolm.runs import RunDir

    cores(1)
    run = run_es(config.from_dict(config.ESJob, {}, _sets(tmp_path, tiny_dir, "es.iterations=1", "generation.max_new_tokens=8")),
                 task=vowel_task)
    assert "[evolm] parallelism: one process x 1 thread on cpu (auto: 1 cores)" in capsys.readouterr().out
    info = RunDir.open(run.path).info()
    assert "model.dtype = float32 (auto: cpu: a CPU without AMX)" in info["auto"]
    recorded = config.load(config.ESJob, run.config_path)
    assert (recorded.model.dtype, recorded.model.threads, recorded.distributed.workers) == ("float32", 1, 0)
    cores(4, cuda=True)  # the same run directory on a GPU box: model.dtype=auto would now mean bfloat16
    with pytest.raises(UserError, match=r"model.dtype = \"bfloat16\" \(the run's: \"float32\"\)"):
        run_es(config.load(config.ESJob, run.config_path, ["es.iterations=2", "model.dtype=auto", "model.device=auto"]),
               resume=run.path, task=vowel_task)


def test_an_auto_bf16_run_on_an_amx_cpu_trains_float32_masters_and_keeps_its_dtype_on_resume(tmp_path, tiny_dir, vowel_task,
                                                                                             cores, capsys):
    from safetensors.torch import load_file

    from evolm.jobs import run_es
    from evolm.runs import RunDir

    cores(1, amx=True)
    run = run_es(config.from_dict(config.ESJob, {}, _sets(tmp_path, tiny_dir, "es.iterations=1", "generation.max_new_tokens=8")),
                 task=vowel_task)
    assert "model.dtype = bfloat16 (auto: ES on a CPU with AMX" in " ".join(RunDir.open(run.path).info()["auto"])
    assert "[evolm] model.dtype = bfloat16 (auto: ES on a CPU with AMX bf16 matrix units, float32 masters)" in capsys.readouterr().out
    assert config.load(config.ESJob, run.config_path).model.dtype == "bfloat16"
    train = [r for r in run.metrics() if r.get("kind") == "train"]
    assert [r["update_status"] for r in train] == ["applied"]
    final, base = load_file(str(run.path / "final" / "model.safetensors")), load_file(str(tiny_dir / "model.safetensors"))
    assert all(t.dtype == torch.float32 for t in final.values())  # the float32 masters, not bf16 weights
    assert any(not torch.equal(final[k], base[k]) for k in final if k in base)  # training moved them
    cores(1, amx=False)  # the same run directory on a CPU without AMX: auto would now mean float32
    with pytest.raises(UserError, match=r"model.dtype = \"float32\" \(the run's: \"bfloat16\"\)"):
        run_es(config.load(config.ESJob, run.config_path, ["es.iterations=2", "model.dtype=auto"]), resume=run.path,
               task=vowel_task)


@pytest.mark.slow  # ~25 s alone (Ray's start-up, two actors), 80 s on a loaded machine
@pytest.mark.ray
@pytest.mark.parametrize("amx", [False, True], ids=["float32", "bf16-amx"])
def test_auto_ray_actors_reach_the_one_process_one_thread_weights_bit_for_bit(tmp_path, tiny_dir, vowel_task, cores, capsys,
                                                                              amx):
    """2 cores: auto picks 2 Ray actors x 1 thread (and, with AMX, bf16 generation over float32 masters); the run
    matches workers=0, model.threads=1 in the same dtype exactly."""
    pytest.importorskip("ray")
    from safetensors.torch import load_file

    from evolm.jobs import run_es

    os.environ.setdefault("RAY_memory_monitor_refresh_ms", "0")  # other people's jobs on a shared machine
    cores(2, amx=amx)
    dtype = "bfloat16" if amx else "float32"
    big = f"generation.max_new_tokens={config.RAY_MIN_TOKENS // (2 * 8 * 8)}"  # just enough member tokens for Ray
    cfg = config.from_dict(config.ESJob, {}, _sets(tmp_path / "auto", tiny_dir, big))
    assert (cfg.distributed.workers, cfg.distributed.threads, cfg.model.threads, cfg.model.dtype) == (2, 1, 1, dtype)
    auto = run_es(cfg, task=vowel_task)
    assert "parallelism: 2 Ray actors x 1 thread (auto: 2 cores)" in capsys.readouterr().out
    local = run_es(config.from_dict(config.ESJob, {}, _sets(tmp_path / "local", tiny_dir, big, "distributed.workers=0",
                                                               "model.threads=1", f"model.dtype='{dtype}'")), task=vowel_task)
    train = [[r for r in run.metrics() if r.get("kind") == "train"] for run in (auto, local)]
    assert all(r["ray_actors"] == 2 for r in train[0]) and "ray_actors" not in train[1][0]
    assert [r["fitness"] for r in train[0]] == [r["fitness"] for r in train[1]]
    assert {r["update_status"] for r in train[1]} == {"applied"}  # real updates were compared
    a, b = (load_file(str(run.path / "final" / "model.safetensors")) for run in (auto, local))
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
    base = load_file(str(tiny_dir / "model.safetensors"))
    assert any(not torch.equal(a[k], base[k]) for k in a if k in base)  # training moved the weights
    assert auto.seed_log() == local.seed_log()


def test_the_demo_uses_the_auto_defaults(cores):
    import tomllib

    from evolm.commands.demo import demo_config_text

    data = tomllib.loads(demo_config_text())
    assert not {"device", "dtype", "threads"} & set(data["model"]) and "distributed" not in data  # nothing pinned
    cores(2)
    cfg = config.from_dict(config.ESJob, data)
    assert config.parallelism(cfg) == "parallelism: 2 Ray actors x 1 thread (auto: 2 cores)"  # 49152 member tokens
    one = config.from_dict(config.ESJob, data, ["distributed.workers=0", "model.threads=1"])  # what docs/install.md says
    assert config.parallelism(one) == "parallelism: one process x 1 thread on cpu (as configured)"
