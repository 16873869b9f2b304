"""The Ray population on a multi-node Ray cluster, simulated on one machine with Ray's own test utility
(``ray.cluster_utils.Cluster``): a head node without CPUs (only the driver connects to it) and three
worker nodes of one CPU each, every node a separate raylet with its own resources, all bound to
127.0.0.1. The runs join it through ``distributed.address`` as a real cluster is joined.

- actors spread over nodes reach the one-process weights bit for bit;
- a node removed mid-run (its raylet killed) loses its actor, which is replaced on the spare node and
  its member rescored: the same weights;
- a cluster too small for the actors is refused in one line within ``distributed.placement_timeout_s``
  (it used to wait for ever: every actor asked for the driver's core count of CPUs);
- ``model.threads = "auto"`` gives each actor the CPUs of its bundle on the cluster, not the driver's
  core count;
- the actors read only the paths the driver hands them (the model spec), never the run directory;
- an actor killed with SIGKILL takes its engine process with it, and the replacement's engine starts.

What the simulation cannot show: separate filesystems (every node sees this machine's disk), and
separate machines' versions of evolm, torch or NumPy.
"""

from __future__ import annotations

import os
import signal
import sys
import threading
import time
from pathlib import Path

import pytest

from test_ray_population import STAND_IN_ENGINE, engine_holding, gone
from test_ray_population import _assert_same_run, _cfg, _run, _train, local_run  # noqa: F401 (local_run: a fixture)

pytestmark = pytest.mark.ray

LOOPBACK = "127.0.0.1"


@pytest.fixture(scope="module")
def cluster():
    """Head (0 CPUs) + 3 worker nodes x 1 CPU on 127.0.0.1; the driver is not connected between runs."""
    ray = pytest.importorskip("ray")
    from ray._private import ray_constants
    from ray.cluster_utils import Cluster

    import evolm

    saved = {k: os.environ.get(k) for k in ("RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER", "PYTHONPATH",
                                            "RAY_memory_monitor_refresh_ms", "RAY_process_group_cleanup_enabled")}
    # Ray maps 127.0.0.1 to the machine's interface address unless it believes no cluster can span
    # machines (ENABLE_RAY_CLUSTER): off here and in every node's processes, so nothing binds beyond loopback.
    os.environ["RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER"] = "0"
    patched = ray_constants.ENABLE_RAY_CLUSTER
    ray_constants.ENABLE_RAY_CLUSTER = False
    os.environ["RAY_memory_monitor_refresh_ms"] = "0"  # as test_ray_population's ray_instance
    # Ray 2.60's raylets kill a dead worker's process group; older Rays, nodes started with it off and a raylet
    # that dies with its node do not: off here, so that the engine test sees evolm's own watch
    os.environ["RAY_process_group_cleanup_enabled"] = "0"
    src = str(Path(evolm.__file__).resolve().parents[1])  # the nodes' workers import this evolm, not another install
    os.environ["PYTHONPATH"] = os.pathsep.join([src, *filter(None, [saved["PYTHONPATH"]])])
    c = Cluster(initialize_head=True, head_node_args={"num_cpus": 0, "node_ip_address": LOOPBACK,
                                                      "include_dashboard": False})
    try:
        for _ in range(3):
            c.add_node(num_cpus=1, node_ip_address=LOOPBACK)
        c.wait_for_nodes()
        yield c
    finally:
        if ray.is_initialized():
            ray.shutdown()
        c.shutdown()
        ray_constants.ENABLE_RAY_CLUSTER = patched
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


def _on(cluster, tmp_path, tiny_dir, workers=2, **overrides):
    return _cfg(tmp_path, tiny_dir, workers, **{"distributed.address": f"'{cluster.address}'", **overrides})


def _raylet_pid(node) -> int:
    from ray._private import ray_constants

    return node.all_processes[ray_constants.PROCESS_TYPE_RAYLET][0].process.pid


def test_actors_on_two_nodes_reach_the_one_process_weights(cluster, tmp_path, tiny_dir, local_run, vowel_task):
    import ray

    run = _run(_on(cluster, tmp_path, tiny_dir), vowel_task)
    assert not ray.is_initialized()  # the run connected to the cluster and let go of it
    _assert_same_run(run, local_run)
    records = _train(run)
    assert all(r["ray_actors"] == 2 and r["ray_nodes"] == 2 for r in records)  # one actor per 1-CPU node
    assert all(sum(r["ray_members"].values()) == 8 for r in records)


