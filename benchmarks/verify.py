"""Verification of ES members against the centre (generation.verify): iteration time, decode steps and
acceptance, with and without it, on the default model (HF backend, CPU by default).

    python benchmarks/verify.py                                   # the measurement (see docs/benchmarks.md)
    python benchmarks/verify.py --countdown-data ~/data/countdown.json   # Qiu et al.'s Countdown prompts
    python benchmarks/verify.py --tasks arithmetic --max-new-tokens 8 --sigmas 1e-3 --population 2 --prompts 4 --json ''

Per (task, max_new_tokens, sigma), in one process, with the same members (``es.population`` one-point
members of iteration 0, ``es.prompts_per_iteration`` prompts of the task's training split):

- ``off``: ``LocalPopulation.score`` as ES runs it by default (perturb, generate, restore per member);
- ``on``: the same with ``generation.verify = "on"`` (the centre decoded once, every member verified);
  ``repeats`` alternations off/on, medians reported (plus ``compute_update``, so it is an ES iteration
  without applying the update: both sides keep the same weights);
- decode steps: sequential forward passes of the model's decoder (a forward pre-hook counts them; one
  ``generate`` step = one pass, a teacher-forced forward = one pass, the centre's decode included);
- acceptance: the fraction of members' completions token for token the centre's and the mean
  shared-prefix fraction (``verify_identical``, ``verify_prefix``, as logged in metrics.jsonl);
- agreement: the fraction of members' completions (text, length, finished) equal between off and on
  (below 1 only where a near-tie argmax flipped under the batched forward's rounding; see
  backends/hf_verify.py), and whether the fitnesses are equal.

Writes ``--json`` (default docs/benchmarks/verify.json) and prints a markdown table. Target: >= 2x
fewer sequential decode steps on long completions at the measured acceptance.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path


def _setup(args):
    import torch

    from evolm import models

    torch.set_num_threads(args.threads)
    model, tokenizer = models.load(args.model, threads=args.threads, device=args.device)
    return model, tokenizer


def _paramset(model, args):
    from evolm import config
    from evolm.es.engine import build_paramset

    return build_paramset(model, config.from_dict(config.ESJob, {}, [f"model.spec='{args.model}'", f"model.device='{args.device}'"]))


def _case(model, tokenizer, params, task_name: str, max_new_tokens: int, sigma: float, args) -> dict:
    from evolm import config
    from evolm.backends.base import SamplingParams
    from evolm.backends.hf import HFGenerator
    from evolm.es.engine import training_batch
    from evolm.es.population import LocalPopulation
    from evolm.es.update import compute_update, member_layout
    from evolm.seeding import seed31
    from evolm.tasks import make_task

    data = [f"task.params={{path='{args.countdown_data}'}}", "task.reward='qiu_exact'"] if task_name == "countdown" and args.countdown_data else []
    cfg = config.from_dict(config.ESJob, {}, data + [
        f"model.spec='{args.model}'", f"task.name='{task_name}'", f"es.population={args.population}",
        f"es.prompts_per_iteration={args.prompts}", f"generation.max_new_tokens={max_new_tokens}",
        f"generation.batch_size={args.batch_size}", f"es.sigma={sigma}", f"model.device='{args.device}'"])
    task = make_task(cfg.task.name, cfg.task.reward, None, **cfg.task.params)
    generator = HFGenerator(model, tokenizer, batch_size=args.batch_size)
    layout = member_layout(cfg.es.estimator, cfg.es.population)
    examples, prompts = training_batch(task, tokenizer, cfg.run.seed, 0, cfg.es.prompts_per_iteration)
    sampling = SamplingParams(n=1, max_new_tokens=max_new_tokens, seed=seed31(cfg.run.seed, "sampling", 0))
    pops = {"off": LocalPopulation(params, generator, task), "on": LocalPopulation(params, generator, task, verify="on")}
    seen: dict[str, list] = {"off": [], "on": []}
    plain_generate, verified_generate = generator.generate, pops["on"].verifier.generate
    generator.generate = lambda *a, **k: seen["off"].append(plain_generate(*a, **k)) or seen["off"][-1]
    pops["on"].verifier.generate = lambda *a, **k: seen["on"].append(verified_generate(*a, **k)) or seen["on"][-1]
    steps = [0]
    hook = model.base_model.register_forward_pre_hook(lambda *_: steps.__setitem__(0, steps[0] + 1))
    times: dict[str, list[float]] = {"off": [], "on": []}
    counted: dict[str, int] = {}
    result: dict = {}
    try:
        for rep in range(args.repeats):
            for mode in ("off", "on"):
                seen[mode].clear()
                steps[0] = 0
                t0 = time.perf_counter()
                scores = pops[mode].score(0, layout, sigma, examples, prompts, sampling)
                compute_update(scores.fitness, estimator=cfg.es.estimator, shaping=cfg.es.shaping, lr=cfg.es.lr,
                               sigma=sigma, divide_by_sigma=cfg.es.divide_by_sigma, errors=scores.errors)
                times[mode].append(time.perf_counter() - t0)
                counted[mode] = steps[0]
                result[f"fitness_{mode}"] = scores.fitness
                if mode == "on":
                    result.update({k: scores.extra[k] for k in ("verify_identical", "verify_prefix")})
    finally:
        hook.remove()
        generator.generate = plain_generate
    off_rows = [(c.text, c.num_tokens, c.finished) for outs in seen["off"] for x in outs for c in x]
    on_rows = [(c.text, c.num_tokens, c.finished) for outs, _ in seen["on"] for x in outs for c in x]
    tokens_off = sum(r[1] for r in off_rows)
    seconds_off, seconds_on = statistics.median(times["off"]), statistics.median(times["on"])
    return {"task": task_name, "max_new_tokens": max_new_tokens, "sigma": sigma, "members": len(layout), "prompts": len(prompts),
            "seconds_off": seconds_off, "seconds_on": seconds_on, "speedup": seconds_off / seconds_on,
            "decode_steps_off": counted["off"], "decode_steps_on": counted["on"],
            "decode_step_ratio": counted["off"] / max(1, counted["on"]),
            "mean_completion_tokens": tokens_off / max(1, len(off_rows)),
            "agreement": sum(a == b for a, b in zip(off_rows, on_rows)) / max(1, len(off_rows)),
            "fitness_equal": result["fitness_off"] == result["fitness_on"],
            "verify_identical": result["verify_identical"], "verify_prefix": result["verify_prefix"],
            "seconds_all_off": times["off"], "seconds_all_on": times["on"]}


def table(rows: list[dict]) -> str:
    lines = ["| task | new tokens | sigma | mean tokens | identical | shared prefix | iteration off (s) | on (s) | speed-up "
             "| decode steps off | on | ratio | agreement |",
             "|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        lines.append(f"| {r['task']} | {r['max_new_tokens']} | {r['sigma']:g} | {r['mean_completion_tokens']:.1f} "
                     f"| {r['verify_identical']:.2f} | {r['verify_prefix']:.2f} | {r['seconds_off']:.1f} | {r['seconds_on']:.1f} "
                     f"| {r['speedup']:.2f}x | {r['decode_steps_off']} | {r['decode_steps_on']} | {r['decode_step_ratio']:.2f}x "
                     f"| {r['agreement']:.3f} |")
    return "\n".join(lines)


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", default="smollm2-135m")
    p.add_argument("--device", default="cpu")
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--tasks", default="arithmetic,countdown", help="comma-separated task names")
    p.add_argument("--max-new-tokens", default="16,256", help="comma-separated completion length limits")
    p.add_argument("--sigmas", default="1e-3,3e-3", help="comma-separated perturbation scales")
    p.add_argument("--population", type=int, default=8)
    p.add_argument("--prompts", type=int, default=16)
    p.add_argument("--batch-size", type=int, default=16)
    p.add_argument("--repeats", type=int, default=1)
    p.add_argument("--countdown-data", default="", help="Qiu et al.'s countdown.json (their prompts, qiu_exact reward); "
                                                         "default: evolm's generated countdown problems")
    p.add_argument("--json", default="docs/benchmarks/verify.json", help="write results here ('' for nowhere)")
    args = p.parse_args(argv)
    model, tokenizer = _setup(args)
    params = _paramset(model, args)
    rows = []
    for task in args.tasks.split(","):
        for n in (int(x) for x in args.max_new_tokens.split(",")):
            for sigma in (float(x) for x in args.sigmas.split(",")):
                rows.append(_case(model, tokenizer, params, task, n, sigma, args))
                print(table(rows[-1:]).splitlines()[-1], flush=True)
    settings = {k: v for k, v in vars(args).items() if k != "json"}
    if args.json:
        Path(args.json).parent.mkdir(parents=True, exist_ok=True)
        Path(args.json).write_text(json.dumps({"settings": settings, "results": rows}, indent=2) + "\n")
    print(table(rows))


if __name__ == "__main__":
    main()
