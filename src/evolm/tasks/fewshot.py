"""Worked demonstrations for dataset tasks (multiple choice, GSM8K), so a base model answers in the format.

A base model (Gemma-3-270M, no chat template) given a zero-shot multiple-choice prompt does not
answer: it writes a new question's choice list (``A. 1.\\nB. 2. ...``), whose first line the letter
rule reads as "A" (measured on 16 CSQA / ARC-Easy test problems: every greedy completion was a new
choice list; see docs/results.md). Shown a few solved problems first, it answers ``Answer: C`` at once.

Design decisions:

- Task param ``shots``: the number of demonstrations. Unset (the default), it is 0 for chat models
  (prompts through a chat template: the instruction is enough there, and SmolLM2's measured numbers
  stay as they were) and the task's ``base_shots`` for plain-text prompts (a tokenizer without a chat
  template); an integer forces it for both.
- Where demonstrations come from: a task's bundled ``train`` split when it has one (CSQA, ARC: a
  seeded draw, so never a held-out problem), else demonstrations written for evolm in the task module
  (``written_demonstrations``: SST-2, GSM8K, whose train splits are not shipped offline; they are not
  taken from any split). Multiple-choice demonstrations are chosen with distinct gold letters, so they
  do not teach one letter.
- A demonstration's reply is what the checker reads first: ``Answer: B`` for multiple choice (rule 1
  of ``multiple_choice``, first occurrence) and a short worked solution ending in GSM8K's own
  ``#### N`` marker (its checker takes the first ``#### N``). A base model that goes on to invent the
  next question after answering is therefore scored on its first answer.
- Rendering matches ``procedural``: chat models get user/assistant turns; plain text is
  ``{BOS}{instruction}\\n\\n{question}\\n{reply}\\n\\n ... {question}\\n``.
"""

from __future__ import annotations

import random
from typing import Any

from evolm.errors import ConfigError
from evolm.tasks.base import Example, bos_text

MAX_SHOTS = 8
DEMONSTRATION_SEED = 1234
"""Seed of the draw of train-split demonstrations (fixed: every prompt shows the same ones)."""


def uses_chat_template(tokenizer) -> bool:
    return tokenizer is not None and bool(getattr(tokenizer, "chat_template", None))


class FewShot:
    """Mixin for ``DatasetTask`` subclasses: the ``shots`` param, demonstrations, and rendering with them.

    Subclasses implement ``demonstration_reply`` and either have a ``train`` split or set
    ``written_demonstrations``.
    """

    base_shots: int = 3
    """Demonstrations on plain-text (base-model) prompts when ``shots`` is not set."""
    written_demonstrations: list[dict] = []
    """Rows in the task's own layout, used when the task has no train split."""

    def configure_task(self, shots: int | None = None, **params: Any) -> None:
        if shots is not None and (isinstance(shots, bool) or not isinstance(shots, int) or not 0 <= shots <= MAX_SHOTS):
            raise ConfigError(f"task '{self.name}': shots must be an integer in [0, {MAX_SHOTS}] (got {shots!r})")
        self.shots = shots
        self._demos: dict[int, list[tuple[str, str]]] = {}
        super().configure_task(**params)
        if shots and not self.has_demonstrations():
            raise ConfigError(f"task '{self.name}' has no demonstrations to show (no train split, none written); use shots=0")

    def _extra_param_names(self) -> str:
        return ", shots" + super()._extra_param_names()

    # -- where demonstrations come from -----------------------------------------------------------
    def has_demonstrations(self) -> bool:
        return bool(self.written_demonstrations) or ("train" in self.splits and ("train" in self.bundled or bool(self.train_path)))

    def shots_for(self, tokenizer) -> int:
        """How many demonstrations a prompt for ``tokenizer`` shows."""
        if self.shots is not None:
            return self.shots
        return 0 if uses_chat_template(tokenizer) or not self.has_demonstrations() else self.base_shots

    def demonstration_examples(self, count: int) -> list[Example]:
        """``count`` solved examples: written ones, else a seeded draw from the train split."""
        if self.written_demonstrations:
            return [self.parse_row(row, i) for i, row in enumerate(self.written_demonstrations[:count])]
        pool = self.all_examples("train")
        order = list(range(len(pool)))
        random.Random(DEMONSTRATION_SEED).shuffle(order)
        chosen: list[Example] = []
        answers: set = set()
        for i in order:  # distinct gold answers first (multiple choice: distinct letters)
            if len(chosen) == count:
                break
            if pool[i].answer not in answers:
                chosen.append(pool[i])
                answers.add(pool[i].answer)
        for i in order:  # then any, if there are fewer distinct answers than demonstrations
            if len(chosen) == count:
                break
            if pool[i] not in chosen:
                chosen.append(pool[i])
        return chosen

    def demonstration_reply(self, example: Example) -> str:
        """What a demonstration shows as the answer to ``example``."""
        raise NotImplementedError

    def demonstrations(self, count: int) -> list[tuple[str, str]]:
        if count not in self._demos:
            self._demos[count] = [(e.question, self.demonstration_reply(e)) for e in self.demonstration_examples(count)]
        return self._demos[count]

    # -- rendering --------------------------------------------------------------------------------
    def messages(self, example: Example) -> list[dict[str, str]]:
        """Chat turns (used only with a chat template, where demonstrations are shown when ``shots`` is set)."""
        msgs = [{"role": "system", "content": self.system_prompt}] if self.system_prompt else []
        for question, reply in self.demonstrations(self.shots or 0):
            msgs += [{"role": "user", "content": question}, {"role": "assistant", "content": reply}]
        return msgs + [{"role": "user", "content": example.question}]

    def render_prompt(self, example: Example, tokenizer=None) -> str:
        if uses_chat_template(tokenizer):
            return tokenizer.apply_chat_template(self.messages(example), tokenize=False, add_generation_prompt=True)
        shots = self.shots_for(tokenizer)
        if shots == 0:
            return super().render_prompt(example, tokenizer)
        demos = self.demonstrations(shots)
        head = f"{self.system_prompt}\n\n" if self.system_prompt else ""
        shown = "".join(f"{question}\n{reply}\n\n" for question, reply in demos)
        return f"{bos_text(tokenizer)}{head}{shown}{example.question}\n"
