"""Countdown: combine the given numbers with + - * / and parentheses to hit a target, each number once.

The defaults (2 or 3 numbers from 1-10, target at most 50) and the prompt were chosen by probing the
real SmolLM2-135M-Instruct (float32, 1 CPU thread, 24 new tokens, test split, seed 0). The prompt is a
system message, one worked demonstration turn (a train problem) and the question, e.g.::

    system:    Combine the numbers with + - * / to reach the target. Use each number exactly once.
    user:      Numbers: 3, 3. Target: 6.
    assistant: <answer>3 + 3</answer>
    user:      Numbers: 5, 10. Target: 15.

Measured with it (final code, 64 test problems of seed 0, of which 33 use 2 numbers): greedy
accuracy 21.9%, 21.9% tagged, 4.7% tagged and correct. An earlier version of the sampler (which drew
fewer 2-number problems once their few test problems were used up) gave greedy 10.9% on 64 (23.4%
tagged; 10.2 new tokens on average) and, sampled at temperature 1 on 32 of them, pass@1 3.9% and
pass@8 15.6% (greedy 3.1% on those 32). The model often answers ``1 + 7 = 8`` without tags, which is
why an untagged first line is still checked (format term 0). Other wordings on 48 problems: "Make T
from a, b." 4.2%; a TinyZero-style question asking for ``<answer></answer>`` tags (129 prompt tokens)
8.3% correct, 69% tagged; a demonstration reply ``3 + 3 = 6`` instead of tags 12.5% correct, 0%
tagged. (Three to four numbers, zero-shot, were reported at about 0% before; not re-measured here.)

Gemma-3-270M (base model; the same prompt as plain text opened by its BOS token, 24 new tokens, 32
test problems): greedy 12.5% with one demonstration, 15.6% with three, every first line a tagged
equation (format 100%). It then writes the next problem (it never stops), and the checker reads the
*last* ``<answer>`` block: at 24 tokens the invented problem's block is not complete yet, so its own
answer is read; longer limits on a base model would score the invented problem's answer instead.

The default space is small: 2,590 problems (159 with 2 numbers), 494 of them test (about 30 with 2
numbers), so large test draws repeat problems (see ``procedural``). ``max_number=20, max_target=100``
gives 16,854 problems (3,392 test) at a difficulty not measured here.

Design decisions:

- Knobs: ``numbers`` (how many numbers per problem, an int or a list of ints drawn uniformly per
  problem, each in 2-6), ``max_number`` (numbers are drawn from 1..max_number), ``max_target``
  (targets lie in 1..max_target).
- Every problem is solvable by construction: the numbers are combined in a random order by a random
  binary expression in which every intermediate result is a positive integer (``-`` only when the
  left side is larger, ``/`` only when it divides exactly), and the result becomes the target when it
  is within 1..max_target; otherwise the draw is repeated. That solution is kept in ``meta``.
- A problem's split key is its sorted numbers and target, so a train problem never reappears in the
  test split with its numbers shuffled.
- The model's equation is never ``eval``-ed. It is at most ``MAX_EQUATION_CHARS`` characters long, may
  contain only digits, spaces, ``+ - * / ( )`` (``×``, ``÷`` are read as ``*``, ``/``), is parsed with
  ``ast.parse(mode="eval")`` and walked by ``evaluate_equation``, which accepts only binary
  ``+ - * /`` and integer literals (no unary minus or plus, no ``**`` or ``//``, no names, calls or
  attributes), checks that the literals are exactly the given multiset of numbers before any
  arithmetic, and computes with ``fractions.Fraction``. Division by zero makes the equation invalid.
  Non-integer intermediate results are allowed (``6 / (1 / 3)`` hits 18): the check is that the
  exact value of the equation equals the target.
- ``shots`` (default 1) worked demonstrations precede the question (see ``procedural``).
- Answer extraction: the content of the last ``<answer>...</answer>`` if there is one, otherwise the
  completion's first non-empty line (later lines are ignored). A trailing period is dropped, and a
  trailing ``= N`` is allowed (``<answer>1 + 7 = 8</answer>``): then N must equal the target too.
  Nothing else is searched for, so listing several attempts earns nothing beyond the first.
- ``format_ok`` (the 0.1 term of the lenient conventions ``format_answer`` and ``tiered``): the
  equation is inside ``<answer>`` tags and is well formed (parses under the rules above), whatever
  numbers it uses or value it has. A correct untagged first line is correct with ``format_ok`` False
  (format_answer 1.0 instead of 1.1; tiered 1.0 either way). All of this is evolm's lenient checker,
  made for small models; the references are stricter in some places and looser in others.
- The reference conventions ``qiu_exact``, ``qiu_hf_exact`` and ``tinyzero_exact`` replace the checker as well as the
  reward: ``check`` then reports the reference's judgement (``evolm.reference_rewards``; correct =
  the reference's answer term is 1, ``format_ok`` = Qiu's full ``<think>``/``<answer>`` layout, or
  for TinyZero an answer was found on the last line), and ``reward`` the reference's total.
  ``qiu_hf_exact`` scores prompt + completion, as Qiu et al.'s HF-generate scripts decode and score it (their
  countdown.json prompt alone earns 0.06 there: its ``<think> </think>`` and its example answer block; see
  ``evolm.reference_rewards``); ``qiu_exact`` the completion, as their vLLM scripts do.
  TinyZero scores prompt + response: for a prompt from a data file that is the file's prompt text;
  for prompts evolm renders (its template, or chat messages) the completion is scored as following
  ``<|im_start|>assistant\n``, the end of a ChatML prompt (SmolLM2's and Qwen's templates): its last
  line is read. (TinyZero's code, given a prompt with no ``Assistant:`` or ``<|im_start|>assistant``,
  scores every response 0; a data file whose prompts have no marker is refused with tinyzero_exact.)
  Qiu et al.'s evaluation scripts read a file's target text with ``int(t) if t.isdigit() else None``;
  with no target the answer term is 0, so under qiu_exact the 58 test rows of countdown.json whose
  target is negative or not an integer (``"-15"``, ``"27.4"``) cannot be answered correctly, as in
  their evaluation. (Their vLLM training script uses ``float(target)`` instead; the 200 training rows
  all have digit-only targets, so the two agree there.) The lenient checker compares with the
  target's value: exactly for an integer target, within 1e-9 (relative) for a non-integer one.
- Data files (``path``, ``train_path``; ``evolm.tasks.countdown_data``): Qiu et al.'s countdown.json
  and TinyZero's files. A row's own prompt text is fed verbatim (no system message, no
  demonstrations, no chat template); rows without one get evolm's question and demonstrations.
- Votes (maj@k, distinct-correct) use the equation's normal form (``evolm.tasks.canonical``), after
  the lenient checker's own clean-up (``×``/``÷``, a trailing period, a trailing ``= N``) under the
  lenient conventions.
"""

