"""Tasks: the built-in arithmetic problems, generated GSM8K-style word problems, a GSM8K loader, tasks from your own
data (`load_task`: a JSONL/JSON/CSV/Parquet file or a Hugging Face dataset), and chat-format prompts.

Every example has the columns the trainers and rewards use:
    prompt       list of chat messages, e.g. [{"role": "user", "content": "What is 23 + 45?"}]
    answer       the verifiable final answer as a string, e.g. "68"
    completion   (demonstrations only) the target text "<reasoning>…</reasoning><answer>68</answer>"
    answer_type  (tasks from your data) how the answer is compared: number, choice, string, regex (`answer_format.py`)

A task gives `demonstrations()` (SFT), `prompt_stream()` (GRPO, endless) and `test_set()` (held out, never trained on).
"""

from __future__ import annotations

import ast
import hashlib
import json
import operator
import random
import re
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass, fields
from fractions import Fraction
from pathlib import Path
from typing import Any

import yaml
from datasets import Dataset

from ..validation import DataError, prompt_problem
from .answer_format import ANSWER_OPEN, ANSWER_TYPES, canonical_number, format_completion, infer_answer_type
from .datafiles import read_rows

QUESTION_TEMPLATES = (
    "What is {a} + {b}?",
    "Add {a} and {b}.",
    "Compute {a} plus {b}.",
    "{a} + {b} = ?",
)


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


NAMES = ("Ana", "Ben", "Chen", "Dara", "Eli", "Fatima", "Goro", "Hana", "Ivan", "Julia", "Kofi", "Lena", "Mateo",
         "Nia", "Omar", "Priya", "Quinn", "Rosa", "Sami", "Tariq")


@dataclass(frozen=True)
class WordProblemTemplate:
    """A multi-step word problem: its question (slots {a}, {b}, … in the order they appear, and {name}), the answer as
    a formula in the slots, the worked solution as steps (the words before each equation, its expression in the
    slots and earlier results t1, t2, …, the unit after it) and each slot's values (a range or a tuple of choices)."""

    question: str
    formula: str
    steps: tuple[tuple[str, str, str], ...]
    slots: dict[str, tuple[int, int] | tuple[int, ...]]


WORD_PROBLEMS_FILE = Path(__file__).resolve().parents[1] / "assets" / "word_problems.yaml"
"""The word-problem templates as data, in the order every seed draws from."""

WORD_PROBLEMS = tuple(
    WordProblemTemplate(t["question"], t["formula"],
                        tuple((step["words"], step["expression"], step["unit"]) for step in t["steps"]),
                        {slot: tuple(values) for slot, values in t["slots"].items()})
    for t in yaml.safe_load(WORD_PROBLEMS_FILE.read_text(encoding="utf-8"))
)
"""The word-problem templates of `WordProblemTask`: three with 2 operations, four with 3 and three with 4."""


def evaluate_expression(expression: str, values: dict[str, Fraction]) -> Fraction:
    """+, −, ×, ÷ and parentheses over named values, exactly (fractions): the word problems' arithmetic."""
    operators = {ast.Add: operator.add, ast.Sub: operator.sub, ast.Mult: operator.mul, ast.Div: operator.truediv}

    def value(node: ast.AST) -> Fraction:
        if isinstance(node, ast.BinOp) and type(node.op) in operators:
            return operators[type(node.op)](value(node.left), value(node.right))
        if isinstance(node, ast.Name):
            return values[node.id]
        if isinstance(node, ast.Constant) and isinstance(node.value, int):
            return Fraction(node.value)
        raise ValueError(
            f"evaluate_expression: {ast.dump(node)} in {expression!r} is not +, -, *, / of names or integers")

    return value(ast.parse(expression, mode="eval").body)


def template_level(template: WordProblemTemplate) -> str:
    """A word problem's difficulty level for `GRPOConfig.difficulty_targeting`: its template, "t3 (3 steps)" (a
    template not among WORD_PROBLEMS: its step count only)."""
    steps = f"{len(template.steps)} steps"
    known = [i for i, t in enumerate(WORD_PROBLEMS) if t == template]
    return f"t{known[0]} ({steps})" if known else steps


