"""Shared-prefix prefill (``generation.prefix_cache``) or oneDNN linears (``generation.cpu_matmul``): seconds per ES
iteration with and without, side by side in one process, on the default model (HF backend, float32, CPU, one thread
by default).

    python benchmarks/shared_prefix.py --out runs/bench/shared_prefix            # the prefix measurement
    python benchmarks/shared_prefix.py --out runs/bench/cpu_matmul --knob cpu_matmul   # torch's BLAS against oneDNN
    python benchmarks/shared_prefix.py --out DIR --countdown-data ~/data/countdown.json   # Qiu et al.'s own file
    python benchmarks/shared_prefix.py --out DIR --members 2 --prompts 4 --max-new-tokens 4 --repeats 1   # smoke

The two sides (``--knob``): ``prefix_cache`` off / on (linears as ``generation.cpu_matmul = "auto"`` runs them), or
``cpu_matmul`` torch / onednn (prefix cache on). "off" names the first side, "on" the second, in the output.

Workloads (each an ES job config with the sizes below set on it):

- ``countdown-qiu``: configs/es-countdown-qiu.toml, Qiu et al.'s Countdown prompts (their ``context`` text fed
  verbatim, no chat template; ``qiu_exact`` reward). With ``--countdown-data`` their countdown.json; without
  it (the file is not shipped), a file in their format is written under ``--out`` with their context
  template around evolm's generated problems (3-4 numbers up to 99): the same instruction text, so the
  same shared prefix ("... Using the numbers [") and about the same length (their 32 first rows: 125.5
  tokens, 29 shared);
- ``arithmetic``: src/evolm/configs/demo.toml, the demo's chat-templated 2-digit addition with its
  system message and worked demonstration.

Method, per workload (``--members`` one-point members of iteration 0, ``--prompts`` prompts of the train
split, greedy as both configs are, ``--max-new-tokens``, ``--batch-size``):

- time: ``LocalPopulation.score`` as ES runs it (perturb, generate, reward, restore per member) through
  two HF generators on the same model and weights, the knob's two sides, alternated ``--repeats``
  times (off first on even repeats, on first on odd ones); wall and process CPU seconds, medians, and the
  ratio off / on. The update is the same on both sides and is not run;
- FLOPs: ``torch.utils.flop_counter.FlopCounterMode`` over one call of the unperturbed model per side:
  with ``max_new_tokens = 1`` (the prefill alone: the shared prefix at batch 1 plus the rows' suffixes on
  the cached side) and with the workload's ``max_new_tokens`` (the whole call); the share saved is
  1 - on / off. Counted with torch's linears on both sides (the counter does not see oneDNN's op; the
  oneDNN side does the same FLOPs as torch's); GFLOPS per side = call FLOPs x members / seconds;
- GEMM rates (``--knob cpu_matmul``): float32 ``F.linear`` against oneDNN's at the model's linear shapes, a
  prefill's rows and a decode step's, alternated in the same run (``gemm_rates``);
- agreement: every member's completions (text, token count, finished) compared between the two sides,
  the share identical, and the share of completions with equal rewards and of members with equal fitness
  (the prefill is split, so the logits round differently and a near-tie may flip; see backends/hf.py).

Writes ``--out``/<knob>.json (shared_prefix.json for the prefix) and prints a markdown table. Run it alone on the machine: the two
sides share one process, but the machine's load moves between repeats.
"""

from __future__ import annotations

import argparse
import json
import platform
import random
import statistics
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
KNOBS = {"prefix_cache": {"off": {"prefix_cache": False}, "on": {"prefix_cache": True}},
         "cpu_matmul": {"off": {"cpu_matmul": "torch"}, "on": {"cpu_matmul": "onednn"}}}
"""Per ``--knob``, the HFGenerator arguments of its two sides."""
OUTPUT = {"prefix_cache": "shared_prefix.json", "cpu_matmul": "cpu_matmul.json"}
WORKLOADS = {"countdown-qiu": ROOT / "configs" / "es-countdown-qiu.toml",
             "arithmetic": ROOT / "src" / "evolm" / "configs" / "demo.toml"}
QIU_CONTEXT = ("You are a helpful assistant. You first think about the reasoning process in your mind and then provide the "
               "user with the answer.Using the numbers [{spaced}], create an equation that equals {target}. You can use basic "
               "arithmetic operations (+, -, *, /) and each number can only be used once. Show your work in <think> </think> "
               "tags. And return the final answer in <answer> </answer> tags, for example <answer> (1 + 2) / 3 </answer>.Let me "
               "solve this step by step.\n<think>")