from __future__ import annotations

import ast
import random
import re
from collections import Counter
from fractions import Fraction

from evolm.errors import ConfigError, UserError
from evolm.reference_rewards import (TINYZERO_MARKERS, ReferenceScore, qiu_answer, qiu_hf_score, qiu_response,
                                     qiu_score, tinyzero_answer, tinyzero_score)
from evolm.rewards import EXACT, Verdict
from evolm.tasks.base import register
from evolm.tasks.base import Example, special_token_affixes
from evolm.tasks.canonical import canonical_equation
from evolm.tasks.countdown_data import CountdownFiles, CountdownRow, seeded_subset
from evolm.tasks.procedural import ProceduralTask, answer_text, int_knob, reject_unknown

MAX_EQUATION_CHARS = 200
"""Longer candidate equations are rejected unparsed (a cap on parser work and on the walk's depth)."""
_EQUATION_CHARS = re.compile(r"^[0-9 +\-*/()]+$")
_BINARY_OPS = {ast.Add: lambda a, b: a + b, ast.Sub: lambda a, b: a - b,
               ast.Mult: lambda a, b: a * b, ast.Div: lambda a, b: a / b}


CHATML_PROMPT_END = "<|im_start|>assistant\n"
"""What tinyzero_exact assumes precedes a completion whose prompt evolm rendered (see the module docstring)."""


class InvalidEquation(ValueError):
    """The text is not a countdown equation over the given numbers."""


def normalise_equation(text: str) -> str:
    """The candidate equation with ``×``/``÷`` replaced by ``*``/``/`` and surrounding space stripped."""
    return text.replace("×", "*").replace("÷", "/").strip()


