"""The course's quizzes: multiple-choice questions where the course's confusing points live, each answer explained.

`show("04.1")` displays one as widgets (a question, its choices as radio buttons, a check button, the explanation of
the choice made — the same in ipywidgets 7 and 8); `answer("04.1", 0)` gives the verdict and explanation without
widgets. Ids are the notebook's number and the question's.

Each quiz's choices are shuffled once, by a generator seeded with its id: the same order in every run and every
runtime, and the right answer's position spread over the bank (so "pick the first" is no strategy).
"""

from __future__ import annotations

import random
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml


@dataclass(frozen=True)
class Choice:
    text: str
    right: bool
    why: str


@dataclass(frozen=True)
class Quiz:
    id: str
    question: str
    choices: tuple[Choice, ...]


def _quiz(quiz_id: str, question: str, *choices: tuple[str, bool, str]) -> Quiz:
    """A quiz from its choices as written (the right one anywhere), shown in an order seeded by `quiz_id`."""
    if sum(right for _, right, _ in choices) != 1:
        raise ValueError(f"quiz {quiz_id} needs exactly one right choice")
    shown = [Choice(*c) for c in choices]
    random.Random(f"quiz {quiz_id}").shuffle(shown)  # str seeds hash with SHA-512: stable across runs and Pythons
    return Quiz(quiz_id, question, tuple(shown))


QUIZZES_FILE = Path(__file__).resolve().parents[1] / "assets" / "quizzes.yaml"
"""The quizzes as data: each id's question, and its choices as written (text, right, why)."""

QUIZZES: dict[str, Quiz] = {
    quiz_id: _quiz(quiz_id, quiz["question"], *((c["text"], c["right"], c["why"]) for c in quiz["choices"]))
    for quiz_id, quiz in yaml.safe_load(QUIZZES_FILE.read_text(encoding="utf-8")).items()
}
"""Every quiz question of the course by id ("04.2": notebook 04's second)."""


def _quiz_by_id(quiz_id: str) -> Quiz:
    if quiz_id not in QUIZZES:
        raise KeyError(f"no quiz {quiz_id!r}: the course has {', '.join(QUIZZES)}")
    return QUIZZES[quiz_id]


def answer(quiz_id: str, choice: int) -> tuple[bool, str]:
    """Whether choice number `choice` (0-based) of quiz `quiz_id` is right, and why."""
    quiz = _quiz_by_id(quiz_id)
    if not 0 <= choice < len(quiz.choices):
        raise ValueError(f"quiz {quiz_id} has choices 0–{len(quiz.choices) - 1}, got {choice}")
    picked = quiz.choices[choice]
    return picked.right, picked.why


def show(quiz_id: str) -> Any:
    """Display quiz `quiz_id` as widgets: pick a choice, press check, read why. Returns the widget box."""
    import ipywidgets as w
    from IPython.display import display

    quiz = _quiz_by_id(quiz_id)
    question = w.HTML(f"<b>Quiz {quiz.id}.</b> {quiz.question}")
    choices = w.RadioButtons(options=[(c.text, i) for i, c in enumerate(quiz.choices)], value=None,
                             layout=w.Layout(width="max-content"))
    button = w.Button(description="check", button_style="info")
    feedback = w.HTML("")

    def on_check(_: Any) -> None:
        if choices.value is None:
            feedback.value = "Pick a choice first."
            return
        right, why = answer(quiz.id, choices.value)
        feedback.value = f"{'✅ Right.' if right else '❌ Not quite.'} {why}"

    button.on_click(on_check)
    box = w.VBox([question, choices, button, feedback])
    box.add_class("grpo-kit-quiz")
    display(box)
    return box
