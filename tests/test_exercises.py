"""The course's exercises and quizzes: every exercise's check fails on its blank and on a plausible wrong answer and
passes on its solution; the notebooks carry the blanks and no solution; GRPO_KIT_SOLUTIONS=1 runs the solutions; every
quiz has one right choice, explained, and works as widgets."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from collections import Counter
from pathlib import Path
from types import SimpleNamespace

import nbformat
import pytest
import torch

from grpo_kit.course import exercises, quizzes
from grpo_kit.course.exercises import EXERCISES, MARKER, check_exercise

ROOT = Path(__file__).resolve().parents[1]
NOTEBOOKS = {p.name[:2]: p for p in sorted((ROOT / "notebooks").glob("*.ipynb"))}


def notebook_cells(number: str) -> list:
    return nbformat.read(NOTEBOOKS[number], as_version=4).cells


def _tokenizer_context(ns, tiny, task):
    model, tokenizer = tiny
    ns.update(model=model, tokenizer=tokenizer, task=task, messages=[{"role": "user", "content": "What is 47 + 38?"}])


def _dashboard_context(ns, tiny, task):
    from grpo_kit import Dashboard, GRPOConfig, GRPOTrainer, control_changes
    from grpo_kit.data.rewards import DEFAULT_REWARDS, DEFAULT_WEIGHTS

    model, tokenizer = tiny
    grpo_cfg = GRPOConfig(prompts_per_step=2, group_size=2, max_new_tokens=8, micro_batch_size=4, output_dir=None,
                          reward_weights=DEFAULT_WEIGHTS, log_completions=0)
    trainer = GRPOTrainer(model, tokenizer, DEFAULT_REWARDS, task.prompt_stream(), grpo_cfg)
    dash = Dashboard(trainer, redraw_seconds=0.0)
    dash.run(steps=1)
    ns.update(trainer=trainer, dash=dash, grpo_cfg=grpo_cfg, control_changes=control_changes)


def _export_context(ns, tiny, task, tmp_path):
    from grpo_kit import evaluate, export_model

    model, tokenizer = tiny
    test = task.test_set().select(range(4))
    result = evaluate(model, tokenizer, test, max_new_tokens=8)
    export_dir = export_model(model, tokenizer, tmp_path / "export-sft", base_name="tiny", metrics={})
    ns.update(final=model, tokenizer=tokenizer, test=test, results={"sft": (model, result)}, stage="sft",
              export_dir=export_dir, device=torch.device("cpu"), evaluate=evaluate,
              cfg=SimpleNamespace(grpo=SimpleNamespace(max_new_tokens=8)))


def _arc_context(ns, *_):
    import numpy as np

    rng = np.random.default_rng(8)  # 60 problems, the two models agreeing on most of them, as after the same SFT
    sft = rng.random(60) < 0.5
    grpo = np.where(rng.random(60) < 0.1, ~sft, sft)
    control = np.where(rng.random(60) < 0.1, ~sft, sft)
    outcomes = {"sft": sft.tolist(), "grpo": grpo.tolist(), "control": control.tolist()}
    ns["arc"] = SimpleNamespace(evaluate=lambda stage: {"correct": outcomes[stage]})


def _your_task_context(ns, tiny, *_):
    import grpo_kit as gk

    ns["gk"] = gk
    model, tokenizer = tiny
    task = gk.load_task(nbk_example_task_file(), columns={"prompt": "question", "solution": "solution"}, num_test=40)
    ns["arc"] = SimpleNamespace(model=model, tokenizer=tokenizer, test=task.test_set())
    cell = next(c.source for c in notebook_cells("09") if "def answer_kind_reward" in c.source)
    exec(cell.split("gk.test_reward(")[0], ns)  # the notebook's own reward, without its demo call


def nbk_example_task_file():
    from grpo_kit.course.notebook import example_task_file

    return example_task_file()


def _setup(exercise_id, ns, tiny, task, tmp_path):
    from grpo_kit import PlanInput, load_run_config, plan
    from grpo_kit import rewards as R

    ns.update(plan=plan, PlanInput=PlanInput, R=R, torch=torch)
    number = exercise_id[:2]
    if number in ("01", "02"):
        _tokenizer_context(ns, tiny, task)
        ns.update(cfg=load_run_config("cpu-tiny"), after={"accuracy": 0.3})
    contexts = {"05": _dashboard_context, "08": _arc_context, "09": _your_task_context}
    if number == "06":
        _export_context(ns, tiny, task, tmp_path)
    elif number in contexts:
        contexts[number](ns, tiny, task)


@pytest.mark.parametrize("exercise_id", list(EXERCISES))
def test_the_check_fails_on_the_blank_and_a_wrong_answer_and_passes_on_the_solution(exercise_id, tiny, task, tmp_path,
                                                                                       capsys):
    exercise = EXERCISES[exercise_id]
    said = {}
    for version in ("blank", "wrong", "solution"):
        ns: dict = {}
        _setup(exercise_id, ns, tiny, task, tmp_path)
        exec(getattr(exercise, version), ns)
        if version == "solution":
            check_exercise(exercise_id, ns)
            assert f"✅ {exercise_id} correct" in capsys.readouterr().out
            continue
        with pytest.raises(AssertionError) as failed:
            check_exercise(exercise_id, ns)
        said[version] = message = str(failed.value)
        assert message.startswith(f"Not yet ({exercise_id}): ") and f"nbk.hint({exercise_id!r})" in message, message
    assert "still" in said["blank"] or "your two cases" in said["blank"], said["blank"]  # the blank is named as such
    assert said["wrong"] != said["blank"], f"the wrong answer gets the blank's message: {said['wrong']}"


def test_every_exercise_is_marked_and_its_check_is_named_in_its_notebook():
    for exercise_id, exercise in EXERCISES.items():
        assert MARKER.match(exercise.blank).group(1) == exercise_id
        for version in (exercise.solution, exercise.wrong):
            assert version.splitlines()[0] == exercise.blank.splitlines()[0], exercise_id  # the same marker line
        assert len(exercise.hints) >= 2 and exercise.after, exercise_id


@pytest.mark.parametrize("exercise_id", list(EXERCISES))
def test_the_first_hint_is_a_nudge_not_the_answer(exercise_id):
    """Hints are graduated: the first one names no call or value the solution adds to the blank."""
    exercise = EXERCISES[exercise_id]
    added = [line.split("#")[0].strip() for line in exercise.solution.splitlines() if line not in exercise.blank]
    calls = {m for line in added for m in re.findall(r"\b[\w.]+\(", line)} - {"print(", "int(", "len(", "sum("}
    first = exercise.hints[0]
    assert not [c for c in calls if c in first], (exercise_id, first)
    assert not [line for line in added if len(line) > 12 and line in first], (exercise_id, first)


@pytest.mark.parametrize("number", list(NOTEBOOKS))
def test_a_learners_notebook_has_one_to_three_blank_exercises_each_checked_and_no_solution(number):
    cells = notebook_cells(number)
    marked = [(i, MARKER.match(c.source).group(1)) for i, c in enumerate(cells) if MARKER.match(c.source)]
    assert 1 <= len(marked) <= 3, f"notebook {number} has {len(marked)} exercises"
    assert {e for _, e in marked} == {e for e in EXERCISES if e.startswith(number + ".")}
    text = "\n".join(c.source for c in cells)
    for i, exercise_id in marked:
        exercise = EXERCISES[exercise_id]
        assert cells[i].source == exercise.blank, f"{exercise_id}: the notebook's cell differs from its blank"
        assert cells[i + 1].source == f'nbk.check_exercise("{exercise_id}", globals())', exercise_id
        assert f"### Exercise {exercise_id}" in cells[i - 1].source and "nbk.reveal" in cells[i - 1].source
        solution_only = [line for line in exercise.solution.splitlines()
                         if line.strip() and line not in exercise.blank and not line.lstrip().startswith("#")]
        assert solution_only, exercise_id
        leaked = [line for line in solution_only if line.strip() in text]
        assert not leaked, f"notebook {number} contains the solution of {exercise_id}: {leaked}"


def test_a_wrong_answer_shows_as_one_styled_message_in_ipython_not_a_traceback_of_the_kit(capsys):
    """In a notebook an unsolved exercise is a normal event: IPython prints the message and the hint command, and no
    line of exercises.py; the cell still fails (Run All stops, nbmake sees the error)."""
    from IPython.core.interactiveshell import InteractiveShell

    shell = InteractiveShell.instance()
    try:
        result = shell.run_cell('from grpo_kit.course import exercises\nmy_advantage = ...\n'
                                'exercises.check_exercise("04.1", globals())')
    finally:
        InteractiveShell.clear_instance()
    out = capsys.readouterr().out
    assert isinstance(result.error_in_exec, exercises.NotYet) and not result.success
    assert "❌ Not yet (04.1): `my_advantage` is still `...`" in out and "nbk.hint('04.1')" in out, out
    assert "exercises.py" not in out and "Traceback" not in out and "raise NotYet" not in out, out


def test_solutions_run_in_place_of_blanks_only_when_asked(monkeypatch):
    shell = SimpleNamespace(input_transformers_cleanup=[])
    monkeypatch.delenv("GRPO_KIT_SOLUTIONS", raising=False)
    assert not exercises.use_solutions(shell) and shell.input_transformers_cleanup == []
    monkeypatch.setenv("GRPO_KIT_SOLUTIONS", "1")
    assert exercises.use_solutions(shell) and exercises.use_solutions(shell)
    (transform,) = shell.input_transformers_cleanup  # once, however often the notebook module is imported
    blank = EXERCISES["04.1"].blank.splitlines(keepends=True)
    assert "".join(transform(blank)).strip() == EXERCISES["04.1"].solution
    other = ["x = 1\n", "# Exercise is a word here\n"]
    assert transform(other) is other


def test_hints_come_one_at_a_time_then_reveal_and_an_unknown_id_names_the_known_ones(capsys, monkeypatch):
    monkeypatch.setattr(exercises, "_hints_given", {})
    nudge, method = EXERCISES["03.1"].hints
    exercises.hint("03.1")
    first = capsys.readouterr().out
    assert nudge in first and method not in first and "hint 1 of 2" in first and "again" in first
    exercises.hint("03.1")
    exercises.hint("03.1")  # past the last: the last again, and where the answer is
    second = capsys.readouterr().out
    assert second.count(method) == 2 and nudge not in second and "nbk.reveal('03.1')" in second
    exercises.hint("03.1", level=1)
    assert nudge in capsys.readouterr().out
    with pytest.raises(ValueError, match="hints 1–2, got 3"):
        exercises.hint("03.1", level=3)
    exercises.reveal("03.1")
    assert EXERCISES["03.1"].solution in capsys.readouterr().out
    with pytest.raises(KeyError, match="the course has 00.1"):
        exercises.hint("3.1")


@pytest.mark.parametrize("number", list(NOTEBOOKS))
def test_every_notebook_asks_two_to_four_quiz_questions_of_its_own(number):
    asked = [m for c in notebook_cells(number) for m in re.findall(r'nbk\.quiz\("([\d.]+)"\)', c.source)]
    assert 2 <= len(asked) <= 4 and all(q.startswith(number + ".") for q in asked), asked
    assert set(asked) == {q for q in quizzes.QUIZZES if q.startswith(number + ".")}


def test_each_quiz_has_one_right_choice_and_every_choice_explained():
    for quiz in quizzes.QUIZZES.values():
        verdicts = [quizzes.answer(quiz.id, i) for i in range(len(quiz.choices))]
        assert sum(right for right, _ in verdicts) == 1 and all(len(why) > 20 for _, why in verdicts), quiz.id
    with pytest.raises(ValueError, match="choices 0–2"):
        quizzes.answer("04.1", 3)


def test_the_right_answers_position_is_spread_over_the_bank_and_stable_per_quiz():
    """'Pick the first' (or any one position) answers at most half the bank; each quiz shows its choices in the same
    order in another process with another hash seed, so a quiz reads the same on every run and runtime."""
    positions = [[c.right for c in q.choices].index(True) for q in quizzes.QUIZZES.values()]
    counts = Counter(positions)
    assert max(counts.values()) <= len(positions) / 2, counts
    assert set(counts) == {0, 1, 2}, counts
    order = {q.id: [c.text for c in q.choices] for q in quizzes.QUIZZES.values()}
    elsewhere = subprocess.run(
        [sys.executable, "-c", "import json; from grpo_kit.course import quizzes; "
         "print(json.dumps({q.id: [c.text for c in q.choices] for q in quizzes.QUIZZES.values()}))"],
        capture_output=True, text=True, check=True, env={**os.environ, "PYTHONHASHSEED": "12345"})
    assert json.loads(elsewhere.stdout) == order


def test_the_quiz_widget_explains_the_choice_made():
    box = quizzes.show("05.3")
    _, choices, button, feedback = box.children
    button.click()
    assert feedback.value == "Pick a choice first."
    right = next(i for i, c in enumerate(quizzes.QUIZZES["05.3"].choices) if c.right)
    choices.value = (right + 1) % 3
    button.click()
    assert feedback.value.startswith("❌")
    choices.value = right
    button.click()
    assert feedback.value.startswith("✅") and "μ ≥ 2" in feedback.value
