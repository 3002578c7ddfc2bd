"""Tasks: the built-in arithmetic problems, a GSM8K-style loader, and chat-format prompts.

Every example has the columns the trainers and rewards use:
    prompt      list of chat messages, e.g. [{"role": "user", "content": "What is 23 + 45?"}]
    answer      the verifiable final answer as a string, e.g. "68"
    completion  (demonstrations only) the target text "<reasoning>…</reasoning><answer>68</answer>"
"""

from __future__ import annotations

import json
import random
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from datasets import Dataset

REASONING_OPEN, REASONING_CLOSE = "<reasoning>", "</reasoning>"
ANSWER_OPEN, ANSWER_CLOSE = "<answer>", "</answer>"

QUESTION_TEMPLATES = (
    "What is {a} + {b}?",
    "Add {a} and {b}.",
    "Compute {a} plus {b}.",
    "{a} + {b} = ?",
)


def format_completion(reasoning: str, answer: str) -> str:
    """The output format every reward checks: `<reasoning>…</reasoning><answer>…</answer>`."""
    return f"{REASONING_OPEN}{reasoning}{REASONING_CLOSE}{ANSWER_OPEN}{answer}{ANSWER_CLOSE}"


def addition_reasoning(a: int, b: int) -> str:
    """Column addition, right to left, one digit pair per clause: 47 + 38 → "7+8=15, 4+3+1=8"."""
    da, db = str(a)[::-1], str(b)[::-1]
    clauses, carry = [], 0
    for i in range(max(len(da), len(db))):
        x = int(da[i]) if i < len(da) else 0
        y = int(db[i]) if i < len(db) else 0
        s = x + y + carry
        clauses.append(f"{x}+{y}{'+1' if carry else ''}={s}")
        carry = s // 10
    return ", ".join(clauses)


def make_problem(a: int, b: int, template: int, system_prompt: str | None = None) -> dict[str, Any]:
    """One arithmetic example with its prompt, answer and demonstration completion."""
    question = QUESTION_TEMPLATES[template].format(a=a, b=b)
    return {
        "prompt": make_messages(question, system_prompt),
        "answer": str(a + b),
        "completion": format_completion(addition_reasoning(a, b), str(a + b)),
    }


def make_messages(question: str, system_prompt: str | None = None) -> list[dict[str, str]]:
    """Chat messages for a question (the system prompt becomes a system turn; Gemma's template folds it
    into the first user turn)."""
    messages = [{"role": "user", "content": question}]
    if system_prompt:
        messages.insert(0, {"role": "system", "content": system_prompt})
    return messages


class ArithmeticTask:
    """Two-operand addition with worked reasoning, generated from a seed.

    The operand pairs are split once: a held-out test set, a small demonstration pool for SFT, and the
    rest for the endless GRPO prompt stream, so no test problem is ever trained on.
    """

    def __init__(
        self,
        seed: int = 1234,
        num_demonstrations: int = 200,
        num_test: int = 200,
        min_value: int = 10,
        max_value: int = 99,
        system_prompt: str | None = None,
    ) -> None:
        if min_value < 0 or max_value <= min_value:
            raise ValueError(f"ArithmeticTask: need 0 <= min_value < max_value, got {min_value}, {max_value}")
        pairs = [(a, b) for a in range(min_value, max_value + 1) for b in range(min_value, max_value + 1)]
        if num_demonstrations + num_test >= len(pairs):
            raise ValueError(
                f"ArithmeticTask: {num_demonstrations} demonstrations + {num_test} test problems leave no "
                f"prompts for GRPO out of {len(pairs)} operand pairs; widen min_value/max_value"
            )
        rng = random.Random(seed)
        rng.shuffle(pairs)
        self.seed = seed
        self.system_prompt = system_prompt
        self._test_pairs = pairs[:num_test]
        self._demo_pairs = pairs[num_test : num_test + num_demonstrations]
        self._train_pairs = pairs[num_test + num_demonstrations :]

    def _rows(self, pairs: list[tuple[int, int]], seed: int) -> list[dict[str, Any]]:
        rng = random.Random(seed)
        return [make_problem(a, b, rng.randrange(len(QUESTION_TEMPLATES)), self.system_prompt) for a, b in pairs]

    def demonstrations(self) -> Dataset:
        """The fixed SFT pool (prompt, answer, completion)."""
        return Dataset.from_list(self._rows(self._demo_pairs, self.seed + 1))

    def test_set(self) -> Dataset:
        """The fixed held-out set (prompt, answer, completion)."""
        return Dataset.from_list(self._rows(self._test_pairs, self.seed + 2))

    def prompt_stream(self, seed: int = 0) -> Iterator[dict[str, Any]]:
        """An endless shuffled stream of GRPO prompts (disjoint from demonstrations and test)."""
        rng = random.Random(self.seed * 1000 + seed)
        while True:
            order = list(self._train_pairs)
            rng.shuffle(order)
            for a, b in order:
                yield make_problem(a, b, rng.randrange(len(QUESTION_TEMPLATES)), self.system_prompt)


_GSM8K_FINAL = re.compile(r"####\s*(.+?)\s*$", re.S)
_GSM8K_CALC = re.compile(r"<<[^>]*>>")


def gsm8k_row_to_example(row: dict[str, Any], index: int = 0, system_prompt: str | None = None) -> dict[str, Any]:
    """Map one GSM8K row (`question`, `answer` ending in `#### 42`) to prompt / answer / completion.

    The worked solution becomes the reasoning (calculator annotations `<<…>>` removed) and the number after
    `####` the answer (thousands separators removed).
    """
    for key in ("question", "answer"):
        if key not in row:
            raise ValueError(f"GSM8K row {index}: missing column {key!r} (has {sorted(row)})")
    match = _GSM8K_FINAL.search(row["answer"])
    if not match:
        raise ValueError(f"GSM8K row {index}: answer does not end with '#### <number>': {row['answer'][-80:]!r}")
    final = match.group(1).replace(",", "").strip()
    reasoning = _GSM8K_CALC.sub("", row["answer"][: match.start()]).strip()
    return {
        "prompt": make_messages(row["question"].strip(), system_prompt),
        "answer": final,
        "completion": format_completion(reasoning, final),
    }


def load_gsm8k(
    source: str | Path | list[dict[str, Any]] = "openai/gsm8k",
    split: str = "train",
    system_prompt: str | None = None,
) -> Dataset:
    """GSM8K-style data as a Dataset with prompt / answer / completion.

    `source` is a list of rows, a local .jsonl/.json file, or a hub dataset id (`openai/gsm8k`, config
    `main`, needs network).
    """
    if isinstance(source, list):
        rows = source
    elif Path(source).exists():
        text = Path(source).read_text()
        rows = json.loads(text) if str(source).endswith(".json") else [json.loads(line) for line in text.splitlines() if line.strip()]
    else:
        from datasets import load_dataset

        rows = list(load_dataset(str(source), "main", split=split))
    return Dataset.from_list([gsm8k_row_to_example(r, i, system_prompt) for i, r in enumerate(rows)])


def completion_text(completion: Any) -> str:
    """A completion as plain text, whether given as a string or as TRL-style chat messages."""
    if isinstance(completion, str):
        return completion
    if isinstance(completion, list) and completion and isinstance(completion[-1], dict):
        return str(completion[-1].get("content", ""))
    raise TypeError(f"completion must be a string or a list of chat messages, got {type(completion).__name__}")