def make_word_problem(
    template: WordProblemTemplate, rng: random.Random, system_prompt: str | None = None
) -> dict[str, Any]:
    """One example from `template` with values drawn from `rng` such that every step is a positive whole number
    (prompt / answer / completion, and `operations` and `level`): the reasoning is its steps, "… 3 * 12 = 36
    pencils."."""
    for _ in range(1000):
        values = {k: Fraction(rng.choice(v) if len(v) != 2 else rng.randint(*v)) for k, v in template.slots.items()}
        results, sentences = dict(values), []
        for i, (words, expression, unit) in enumerate(template.steps, start=1):
            result = evaluate_expression(expression, results)
            if result.denominator != 1 or result <= 0:
                break
            results[f"t{i}"] = result
            shown = re.sub(r"[a-z]\d*", lambda m, known=results: str(known[m.group(0)]), expression)
            sentences.append((words, shown, result, unit))
        else:
            name, answer = rng.choice(NAMES), str(results[f"t{len(template.steps)}"])
            fill = {k: str(v) for k, v in values.items()} | {"name": name}
            reasoning = " ".join(
                f"{words.format(**fill)} {shown} = {result} {unit}." for words, shown, result, unit in sentences
            )
            return {"prompt": make_messages(template.question.format(**fill), system_prompt), "answer": answer,
                    "completion": format_completion(reasoning, answer), "operations": len(template.steps),
                    "level": template_level(template)}
    raise ValueError(f"no values of {template.slots} make every step of {template.formula!r} a positive whole number")


class WordProblemTask:
    """GSM8K-style multi-step word problems with worked solutions, generated from a seed (offline; the task the
    CPU runs train on, and the fixture for the GSM8K code path). `operations` picks the difficulty: templates with
    that many steps (2–4) for the held-out set and the GRPO prompts; `demonstration_operations` (default: the same)
    for the worked solutions, so the model can be shown 2-step solutions and tested on 3-step problems. Held-out,
    demonstration and GRPO-prompt questions never repeat across the three."""

    def __init__(self, seed: int = 1234, num_demonstrations: int = 200, num_test: int = 200,
                 operations: tuple[int, ...] = (2, 3, 4), system_prompt: str | None = None,
                 demonstration_operations: tuple[int, ...] | None = None) -> None:
        self.templates = self._templates(operations, "operations")
        demo_templates = self._templates(demonstration_operations or operations, "demonstration_operations")
        self.seed, self.system_prompt = seed, system_prompt
        self._test = self._unique(num_test, seed + 2, exclude=set(), templates=self.templates)
        self._demos = self._unique(
            num_demonstrations, seed + 1, exclude=self._questions(self._test), templates=demo_templates
        )

    @staticmethod
    def _templates(operations: tuple[int, ...], setting: str) -> list[WordProblemTemplate]:
        templates = [t for t in WORD_PROBLEMS if len(t.steps) in operations]
        if not templates:
            known = sorted({len(t.steps) for t in WORD_PROBLEMS})
            raise ValueError(f"WordProblemTask: {setting}={operations}: no template has that many steps (have {known})")
        return templates

    @staticmethod
    def _questions(rows: list[dict[str, Any]]) -> set[str]:
        return {row["prompt"][-1]["content"] for row in rows}

    def _unique(
        self, count: int, seed: int, *, exclude: set[str], templates: list[WordProblemTemplate]
    ) -> list[dict[str, Any]]:
        rng, rows, seen = random.Random(seed), [], set(exclude)
        for _ in range(count * 100):
            if len(rows) == count:
                return rows
            row = make_word_problem(rng.choice(templates), rng, self.system_prompt)
            question = row["prompt"][-1]["content"]
            if question not in seen:
                seen.add(question)
                rows.append(row)
        raise ValueError(f"WordProblemTask: could not make {count} distinct problems from {len(templates)} templates")

    def demonstrations(self) -> Dataset:
        """The fixed SFT pool (prompt, answer, completion, operations)."""
        return Dataset.from_list(self._demos)

    def test_set(self) -> Dataset:
        """The fixed held-out set."""
        return Dataset.from_list(self._test)

    def prompt_stream(self, seed: int = 0) -> Iterator[dict[str, Any]]:
        """An endless stream of GRPO prompts, none of them a held-out or demonstration question."""
        rng, taken = random.Random(self.seed * 1000 + seed), self._questions(self._test) | self._questions(self._demos)
        while True:
            row = make_word_problem(rng.choice(self.templates), rng, self.system_prompt)
            if row["prompt"][-1]["content"] not in taken:
                yield row