def test_a_node_removed_mid_run_is_replaced_on_another_node_and_the_result_is_unchanged(cluster, tmp_path, tiny_dir,
                                                                                         local_run, vowel_task):
    """``cluster.remove_node`` kills the node's raylet and its workers, as a machine that leaves would."""
    import psutil

    removed = []

    def remove_a_scoring_node_soon(step, record):
        if step != 1:
            return

        def hunt():
            deadline = time.time() + 60
            while time.time() < deadline and not removed:
                for node in list(cluster.worker_nodes):
                    try:
                        busy = any(p.cmdline()[:1] == ["ray::Replica.score"]
                                   for p in psutil.Process(_raylet_pid(node)).children(recursive=True))
                    except (psutil.NoSuchProcess, psutil.AccessDenied, IndexError):
                        continue
                    if busy:
                        cluster.remove_node(node, allow_graceful=False)
                        removed.append(node)
                        return
                time.sleep(0.01)

        threading.Thread(target=hunt, daemon=True).start()

    try:
        run = _run(_on(cluster, tmp_path, tiny_dir), vowel_task, callbacks=(remove_a_scoring_node_soon,))
    finally:
        if removed:  # the next tests get three worker nodes again
            cluster.add_node(num_cpus=1, node_ip_address=LOOPBACK)
            cluster.wait_for_nodes()
    assert removed, "no node with a scoring actor was found to remove"
    records = _train(run)
    # The driver sees the actor's connection drop at once; Ray declares its node dead only after missed
    # heartbeats, and a replacement started in between lands in the lost node's bundle and dies with it
    # (seen here): one more restart, and the next one is placed on the spare node.
    assert records[-1]["ray_restarts"] in (1, 2)
    assert sum(r["ray_rescored"] for r in records) >= 1  # the lost actor's member was scored again
    assert records[-1]["ray_actors"] == 2 and records[-1]["ray_nodes"] == 2
    _assert_same_run(run, local_run)


def test_a_cluster_too_small_is_refused_in_one_line_within_the_placement_timeout(cluster, tmp_path, tiny_dir):
    """Two actors of 2 CPUs on 1-CPU nodes, through the command line: Ray would keep them pending for ever."""
    import subprocess

    sets = [f"model.spec='{tiny_dir}'", f"run.out_dir='{tmp_path}'", "run.name='run'", "distributed.workers=2",
            f"distributed.address='{cluster.address}'", "distributed.threads=2", "model.threads=2",
            "distributed.placement_timeout_s=3"]
    t0 = time.monotonic()
    try:
        config = Path(__file__).resolve().parents[1] / "configs" / "es-arithmetic.toml"
        out = subprocess.run([sys.executable, "-m", "evolm", "es", "--config", str(config),
                              *[a for x in sets for a in ("--set", x)]],
                             capture_output=True, text=True, timeout=90)
    except subprocess.TimeoutExpired:
        pytest.fail("the run waited for actors the cluster cannot place (still waiting after 90 s)")
    assert out.returncode == 2, out.stderr[-3000:]
    errors = [line for line in out.stderr.splitlines() if line.startswith("evolm: error:")]
    assert len(errors) == 1 and time.monotonic() - t0 < 60, out.stderr[-3000:]
    assert errors[0].startswith("evolm: error: distributed.workers=2 actors need 2 x {CPU: 2} but the cluster has 3 CPUs "
                                "on 4 nodes (at most 1 per node): room for 0 actors; set distributed.threads=1"), errors
    assert not (tmp_path / "run").exists()  # refused before the model loads or the run directory exists


def test_auto_threads_come_from_the_cluster_not_the_drivers_cores(cluster, tmp_path, tiny_dir, local_run, vowel_task,
                                                                   monkeypatch):
    """``model.threads = "auto"`` on a 2-core driver used to make every actor ask for 2 CPUs: each 1-CPU node
    fits none and the run hung. Each actor now takes the CPUs of its bundle (1) as its torch threads."""
    from evolm import machine

    monkeypatch.setattr(machine, "usable_cores", lambda: (2, "2 cores (test)"))
    cfg = _on(cluster, tmp_path, tiny_dir, **{"model.threads": "'auto'", "distributed.placement_timeout_s": 10})
    assert cfg.model.threads == 2 and cfg.distributed.threads == 0  # the driver's cores, as the audit found it
    outcome: dict = {}

    def start():
        try:
            outcome["run"] = _run(cfg, vowel_task)
        except BaseException as e:  # noqa: BLE001
            outcome["error"] = e

    worker = threading.Thread(target=start, daemon=True)
    worker.start()
    worker.join(timeout=120)
    assert not worker.is_alive(), "the run waited for actors the cluster cannot place (still waiting after 120 s)"
    assert "error" not in outcome, outcome.get("error")
    run = outcome["run"]
    records = _train(run)
    assert all(r["ray_actors"] == 2 and r["ray_threads"] == 1 for r in records)
    # the actors' arithmetic is the 1-thread local run's: their fitnesses and the update agree
    assert [r["fitness"] for r in records] == [r["fitness"] for r in _train(local_run)]
    assert run.seed_log() == local_run.seed_log()