def parse_equation(text: str) -> ast.expr:
    """The syntax tree of a well-formed equation (only + - * /, parentheses and integer literals)."""
    text = normalise_equation(text)
    if not text or len(text) > MAX_EQUATION_CHARS or not _EQUATION_CHARS.match(text):
        raise InvalidEquation("not a short expression over digits, + - * / and parentheses")
    try:
        tree = ast.parse(text, mode="eval").body
    except (SyntaxError, ValueError, RecursionError, MemoryError) as e:
        raise InvalidEquation(f"does not parse: {e}") from None
    for node in ast.walk(tree):
        if isinstance(node, ast.BinOp):
            if type(node.op) not in _BINARY_OPS:
                raise InvalidEquation(f"operator {type(node.op).__name__} is not allowed")
        elif isinstance(node, ast.Constant):
            if type(node.value) is not int:
                raise InvalidEquation(f"literal {node.value!r} is not an integer")
        elif not isinstance(node, ast.operator):
            raise InvalidEquation(f"{type(node).__name__} is not allowed")
    return tree


def evaluate_equation(text: str, numbers: list[int]) -> Fraction:
    """The exact value of ``text`` if it uses each of ``numbers`` exactly once; else ``InvalidEquation``."""
    tree = parse_equation(text)
    used = Counter(node.value for node in ast.walk(tree) if isinstance(node, ast.Constant))
    if used != Counter(numbers):
        raise InvalidEquation(f"uses {sorted(used.elements())}, not each of {sorted(numbers)} exactly once")

    def value(node: ast.expr) -> Fraction:
        if isinstance(node, ast.Constant):
            return Fraction(node.value)
        left, right = value(node.left), value(node.right)
        if isinstance(node.op, ast.Div) and right == 0:
            raise InvalidEquation("division by zero")
        return _BINARY_OPS[type(node.op)](left, right)

    return value(tree)