_GSM8K_FINAL = re.compile(r"####\s*(.+?)\s*$", re.S)
_GSM8K_CALC = re.compile(r"<<[^>]*>>")


def gsm8k_row_to_example(row: dict[str, Any], index: int = 0, system_prompt: str | None = None) -> dict[str, Any]:
    """Map one GSM8K row (`question`, `answer` ending in `#### 42`) to prompt / answer / completion / level.

    The worked solution becomes the reasoning (calculator annotations `<<…>>` removed), the number after `####` the
    answer (`canonical_number`: no thousands separators, currency sign or trailing zeros) and its step count the
    `level` (`gsm8k_level`).
    """
    for key in ("question", "answer"):
        if key not in row:
            raise ValueError(f"GSM8K row {index}: missing column {key!r} (has {sorted(row)})")
    match = _GSM8K_FINAL.search(row["answer"])
    if not match:
        raise ValueError(f"GSM8K row {index}: answer does not end with '#### <number>': {row['answer'][-80:]!r}")
    final = canonical_number(match.group(1))
    if final is None:
        raise ValueError(f"GSM8K row {index}: the final answer {match.group(1)!r} is not one number")
    worked = row["answer"][: match.start()]
    reasoning = _GSM8K_CALC.sub("", worked).strip()
    return {
        "prompt": make_messages(row["question"].strip(), system_prompt),
        "answer": final,
        "completion": format_completion(reasoning, final),
        "level": gsm8k_level(worked),
    }


def gsm8k_level(worked_solution: str) -> str:
    """A GSM8K problem's difficulty level for `GRPOConfig.difficulty_targeting`: its reference solution's calculation
    count, "3 steps" (the `<<…>>` calculator annotations; a solution without them: its non-empty lines). GSM8K's
    solutions take 2 to 8 steps, and the step count is the usual proxy for how hard a problem is."""
    steps = len(_GSM8K_CALC.findall(worked_solution)) or sum(1 for line in worked_solution.splitlines() if line.strip())
    return f"{max(steps, 1)} steps"


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
        rows = (
            json.loads(text)
            if str(source).endswith(".json")
            else [json.loads(line) for line in text.splitlines() if line.strip()]
        )
    else:
        from datasets import load_dataset

        rows = list(load_dataset(str(source), "main", split=split))
    return Dataset.from_list([gsm8k_row_to_example(r, i, system_prompt) for i, r in enumerate(rows)])


class GSM8KTask:
    """GSM8K with the same held-out problems every time: from the hub (`openai/gsm8k`) the first `num_test` rows of
    the test split, the first `num_demonstrations` rows of train as SFT demonstrations and the rest of train as the
    GRPO prompt stream; from one local file (GSM8K format), its first `num_test` rows, the next `num_demonstrations`,
    and the rest."""

    def __init__(self, source: str | Path = "openai/gsm8k", seed: int = 1234, num_demonstrations: int = 200,
                 num_test: int = 200, system_prompt: str | None = None) -> None:
        self.seed = seed
        if Path(source).exists():
            rows = load_gsm8k(source, system_prompt=system_prompt).to_list()
            test, train = rows[:num_test], rows[num_test:]
        else:
            test = load_gsm8k(source, split="test", system_prompt=system_prompt).to_list()[:num_test]
            train = load_gsm8k(source, split="train", system_prompt=system_prompt).to_list()
        if len(test) < num_test or len(train) <= num_demonstrations:
            raise ValueError(
                f"GSM8KTask: {source} has {len(test) + len(train)} rows, too few for num_test={num_test} held out, "
                f"num_demonstrations={num_demonstrations} and GRPO prompts besides"
            )
        self._test, self._demos, self._train = test, train[:num_demonstrations], train[num_demonstrations:]

    def demonstrations(self) -> Dataset:
        """The SFT demonstrations (prompt, answer, completion)."""
        return Dataset.from_list(self._demos)

    def test_set(self) -> Dataset:
        """The held-out problems."""
        return Dataset.from_list(self._test)

    def prompt_stream(self, seed: int = 0) -> Iterator[dict[str, Any]]:
        """The remaining training problems, reshuffled each pass."""
        rng = random.Random(self.seed * 1000 + seed)
        while True:
            yield from rng.sample(self._train, len(self._train))