"""The ``context`` of Qiu et al.'s countdown.json rows (github.com/VsonicV/es-fine-tuning-paper), as in
tests/test_countdown_data.py."""


def _cpu_name() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def qiu_style_file(path: Path, rows: int, seed: int = 0) -> Path:
    """A countdown.json in Qiu et al.'s format (id, context, numbers, target, solution): their context
    template around evolm's generated problems, 3-4 numbers in 1..99, targets 1..99."""
    from evolm.tasks import make_task

    task = make_task("countdown", numbers=[3, 4], max_number=99, max_target=99)
    examples = task.examples("train", rows, seed=seed)
    random.Random(seed).shuffle(examples)
    data = [{"id": i, "context": QIU_CONTEXT.format(spaced=" ".join(map(str, ex.meta["numbers"])), target=ex.answer),
             "numbers": ex.meta["numbers"], "target": str(ex.answer), "solution": ex.meta["solution"]}
            for i, ex in enumerate(examples)]
    path.write_text(json.dumps(data))
    return path


def _overrides(name: str, args) -> list[str]:
    sizes = [f"model.spec='{args.model}'", "model.dtype='float32'", f"model.threads={args.threads}", "model.device='cpu'",
             f"es.population={args.members}", f"es.prompts_per_iteration={args.prompts}",
             f"generation.max_new_tokens={args.max_new_tokens}", f"generation.batch_size={args.batch_size}",
             "distributed.workers=0"]
    if name != "countdown-qiu":
        return sizes
    if args.countdown_data:
        return sizes + [f"task.params={{path='{args.countdown_data}'}}"]
    path = qiu_style_file(Path(args.out) / "countdown-qiu-style.json", args.prompts + 1)
    return sizes + [f"task.params={{path='{path}', train_rows={args.prompts}, test_rows=1}}"]


def _flops(generator, prompts: list[str], sampling) -> int:
    from torch.utils.flop_counter import FlopCounterMode

    counter = FlopCounterMode(display=False)
    with counter:
        generator.generate(prompts, sampling)
    return counter.get_total_flops()


def gemm_rates(model, rows: tuple[int, ...] = (3136, 32), repeats: int = 9) -> list[dict]:
    """GFLOP/s of a float32 ``F.linear`` against oneDNN's (``evolm.backends.cpu_matmul``) at the model's linear
    shapes, this thread: ``rows`` = a prefill's rows (32 prompts x 98 suffix tokens) and a decode step's (32);
    each shape's two sides alternated ``repeats`` times, medians."""
    import torch

    from evolm.backends.cpu_matmul import _forward

    cfg = model.config.get_text_config() if hasattr(model.config, "get_text_config") else model.config
    h, inter, vocab = cfg.hidden_size, cfg.intermediate_size, cfg.vocab_size
    out = []
    for m in rows:
        for name, (k, n) in {"q/o": (h, h), "gate/up": (h, inter), "down": (inter, h), "lm_head": (h, vocab)}.items():
            if name == "lm_head" and m != rows[-1]:
                continue  # the head runs on the last position only (prefill) or every row (decode)
            layer = torch.nn.Linear(k, n, bias=False)
            x = torch.randn(m, k)
            sides = {"torch": lambda: torch.nn.functional.linear(x, layer.weight), "onednn": lambda: _forward(layer, x)}
            times: dict[str, list[float]] = {side: [] for side in sides}
            with torch.no_grad():
                for fn in sides.values():
                    fn()
                for _ in range(repeats):
                    for side, fn in sides.items():
                        t0 = time.perf_counter()
                        fn()
                        times[side].append(time.perf_counter() - t0)
            flop = 2 * m * k * n
            out.append({"layer": name, "rows": m, "k": k, "n": n,
                        **{f"gflops_{side}": flop / statistics.median(t) / 1e9 for side, t in times.items()}})
    return out


def _layout_stats(generator, tokenizer, prompts: list[str], batch_size: int, max_new_tokens: int) -> dict:
    lengths = [len(tokenizer(p, add_special_tokens=False)["input_ids"]) for p in prompts]
    shared = [len(generator._layout(prompts[s:s + batch_size], max_new_tokens)[2]) for s in range(0, len(prompts), batch_size)]
    return {"prompt_tokens_mean": statistics.mean(lengths), "prompt_tokens_min": min(lengths), "prompt_tokens_max": max(lengths),
            "shared_prefix_per_batch": shared}