def test_actors_read_the_spec_the_driver_names_and_nothing_of_the_run_directory(cluster, tmp_path, tiny_dir,
                                                                               vowel_task):
    """On a cluster without a shared filesystem the run directory exists on the driver's machine only.
    Every file an actor process opens is recorded (a Python audit hook installed at worker start-up):
    the model spec, yes; anything under run.out_dir, no."""
    import ray

    log = tmp_path / "opened"
    log.mkdir()
    out = tmp_path / "out"
    ray.init(address=cluster.address, logging_level="ERROR",
             runtime_env={"worker_process_setup_hook": _open_recorder(), "env_vars": {"EVOLM_TEST_OPEN_LOG": str(log)}})
    try:
        _run(_cfg(out, tiny_dir, 2, **{"distributed.address": f"'{cluster.address}'"}), vowel_task)
    finally:
        ray.shutdown()
    opened = {line for f in log.iterdir() for line in f.read_text().splitlines()}
    assert any(p.startswith(str(tiny_dir)) for p in opened), "the audit hook saw no actor load the spec"
    assert not [p for p in opened if p.startswith(str(out))]


def _open_recorder():
    """A Ray ``worker_process_setup_hook`` that appends every absolute path its worker opens to a file of its
    own under ``$EVOLM_TEST_OPEN_LOG`` (made in a function so that Ray ships it by value)."""

    def record_opens():
        import os
        import sys

        log = os.environ.get("EVOLM_TEST_OPEN_LOG")
        if not log:
            return
        target = open(os.path.join(log, f"{os.getpid()}.txt"), "a", buffering=1)

        def hook(event, args):
            if event == "open" and isinstance(args[0], (str, bytes, os.PathLike)):
                path = os.fsdecode(args[0])
                if os.path.isabs(path):
                    target.write(path + "\n")

        sys.addaudithook(hook)

    return record_opens


def _engine_actor_class():
    """A Ray actor standing in for a vLLM actor: it starts its "engine" (``STAND_IN_ENGINE``) as vLLM does, a
    multiprocessing child (spawn, vLLM's method on CUDA), after ``mark_engine_parent`` as ``VLLMGenerator``
    does; ``mark=False`` is the code before the fix. Defined in a function so that Ray ships it by value."""
    stand_in = STAND_IN_ENGINE

    class EngineActor:
        def __init__(self, lock: str, mark: bool = True):
            import multiprocessing

            if mark:
                from evolm.backends.vllm import mark_engine_parent

                mark_engine_parent()
            self.engine = multiprocessing.get_context("spawn").Process(target=exec, args=(stand_in.format(lock=lock),))
            self.engine.start()

        def pids(self) -> tuple[int, int]:
            return os.getpid(), self.engine.pid

    return EngineActor


def test_a_killed_actors_engine_process_dies_with_it_and_the_replacement_starts(cluster, tmp_path):
    import ray

    ray.init(address=cluster.address, logging_level="ERROR")
    try:
        actor = ray.remote(num_cpus=1)(_engine_actor_class())
        for mark in (False, True):  # before the fix, and with it
            lock = tmp_path / f"gpu-{mark}"
            first = actor.remote(str(lock), mark=mark)
            actor_pid, engine_pid = ray.get(first.pids.remote())
            assert engine_holding(lock) == engine_pid
            assert ray.get(first.pids.remote()) == (actor_pid, engine_pid)  # tied to the actor, not to one call
            Path(f"{lock}.held").unlink()
            os.kill(actor_pid, signal.SIGKILL)
            try:
                assert gone(engine_pid, seconds=10) == mark, f"mark={mark}: the engine outlived its actor"
            finally:
                if not gone(engine_pid, seconds=0):
                    os.kill(engine_pid, signal.SIGKILL)
            replacement = actor.remote(str(lock), mark=mark)
            _, replacement_engine = ray.get(replacement.pids.remote())
            assert engine_holding(lock) == replacement_engine  # the "GPU" was free for the replacement's engine
            ray.kill(replacement)
            gone(replacement_engine, seconds=10) or os.kill(replacement_engine, signal.SIGKILL)
    finally:
        ray.shutdown()