# ---- tasks from your own data ------------------------------------------------------------------------------------
#     task = gk.load_task("data/example_task.jsonl", columns={"prompt": "question", "solution": "solution"})
# Columns are mapped by name (`Columns`): the question (text or chat messages), the right final answer, optionally a
# worked solution (for SFT) and a per-row instruction; a row's own `answer_type` and `level` columns (the latter for
# `GRPOConfig.difficulty_targeting`) are kept. The same file, seed and num_test always give the same held-out rows,
# whose hash (`DataTask.split_hash`) a score file carries; `check_no_overlap` refuses a training set holding one of
# them.

@dataclass(frozen=True)
class Columns:
    """Which column of a data file holds each part of a problem (`load_task(path, columns={"prompt": "question"})`)."""

    prompt: str = "prompt"
    """The question: text, or chat messages."""
    answer: str = "answer"
    """The right final answer, as text or a number."""
    solution: str | None = None
    """A worked solution, for SFT; None = the file has none."""
    system: str | None = None
    """A per-row instruction (it wins over `system_prompt`); None = every row gets `system_prompt`."""

    @classmethod
    def of(cls, columns: Columns | Mapping[str, str | None] | None, *, where: str = "columns") -> Columns:
        """`columns` as a `Columns`: None gives the defaults; a mapping names some roles and keeps the rest. An
        error starts with `where` (the data's name)."""
        if columns is None or isinstance(columns, cls):
            return columns or cls()
        roles = [f.name for f in fields(cls)]
        if not isinstance(columns, Mapping):
            raise DataError(f"{where}: columns={columns!r}: a dict from role to column name; the roles are "
                            f"{', '.join(roles)}")
        if unknown := [k for k in columns if k not in roles]:
            raise DataError(f"{where}: columns: {unknown[0]!r} is not a role; the roles are {', '.join(roles)}")
        return cls(**columns)

    def roles(self) -> tuple[tuple[str, str | None], ...]:
        """(role, column) for each role, in order."""
        return tuple((f.name, getattr(self, f.name)) for f in fields(self))


def prompt_key(prompt: Any) -> str:
    """A prompt's identity for the overlap check: its last message's text (or the text), normalised (case, spaces)."""
    text = prompt[-1]["content"] if isinstance(prompt, list) else str(prompt)
    return hashlib.sha256(" ".join(text.casefold().split()).encode()).hexdigest()


HELD_OUT: dict[str, dict[str, str]] = {}
"""Data source → {`prompt_key`: the split holding it out} for the latest `DataTask` made from each source in this
process (loading a file again with another seed or num_test replaces its split): the trainers refuse a dataset
handed to them directly that holds one of these questions (`check_no_overlap`)."""


def check_no_overlap(training_prompts: Iterable[Any], held_out: Dataset | list[dict[str, Any]] | None = None, *,
                     where: str = "training set", start: int = 0) -> None:
    """Refuse a training set that holds a held-out question (compared by `prompt_key`), naming the first one; the
    held-out rows are `held_out`'s, or (None) those of every `DataTask` made in this process (`HELD_OUT`)."""
    splits = list(HELD_OUT.values()) if held_out is None else [
        {prompt_key(r["prompt"]): "the held-out rows given" for r in held_out}]
    if not any(splits):
        return
    for i, prompt in enumerate(training_prompts, start=start):
        key = prompt_key(prompt)
        split = next((keys[key] for keys in splits if key in keys), None)
        if split is not None:
            text = prompt[-1]["content"] if isinstance(prompt, list) else prompt
            raise DataError(f"{where} row {i} is a held-out question of {split} ({str(text)[:60]!r}): "
                            "training on the held-out split would inflate its score; remove it from the training data")