def measure(name: str, model, tokenizer, args) -> dict:
    from evolm import config
    from evolm.backends.base import SamplingParams
    from evolm.backends.hf import HFGenerator
    from evolm.es.engine import build_paramset, training_batch
    from evolm.es.population import LocalPopulation
    from evolm.es.update import member_layout
    from evolm.seeding import seed31
    from evolm.tasks import task_from_config

    cfg = config.load(config.ESJob, WORKLOADS[name], _overrides(name, args))
    task = task_from_config(cfg.task)
    examples, prompts = training_batch(task, tokenizer, cfg.run.seed, 0, cfg.es.prompts_per_iteration)
    g = cfg.generation
    sampling = SamplingParams(n=1, temperature=g.temperature, top_p=g.top_p, max_new_tokens=g.max_new_tokens,
                              seed=seed31(cfg.run.seed, "sampling", 0))
    sides = KNOBS[args.knob]
    generators = {mode: HFGenerator(model, tokenizer, batch_size=g.batch_size, **sides[mode]) for mode in ("off", "on")}
    counted = {mode: HFGenerator(model, tokenizer, batch_size=g.batch_size, **{**sides[mode], "cpu_matmul": "torch"})
               for mode in ("off", "on")}
    params = build_paramset(model, cfg)
    pops = {mode: LocalPopulation(params, gen, task) for mode, gen in generators.items()}
    layout = member_layout(cfg.es.estimator, cfg.es.population)

    prefill = SamplingParams(n=1, temperature=0.0, max_new_tokens=1)
    flops = {mode: {"prefill": _flops(gen, prompts, prefill), "call": _flops(gen, prompts, sampling)} for mode, gen in counted.items()}

    seen: dict[str, list] = {"off": [], "on": []}
    for mode, gen in generators.items():
        plain = gen.generate
        gen.generate = lambda *a, _plain=plain, _mode=mode, **k: seen[_mode].append(_plain(*a, **k)) or seen[_mode][-1]
    for gen in generators.values():  # warm-up: first-call costs on neither side's clock
        gen.generate(prompts[:2], SamplingParams(n=1, max_new_tokens=2))
    wall: dict[str, list[float]] = {"off": [], "on": []}
    cpu: dict[str, list[float]] = {"off": [], "on": []}
    fitness: dict[str, list[float]] = {}
    for rep in range(args.repeats):
        for mode in (("off", "on") if rep % 2 == 0 else ("on", "off")):
            seen[mode].clear()
            t0, c0 = time.perf_counter(), time.process_time()
            scores = pops[mode].score(0, layout, cfg.es.sigma, examples, prompts, sampling)
            wall[mode].append(time.perf_counter() - t0)
            cpu[mode].append(time.process_time() - c0)
            fitness[mode] = scores.fitness
    del params, pops  # the noise table, before the next workload builds its own
    rows = {mode: [(c.text, c.num_tokens, c.finished) for outs in seen[mode] for x in outs for c in x] for mode in seen}
    rewards = {mode: [r for outs in seen[mode] for r in task.score(examples, [x[0].text for x in outs], prompts)]
               for mode in seen}
    off, on = statistics.median(wall["off"]), statistics.median(wall["on"])
    off_cpu, on_cpu = statistics.median(cpu["off"]), statistics.median(cpu["on"])
    return {
        "workload": name, "knob": args.knob, "sides": sides, "config": str(WORKLOADS[name].relative_to(ROOT)), "task": cfg.task.name, "reward": str(cfg.task.reward),
        "countdown_data": args.countdown_data or ("qiu-style, generated" if name == "countdown-qiu" else None),
        "members": len(layout), "prompts": len(prompts), "max_new_tokens": g.max_new_tokens, "batch_size": g.batch_size,
        **_layout_stats(generators["on"], tokenizer, prompts, g.batch_size, g.max_new_tokens),
        "seconds_off": off, "seconds_on": on, "speedup": off / on,
        "cpu_seconds_off": off_cpu, "cpu_seconds_on": on_cpu, "cpu_speedup": off_cpu / on_cpu,
        "seconds_all_off": wall["off"], "seconds_all_on": wall["on"],
        "prefill_gflop_off": flops["off"]["prefill"] / 1e9, "prefill_gflop_on": flops["on"]["prefill"] / 1e9,
        "prefill_flops_saved": 1 - flops["on"]["prefill"] / flops["off"]["prefill"],
        "call_gflop_off": flops["off"]["call"] / 1e9, "call_gflop_on": flops["on"]["call"] / 1e9,
        "call_flops_saved": 1 - flops["on"]["call"] / flops["off"]["call"],
        "gflops_off": flops["off"]["call"] * len(layout) / off / 1e9, "gflops_on": flops["on"]["call"] * len(layout) / on / 1e9,
        "prefill_share_of_call_flops": flops["off"]["prefill"] / flops["off"]["call"],
        "completions": len(rows["off"]),
        "identical": sum(a == b for a, b in zip(rows["off"], rows["on"])) / max(1, len(rows["off"])),
        "rewards_equal": sum(a == b for a, b in zip(rewards["off"], rewards["on"])) / max(1, len(rewards["off"])),
        "fitness_equal": sum(a == b for a, b in zip(fitness["off"], fitness["on"])) / max(1, len(fitness["off"])),
        "fitness_off": fitness["off"], "fitness_on": fitness["on"],
        "mean_completion_tokens": statistics.mean(r[1] for r in rows["off"]),
    }