@register
class Countdown(ProceduralTask):
    name = "countdown"
    instruction = "Combine the numbers with + - * / to reach the target. Use each number exactly once."
    question_template = "Numbers: {numbers}. Target: {target}."
    """How a problem is asked; ``{numbers}`` is e.g. ``3, 5, 7`` and ``{target}`` e.g. ``22``."""

    reply_template = "<answer>{solution}</answer>"
    """The demonstration's reply."""

    exact_conventions = ("qiu_exact", "qiu_hf_exact", "tinyzero_exact")

    def configure(self, numbers: int | list[int] = (2, 3), max_number: int = 10, max_target: int = 50,
                  shots: int = 1, path: str | None = None, train_path: str | None = None,
                  train_rows: int | None = None, test_rows: int | None = None, **unknown) -> None:
        reject_unknown(self.name, unknown, ["numbers", "max_number", "max_target", "shots", "path", "train_path",
                                            "train_rows", "test_rows"])
        self.data = CountdownFiles.from_params(path, train_path, train_rows, test_rows)  # None: generated problems
        self.params = self.data.params if self.data else {}
        self._file_examples: dict[str, list[Example]] = {}
        self.shots = int_knob(self.name, "shots", shots, 0, 8)
        counts = [numbers] if isinstance(numbers, int) and not isinstance(numbers, bool) else numbers
        if not isinstance(counts, (list, tuple)) or not counts:
            raise ConfigError(f"task '{self.name}': numbers must be an integer or a list of integers in [2, 6] "
                              f"(got {numbers!r})")
        self.numbers = sorted({int_knob(self.name, "numbers", n, 2, 6) for n in counts})
        self.max_number = int_knob(self.name, "max_number", max_number, 1, 10_000)
        self.max_target = int_knob(self.name, "max_target", max_target, 1, 1_000_000)

    def knobs(self) -> dict:
        return {"numbers": self.numbers, "max_number": self.max_number, "max_target": self.max_target}

    def stratum(self, rng: random.Random) -> int:
        return rng.choice(self.numbers)

    def sample(self, rng: random.Random, stratum: int) -> tuple[str, Example]:
        count = stratum
        for _ in range(10_000):
            nums = [rng.randint(1, self.max_number) for _ in range(count)]
            found = _random_solution(nums, rng)
            if found and 1 <= found[0] <= self.max_target:
                target, solution = found
                break
        else:
            raise ConfigError(f"task '{self.name}': no solvable problem found with {self.knobs()}; "
                              "raise max_target or max_number")
        key = f"{','.join(map(str, sorted(nums)))}->{target}"
        question = self.question_template.format(numbers=", ".join(map(str, nums)), target=target)
        example = Example(id=f"{self.name}:{key}", question=question, answer=target,
                          meta={"numbers": nums, "solution": solution})
        return key, example

    def demonstration_answer(self, example: Example) -> str:
        return self.reply_template.format(solution=example.meta["solution"], target=example.answer)

    # -- problems from data files ------------------------------------------------------------------
    def examples(self, split: str, count: int | None = None, seed: int = 0) -> list[Example]:
        if self.data is None:
            return super().examples(split, count, seed)
        if split not in self.splits:
            raise ConfigError(f"task '{self.name}': split must be one of {', '.join(self.splits)} (got '{split}')")
        if count is not None and (isinstance(count, bool) or not isinstance(count, int) or count < 0):
            raise ConfigError(f"task '{self.name}': count must be a non-negative integer (got {count!r})")
        if split not in self._file_examples:
            rows = self.data.rows(split)
            self._refuse_markerless_prompts(rows)
            self._file_examples[split] = [self._file_example(row) for row in rows]
        return seeded_subset(self._file_examples[split], count, seed)

    def _file_example(self, row: CountdownRow) -> Example:
        meta = {"numbers": list(row.numbers), "solution": row.solution, "target_text": row.target_text}
        if row.prompt is not None:
            meta.update(prompt=row.prompt, special_tokens=row.special_tokens)
            question = row.prompt
        elif row.messages is not None:
            meta["messages"] = [{"role": role, "content": content} for role, content in row.messages]
            question = row.messages[-1][1]
        else:
            question = self.question_template.format(numbers=", ".join(map(str, row.numbers)), target=row.target)
        return Example(id=f"{self.name}/{row.id}", question=question, answer=row.target, meta=meta)

    def _refuse_markerless_prompts(self, rows: list[CountdownRow]) -> None:
        if self.reward_name != "tinyzero_exact":
            return
        for row in rows:
            if row.prompt is not None and not any(marker in row.prompt for marker in TINYZERO_MARKERS):
                raise UserError(f"task.reward = 'tinyzero_exact' would score every completion 0 on these prompts: TinyZero "
                                f"reads the answer after 'Assistant:' or '<|im_start|>assistant', and the prompt of row "
                                f"{row.id} of {self.data.path if self.data else 'the data'} has neither; use qiu_exact "
                                f"for Qiu et al.'s countdown.json")

    # -- prompting ---------------------------------------------------------------------------------
    def verbatim_prompt(self, example: Example) -> str | None:
        return example.meta.get("prompt")

    def messages(self, example: Example) -> list[dict[str, str]]:
        if example.meta.get("messages"):
            return [dict(m) for m in example.meta["messages"]]
        if example.meta.get("prompt") is not None:
            return [{"role": "user", "content": example.meta["prompt"]}]
        return super().messages(example)

    def render_prompt(self, example: Example, tokenizer=None) -> str:
        prompt = example.meta.get("prompt")
        if prompt is not None:
            if example.meta.get("special_tokens") and tokenizer is not None:
                prefix, suffix = special_token_affixes(tokenizer)
                return f"{prefix}{prompt}{suffix}"
            return prompt
        if example.meta.get("messages"):
            if tokenizer is not None and getattr(tokenizer, "chat_template", None):
                return tokenizer.apply_chat_template(self.messages(example), tokenize=False, add_generation_prompt=True)
            return "\n\n".join(m["content"] for m in example.meta["messages"]) + "\n"
        return super().render_prompt(example, tokenizer)

    # -- scoring -----------------------------------------------------------------------------------
    def extract_answer(self, completion: str) -> str | None:
        if self.reward_name in QIU_CONVENTIONS:  # qiu_hf_exact: without the example, the completion's answer
            return qiu_answer(qiu_response(completion), (), 0)[1]
        if self.reward_name == "tinyzero_exact":  # no example, so no file prompt: read as after a ChatML prompt
            return tinyzero_answer(CHATML_PROMPT_END + completion)
        return answer_text(completion)[0]

    def reference_score(self, completion: str, example: Example) -> ReferenceScore:
        """The completion scored by the configured reference convention (qiu_exact, qiu_hf_exact or tinyzero_exact)."""
        numbers, target = example.meta["numbers"], example.answer
        if self.reward_name in QIU_CONVENTIONS:
            text = example.meta.get("target_text")
            if text is not None:  # their evaluation reads the file's target text with isdigit(): else no target
                target = int(text) if text.isdigit() else None
            if self.reward_name == "qiu_hf_exact":
                return qiu_hf_score(self.hf_prompt_text(example), completion, numbers, target)
            return qiu_score(completion, numbers, target)
        prompt = example.meta.get("prompt")
        return tinyzero_score((CHATML_PROMPT_END if prompt is None else prompt) + completion, numbers, target)

    def hf_prompt_text(self, example: Example) -> str:
        """The prompt as Qiu et al.'s HF-generate scripts decode it before the completion (qiu_hf_exact): a data
        file's prompt verbatim (their countdown.json contexts round-trip through SmolLM2's and Qwen's tokenizers;
        a BOS token is a special token, skipped in decoding), else evolm's plain-text rendering of its question
        and demonstrations (what a chat template adds around them besides special tokens is not reproduced)."""
        prompt = example.meta.get("prompt")
        return prompt if prompt is not None else ProceduralTask.render_prompt(self, example, None)

    def exact_reward(self, completion: str, example: Example) -> float:
        return self.reference_score(completion, example).reward

    def check(self, completion: str, example: Example) -> Verdict:
        if self.reward_name in EXACT:
            score = self.reference_score(completion, example)
            format_ok = score.format_reward == 1.0 if self.reward_name in QIU_CONVENTIONS else score.answer is not None
            return Verdict(format_ok=format_ok, correct=score.correct, answer=score.answer)
        return check_equation(completion, example.meta["numbers"], example.answer)

    def canonical_answer(self, answer: str | None) -> str | None:
        if answer is None:
            return None
        if self.reward_name not in EXACT:  # the lenient checker's own clean-up: x/÷, a trailing period, "= N"
            answer = normalise_equation(answer).rstrip(". ")
            claimed = _CLAIMED_RESULT.match(answer)
            answer = claimed.group(1) if claimed else answer
        return canonical_equation(answer)