class DataTask:
    """The rows of a data file or hub dataset, split once by `seed` into `num_test` held-out rows and the rest."""

    def __init__(self, rows: list[dict[str, Any]], *, name: str,
                 columns: Columns | Mapping[str, str | None] | None = None, answer_type: str = "auto",
                 num_test: int = 200, seed: int = 1234, system_prompt: str | None = None) -> None:
        self.name, self.seed = name, seed
        columns = Columns.of(columns, where=name)
        if isinstance(num_test, bool) or not isinstance(num_test, int) or num_test < 1:
            raise DataError(f"{name}: num_test={num_test!r}: the held-out rows, a whole number of at least 1 (and "
                            "fewer than the rows)")
        if isinstance(seed, bool) or not isinstance(seed, int) or not 0 <= seed < 2**32:
            raise DataError(f"{name}: seed={seed!r}: the split's seed, a whole number from 0 to 2**32 - 1")
        if answer_type not in ANSWER_TYPES:
            raise DataError(f"{name}: answer_type={answer_type!r}: one of {', '.join(ANSWER_TYPES)}")
        present = sorted(set().union(*(r.keys() for r in rows))) if rows else []
        for role, column in columns.roles():
            if column is not None and column not in present:
                header = " read from the CSV's first row" if name.lower().endswith(".csv") else ""
                raise DataError(
                    f"{name}: no column {column!r} for the {role} (columns{header}: {', '.join(present) or 'none'}); "
                    f"pass columns={{{role!r}: <the column's name>}}"
                )
        examples = [self._example(i, r, columns, answer_type=answer_type, system_prompt=system_prompt)
                    for i, r in enumerate(rows)]
        if len(examples) <= num_test:
            raise DataError(f"{name}: {len(examples)} rows, but num_test={num_test} are held out: nothing is left to "
                            "train on; lower num_test or add rows")
        order = list(range(len(examples)))
        random.Random(seed).shuffle(order)
        held = {prompt_key(examples[i]["prompt"]): i for i in order[:num_test]}
        for i in sorted(order[num_test:]):  # a question asked twice would leak the held-out copy into training
            if prompt_key(examples[i]["prompt"]) in held:
                raise DataError(
                    f"{name} rows {held[prompt_key(examples[i]['prompt'])]} and {i} ask the same question, and "
                    "one of them is held out: remove the duplicate so the held-out split stays unseen"
                )
        self._test = [examples[i] for i in sorted(order[:num_test])]
        HELD_OUT[name] = {prompt_key(r["prompt"]): f"{name} (seed {seed}, num_test {num_test})" for r in self._test}
        self._train = [examples[i] for i in sorted(order[num_test:])]
        self.split_hash = hashlib.sha256(
            json.dumps([[r["prompt"][-1]["content"], r["answer"]] for r in self._test]).encode()).hexdigest()
        """SHA-256 of the held-out rows (question and answer, in order; the instruction apart): two scores compare only
        on the same split."""
        self.system_prompt = system_prompt
        """The instruction every question gets (recorded with each score: scores with other instructions differ)."""

    def _example(self, i: int, row: dict[str, Any], columns: Columns, *, answer_type: str,
                 system_prompt: str | None) -> dict[str, Any]:
        where = f"{self.name} row {i}"
        prompt, answer, solution, system = columns.prompt, columns.answer, columns.solution, columns.system
        question, truth = row.get(prompt), row.get(answer)
        if isinstance(question, str) and question.strip():
            instruction = (row.get(system) if system else None) or system_prompt
            question = make_messages(question, instruction)
        if problem := prompt_problem(question):
            raise DataError(f"{where}, column {prompt!r}: {problem}")
        if truth is None or isinstance(truth, (list, dict)) or not str(truth).strip():
            raise DataError(
                f"{where}, column {answer!r}: needs the right final answer as text or a number, got {truth!r}")
        truth = str(truth).strip()
        kind = row.get("answer_type") or answer_type  # a row's own answer_type column wins
        if kind not in ANSWER_TYPES or kind == "function":
            raise DataError(f"{where}, column 'answer_type': {kind!r} is not one of {', '.join(ANSWER_TYPES[:-1])}")
        example = {"prompt": question, "answer": truth,
                   "answer_type": infer_answer_type(truth) if kind == "auto" else kind}
        if row.get("level") is not None:  # a difficulty grade, for difficulty targeting
            example["level"] = str(row["level"])
        worked = row.get(solution) if solution else None
        if worked is not None and not isinstance(worked, str):
            raise DataError(
                f"{where}, column {solution!r}: the worked solution must be text, got {type(worked).__name__}")
        if worked and worked.strip():
            example["completion"] = (
                worked.strip() if ANSWER_OPEN in worked else format_completion(worked.strip(), truth))
        return example

    def demonstrations(self) -> Dataset:
        """The training rows that have a worked solution (prompt, answer, answer_type, completion), for SFT."""
        rows = [r for r in self._train if "completion" in r]
        if not rows:
            raise DataError(f"{self.name}: no training row has a worked solution: give the solution column for SFT, "
                            "or go straight to GRPO")
        return Dataset.from_list(rows)

    def test_set(self) -> Dataset:
        """The held-out rows (prompt, answer, answer_type), the same for every run with this file, seed and num_test."""
        return Dataset.from_list([{k: v for k, v in r.items() if k != "completion"} for r in self._test])

    def prompt_stream(self, seed: int = 0) -> Iterator[dict[str, Any]]:
        """Every training row (prompt, answer, answer_type), shuffled anew each pass, endlessly."""
        rows = [{k: v for k, v in r.items() if k != "completion"} for r in self._train]
        rng = random.Random(self.seed * 1000 + seed)
        while True:
            order = list(range(len(rows)))
            rng.shuffle(order)
            for i in order:
                yield rows[i]