def table(rows: list[dict]) -> str:
    lines = ["| workload | prompt tokens | shared | s/iter off | on | speed-up | CPU s off | on | speed-up "
             "| prefill FLOPs saved | call FLOPs saved | GFLOPS off | on | identical | rewards equal |",
             "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        lines.append(f"| {r['workload']} | {r['prompt_tokens_mean']:.1f} | {r['shared_prefix_per_batch']} "
                     f"| {r['seconds_off']:.1f} | {r['seconds_on']:.1f} | **{r['speedup']:.2f}x** "
                     f"| {r['cpu_seconds_off']:.1f} | {r['cpu_seconds_on']:.1f} | {r['cpu_speedup']:.2f}x "
                     f"| {r['prefill_flops_saved']:.1%} | {r['call_flops_saved']:.1%} | {r['gflops_off']:.0f} | {r['gflops_on']:.0f} "
                     f"| {r['identical']:.3f} | {r['rewards_equal']:.3f} |")
    return "\n".join(lines)


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--out", required=True, help="directory for the result (and the generated Countdown file)")
    p.add_argument("--knob", choices=sorted(KNOBS), default="prefix_cache", help="what the two sides differ in")
    p.add_argument("--model", default="smollm2-135m")
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--workloads", default=",".join(WORKLOADS), help="comma-separated: " + ", ".join(WORKLOADS))
    p.add_argument("--members", type=int, default=8)
    p.add_argument("--prompts", type=int, default=32)
    p.add_argument("--max-new-tokens", type=int, default=16)
    p.add_argument("--batch-size", type=int, default=32)
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--countdown-data", default="", help="Qiu et al.'s countdown.json (default: a file in its format, generated)")
    args = p.parse_args(argv)
    unknown = set(args.workloads.split(",")) - set(WORKLOADS)
    if unknown:
        p.error(f"unknown workloads: {', '.join(sorted(unknown))}")
    Path(args.out).mkdir(parents=True, exist_ok=True)

    import torch

    from evolm import models

    torch.set_num_threads(args.threads)
    model, tokenizer = models.load(args.model, dtype="float32", threads=args.threads)
    rows = [measure(name, model, tokenizer, args) for name in args.workloads.split(",")]
    gemm = gemm_rates(model) if args.knob == "cpu_matmul" else []
    result = {"device": _cpu_name(), "knob": args.knob, "gemm": gemm, "threads": args.threads, "model": args.model, "torch": torch.__version__,
              "dtype": "float32", "repeats": args.repeats, "rows": rows}
    out = Path(args.out) / OUTPUT[args.knob]
    out.write_text(json.dumps(result, indent=1))
    print(table(rows))
    for g in gemm:
        print(f"GEMM {g['layer']} {g['rows']} x {g['k']} @ {g['k']} x {g['n']}: torch {g['gflops_torch']:.0f} GFLOP/s, "
              f"oneDNN {g['gflops_onednn']:.0f} ({g['gflops_onednn'] / g['gflops_torch']:.2f}x)")
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