_CLAIMED_RESULT = re.compile(r"^(.*?)=\s*(-?[0-9]+)$", re.DOTALL)
QIU_CONVENTIONS = ("qiu_exact", "qiu_hf_exact")
"""The two readings of Qiu et al.'s reward: the completion (their vLLM scripts) or prompt + completion (HF)."""


def check_equation(completion: str, numbers: list[int], target: int) -> Verdict:
    """Verdict for a countdown completion (see the module docstring for what is accepted)."""
    answer, tagged = answer_text(completion)
    if answer is None or len(answer) > MAX_EQUATION_CHARS + 16:
        return Verdict(format_ok=False, correct=False, answer=answer)
    equation, claimed = answer.rstrip(". "), None
    match = _CLAIMED_RESULT.match(equation)
    if match:
        equation, claimed = match.group(1), int(match.group(2))
    try:
        parse_equation(equation)
    except InvalidEquation:
        return Verdict(format_ok=False, correct=False, answer=answer)
    try:
        value = evaluate_equation(equation, numbers)
    except InvalidEquation:  # well formed, but wrong numbers or a division by zero
        return Verdict(format_ok=tagged, correct=False, answer=answer)
    if isinstance(target, int):
        hit = value == target
    else:  # a non-integer target from a data file (a float written in decimal): equal up to float precision
        hit = abs(float(value) - float(target)) <= 1e-9 * max(1.0, abs(float(target)))
    correct = hit and (claimed is None or claimed == target)
    return Verdict(format_ok=tagged, correct=correct, answer=answer)


_PRECEDENCE = {"+": 1, "-": 1, "*": 2, "/": 2, None: 3}


def _random_solution(numbers: list[int], rng: random.Random) -> tuple[int, str] | None:
    """Combine ``numbers`` by a random expression with positive-integer intermediates: (value, text).

    Returns None when a drawn step would leave the positive integers (the caller draws again).
    Parentheses are written only where precedence needs them.
    """
    items = [(n, str(n), None) for n in numbers]  # (value, text, top-level operator)
    while len(items) > 1:
        i, j = rng.sample(range(len(items)), 2)
        (a, ta, opa), (b, tb, opb) = items[i], items[j]
        op = rng.choice("+-*/")
        if op == "-" and a <= b or op == "/" and a % b:
            return None
        value = {"+": a + b, "-": a - b, "*": a * b, "/": a // b}[op]
        if _PRECEDENCE[opa] < _PRECEDENCE[op]:
            ta = f"({ta})"
        if _PRECEDENCE[opb] < _PRECEDENCE[op] or _PRECEDENCE[opb] == _PRECEDENCE[op] and op in "-/":
            tb = f"({tb})"
        items = [item for k, item in enumerate(items) if k not in (i, j)] + [(value, f"{ta} {op} {tb}", op)]
    return items[0][0], items[0][1]