def load_task(source: str | Path, *, columns: Columns | Mapping[str, str | None] | None = None,
              answer_type: str = "auto", num_test: int = 200, seed: int = 1234, system_prompt: str | None = None,
              split: str = "train") -> DataTask:
    """A `DataTask` from a data file (.jsonl, .json, .csv, .parquet) or a Hugging Face dataset id (its `split`), with
    the prompt, answer, solution and instruction read from the columns `columns` names (`Columns`; a dict such as
    {"prompt": "question", "solution": "worked"} names some, the rest keep their defaults)."""
    return DataTask(read_rows(source, split=split), name=str(source), columns=columns, answer_type=answer_type,
                    num_test=num_test, seed=seed, system_prompt=system_prompt)


def make_task(cfg: Any) -> ArithmeticTask | WordProblemTask | GSM8KTask:
    """The task a `TaskConfig` names (`kind`), built with its settings."""
    common = {"seed": cfg.seed, "num_demonstrations": cfg.num_demonstrations, "num_test": cfg.num_test,
              "system_prompt": cfg.system_prompt}
    if cfg.kind == "arithmetic":
        return ArithmeticTask(min_value=cfg.min_value, max_value=cfg.max_value, **common)
    if cfg.kind == "word_problems":
        demo_ops = tuple(cfg.demonstration_operations) if cfg.demonstration_operations else None
        return WordProblemTask(operations=tuple(cfg.operations), demonstration_operations=demo_ops, **common)
    if cfg.kind == "gsm8k":
        return GSM8KTask(cfg.source, **common)
    if cfg.kind in ("file", "hub"):
        if cfg.kind == "file" and not Path(cfg.source).exists():
            raise FileNotFoundError(
                f"TaskConfig.source={cfg.source!r}: no such file (kind 'file' reads a local data file)")
        columns = Columns(prompt=cfg.prompt_column, answer=cfg.answer_column, solution=cfg.solution_column,
                          system=cfg.system_column)
        return load_task(cfg.source, columns=columns, answer_type=cfg.answer_type, num_test=cfg.num_test,
                         seed=cfg.seed, system_prompt=cfg.system_prompt, split=cfg.split)
    raise ValueError(f"TaskConfig.kind={cfg.kind!r}: must be one of arithmetic, word_problems, gsm8k, file, hub")


def completion_text(completion: Any) -> str:
    """A completion as plain text, whether given as a string or as TRL-style chat messages."""
    if isinstance(completion, str):
        return completion
    if isinstance(completion, list) and completion and isinstance(completion[-1], dict):
        return str(completion[-1].get("content", ""))
    raise TypeError(f"completion must be a string or a list of chat messages, got {type(completion).__name__}")
