"""The evaluator the re-evaluation analyses call: ``evaluate(state_dict) -> {metric: value}``.

The sparsity curve and the compression table only need *some* callable that scores a state dict;
tests pass a fake one. ``TaskEvaluator`` is the real one: it owns one loaded model, copies each
state dict into it (``weights.load_into_model``), and scores a fixed list of task examples with the
Hugging Face backend.

Metrics:

- ``greedy_pass@1``: the mean of ``task.is_correct`` over the examples with greedy decoding.
- ``pass@k`` for each k in ``ks`` (when ``n > 0``): the unbiased estimator from ``n`` samples per
  example at ``temperature``, averaged over examples; every evaluation uses the same sampling seed,
  so model variants are compared on common random numbers.

Design decisions:

- A thin adapter on ``HFGenerator`` and ``Task`` rather than ``evolm.evaluate``: a variant is a state
  dict loaded into one resident model, not a model spec, and only a number per metric is needed (no
  per-problem records, no generation cache). pass@k is ``evolm.metrics.pass_at_k_problem``.
- The examples are drawn once (``task.examples(split, limit, seed)``), so every variant sees the same
  prompts.
- Each call also returns ``problems``: one ``{id, greedy_correct[, n, c]}`` per example, the per-problem
  fields of an ``evolm eval`` report, so a caller can write an evaluation file that ``evolm report --study``
  pairs over problems (an interval, not only a mean). Callers that keep only numbers pop it.
"""

from __future__ import annotations

from evolm.analysis.weights import load_into_model
from evolm.backends.base import SamplingParams
from evolm.errors import UserError
from evolm.metrics import pass_at_k_problem as pass_at_k


class TaskEvaluator:
    """Score state dicts on one task with one model skeleton: ``TaskEvaluator(...)(state) -> metrics``."""

    def __init__(self, model, tokenizer, task, examples, n: int = 0, ks=(1,), temperature: float = 1.0,
                 top_p: float = 1.0, max_new_tokens: int = 32, batch_size: int = 32, seed: int = 0):
        from evolm.backends.hf import HFGenerator  # local: imports torch and transformers (slow to import)

        bad = [k for k in ks if k > n] if n else []
        if bad:
            raise UserError(f"pass@{bad[0]} needs at least {bad[0]} samples per example; raise --n to {max(ks)}")
        self.model = model
        self.tokenizer = tokenizer
        self.task = task
        self.examples = list(examples)
        self.prompts = [task.render_prompt(e, tokenizer) for e in self.examples]
        self.generator = HFGenerator(model, tokenizer, batch_size=batch_size)
        self.n, self.ks = int(n), tuple(int(k) for k in ks)
        self.temperature, self.top_p = temperature, top_p
        self.max_new_tokens, self.seed = max_new_tokens, seed
        self.calls = 0

    def __call__(self, state: dict) -> dict:
        load_into_model(self.model, state)
        self.calls += 1
        greedy = self.generator.generate(self.prompts, SamplingParams(n=1, temperature=0.0, max_new_tokens=self.max_new_tokens))
        correct = [v.correct for v in self.task.judge(self.examples, [c[0].text for c in greedy], self.prompts)]
        metrics = {"greedy_pass@1": sum(correct) / len(correct) if correct else 0.0, "num_examples": len(correct)}
        problems = [{"id": str(e.id), "greedy_correct": bool(ok)} for e, ok in zip(self.examples, correct)]
        if self.n > 0:
            params = SamplingParams(n=self.n, temperature=self.temperature, top_p=self.top_p,
                                    max_new_tokens=self.max_new_tokens, seed=self.seed)
            sampled = self.generator.generate(self.prompts, params)
            flat = [(e, c.text, p) for comps, e, p in zip(sampled, self.examples, self.prompts) for c in comps]
            verdicts = iter(self.task.judge([f[0] for f in flat], [f[1] for f in flat], [f[2] for f in flat]))
            counts = [sum(bool(next(verdicts).correct) for _ in comps) for comps in sampled]
            for k in self.ks:
                metrics[f"pass@{k}"] = sum(pass_at_k(self.n, c, k) for c in counts) / len(counts)
            metrics["samples_per_example"] = self.n
            for p, c in zip(problems, counts):
                p.update(n=self.n, c=int(c))
        metrics["problems"] = problems
        return metrics
