"""The course's exercises: cells the learner fills in, checks that say what is wrong, and the solutions kept
with the kit (their texts in `assets/exercises.yaml`, their checks here).

An exercise cell in a notebook starts with its marker line, `# Exercise 03.1: …`, and carries a blank: a `...` where a
value goes, or a function whose body raises NotImplementedError. The cell after it calls `nbk.check_exercise("03.1",
globals())`, which reads the names the exercise asks for and either prints ✅ with what the exercise shows, or raises
`NotYet` (an AssertionError) that says what is wrong with the answer given (not only that it is wrong). In IPython a
`NotYet` shows as one styled block (what is wrong, and how to get a hint), not a traceback through the kit; Run All
still stops there, and nbmake still sees the error. `nbk.hint("03.1")` prints the next hint, graduated (a nudge
first, then the method, never the answer); `nbk.reveal("03.1")` prints a solution.

The notebooks ship the blanks only. With GRPO_KIT_SOLUTIONS=1 (`make test`, the platform replicas, the browser tests)
`use_solutions()` has IPython run each exercise cell's solution in place of its blank, so Run All goes top to bottom
on the solved course while the files stay unsolved. tests/test_exercises.py runs every check against the blank, a
plausible wrong answer and the solution (fails, fails, passes).
"""

from __future__ import annotations

import math
import os
import re
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

MARKER = re.compile(r"^# Exercise (\d\d\.\d+):")
"""The first line of every exercise cell; the id (notebook number . exercise number) names the exercise."""


class NotYet(AssertionError):
    """An exercise's answer is missing or wrong: the message says what, and where the hints are. IPython renders it
    through `_render_traceback_` as the message alone (the traceback would only show the kit's own lines)."""

    def _render_traceback_(self) -> list[str]:
        red, bold, reset = "\x1b[31m", "\x1b[1m", "\x1b[0m"
        first, *rest = str(self).splitlines()
        return [f"{red}{bold}❌ {first}{reset}", *rest]


class Blank(Exception):
    """A name the exercise asks for is missing or still `...`, or the function still raises NotImplementedError."""


@dataclass(frozen=True)
class Exercise:
    """One exercise: `blank` is the cell as the notebook ships it (its first line the marker), `solution` the cell
    solved, `wrong` a plausible wrong answer (the tests check that the check catches it); `hints` go from a nudge to
    the method, none of them the answer; `check(namespace)` returns None when the answer is right, else what is
    wrong with it; `after` is what a right answer shows."""

    id: str
    blank: str
    solution: str
    wrong: str
    hints: tuple[str, ...]
    check: Callable[[dict[str, Any]], str | None]
    after: str = ""


def value(namespace: dict[str, Any], name: str) -> Any:
    """`namespace[name]`, or Blank when the learner has not set it yet."""
    if name not in namespace or namespace[name] is Ellipsis:
        raise Blank(f"`{name}` is still `...`: set it in the exercise cell, run that cell, then this one")
    return namespace[name]


def _call(func: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
    try:
        return func(*args, **kwargs)
    except NotImplementedError as e:
        raise Blank(
            f"`{getattr(func, '__name__', 'the function')}` still raises NotImplementedError: write its body") from e


# -- 00 · setup ----------------------------------------------------------------------------------------------------
def _check_00_1(ns: dict[str, Any]) -> str | None:
    from ..eval.planner import PlanInput, plan

    answer = value(ns, "answer")
    if not isinstance(answer, bool):
        return f"`answer` must be True or False, got {answer!r}"
    report = plan(PlanInput(model="gemma-2-2b-it", tpu="v5e-1", lora=False))
    if answer != report["fits"]:
        return (f"the planner says it {'fits' if report['fits'] else 'does not fit'}: {report['advice']} Full "
                "fine-tuning keeps gradients and Adam's two moments for every weight, not only the weights")
    return None


# -- 01 · chat format ----------------------------------------------------------------------------------------------
def _first_difference(mine: str, theirs: str) -> str:
    at = next((i for i, (a, b) in enumerate(zip(mine, theirs, strict=False)) if a != b), min(len(mine), len(theirs)))
    return f"they differ from character {at}: yours {mine[at:at + 30]!r}, the template's {theirs[at:at + 30]!r}"


def _check_01_1(ns: dict[str, Any]) -> str | None:
    by_hand, tokenizer = value(ns, "by_hand"), value(ns, "tokenizer")
    if not isinstance(by_hand, str):
        return f"`by_hand` must be a string, got {type(by_hand).__name__}"
    truth = tokenizer.apply_chat_template(value(ns, "conversation"), tokenize=False, add_generation_prompt=True)
    if by_hand == truth:
        return None
    notes = [_first_difference(by_hand, truth)]
    if "<start_of_turn>assistant" in by_hand:
        notes.append("Gemma calls the assistant's turn `model`")
    if not by_hand.startswith("<bos>") and truth.startswith("<bos>"):
        notes.append("the text starts with <bos>")
    if not by_hand.endswith("<start_of_turn>model\n"):
        notes.append("add_generation_prompt=True opens the model's turn at the end, for it to answer")
    return "; ".join(notes)


def _check_01_2(ns: dict[str, Any]) -> str | None:
    from ..eval.evaluation import generate_completions

    texts = value(ns, "greedy_texts")
    if not isinstance(texts, list) or len(texts) != 4 or not all(isinstance(t, str) for t in texts):
        return (
            f"`greedy_texts` must be a list of 4 strings, got {type(texts).__name__} of "
            f"{len(texts) if hasattr(texts, '__len__') else '?'}"
        )
    if len(set(texts)) > 1:
        return (
            f"the four completions differ ({texts[0]!r} vs {texts[1]!r}): that is sampling, and greedy has no "
            "randomness"
        )
    truth = generate_completions(value(ns, "model"), value(ns, "tokenizer"), [value(ns, "messages")], max_new_tokens=16,
                                 greedy=True)[0]
    if texts[0] != truth:
        return (f"they agree with each other but not with greedy decoding ({texts[0]!r} vs {truth!r}): a low "
                "temperature or a fixed seed repeats a sample, greedy takes the most likely token each time")
    return None


# -- 02 · SFT ------------------------------------------------------------------------------------------------------
def _check_02_1(ns: dict[str, Any]) -> str | None:
    trained, batch, tokenizer, task = (value(ns, "trained"), value(ns, "batch"), value(ns, "tokenizer"),
                                       value(ns, "task"))
    if not isinstance(trained, int) or isinstance(trained, bool):
        return f"`trained` must be a whole number (int(...)), got {trained!r}"
    truth = len(tokenizer(task.demonstrations()[0]["completion"], add_special_tokens=False)["input_ids"]) + 1
    if trained == truth:
        return None
    if trained == int(batch["attention_mask"][0].sum()):
        return (
            "that counts the prompt's tokens too (attention_mask is 1 on prompt and completion); "
            "the loss only sees the completion"
        )
    if trained == batch["input_ids"].shape[1]:
        return "that is row 0's whole length, padding included"
    return f"row 0's completion has {truth - 1} tokens plus the closing <end_of_turn>; you counted {trained}"


def _check_02_2(ns: dict[str, Any]) -> str | None:
    share, after, cfg = value(ns, "teach_nothing"), value(ns, "after"), value(ns, "cfg")
    p, g = after["accuracy"], cfg.grpo.group_size
    if not isinstance(share, (int, float)):
        return f"`teach_nothing` must be a number, got {share!r}"
    truth = p ** g + (1 - p) ** g
    if math.isclose(share, truth, abs_tol=1e-6):
        return None
    if math.isclose(share, (1 - p) ** g, abs_tol=1e-6):
        return (
            "that counts the groups where every answer is wrong; "
            "a group where every answer is right has zero spread too"
        )
    if math.isclose(share, 1 - p, abs_tol=1e-6):
        return f"that is one answer being wrong; a group is G = {g} answers that must all agree"
    return f"with p = {p:.3f} and G = {g} the share is {truth:.3f}; you have {share:.3f}"


# -- 03 · rewards --------------------------------------------------------------------------------------------------
_OPERAND_CASES = [
    ("What is 47 + 38?", "<reasoning>7+8=15, 4+3+1=8</reasoning><answer>85</answer>", 1.0),
    ("What is 47 + 38?", "<reasoning>1+1=2</reasoning><answer>2</answer>", 0.0),
    ("What is 120 + 5?", "<reasoning>0+5=5, 2+0=2, 1=1</reasoning><answer>125</answer>", 1.0),
    ("What is 120 + 5?", "<reasoning>5+0=5</reasoning><answer>125</answer>", 0.0),
    ("What is 31 + 64?", "<answer>95</answer>", 0.0),
]


def _check_03_2(ns: dict[str, Any]) -> str | None:
    reward = value(ns, "copied_operands_reward")
    from ..data.rewards import as_conversation, call_reward

    prompts = [[{"role": "user", "content": q}] for q, _, _ in _OPERAND_CASES]
    try:  # as the trainer calls a reward: TRL's conversational completions
        got = call_reward(reward, prompts, as_conversation([c for _, c, _ in _OPERAND_CASES]), {})
    except NotImplementedError as e:
        raise Blank("`copied_operands_reward` still raises NotImplementedError: write its body") from e
    except (TypeError, AttributeError) as e:
        return (f"it raised {type(e).__name__}: {e}; each completion is a list of one message, so its text is "
                'completion[0]["content"]')
    if not isinstance(got, list) or len(got) != len(prompts):
        return f"a reward returns one float per completion: {len(prompts)} completions gave {got!r}"
    for (question, completion, want), score in zip(_OPERAND_CASES, got, strict=True):
        if score != want:
            return f"for {question!r} and {completion!r} it gives {score!r}, but should give {want}"
    return None


def _check_03_1(ns: dict[str, Any]) -> str | None:
    from ..data.rewards import soft_format_reward, strict_format_reward

    text = value(ns, "my_completion")
    if not isinstance(text, str):
        return f"`my_completion` must be a string, got {type(text).__name__}"
    strict, soft = strict_format_reward(None, [text])[0], soft_format_reward(None, [text])[0]
    if strict == 0.0 and soft == 1.0:
        return None
    if strict == 1.0:
        return "the strict reward gives it 1.0: it is exactly <reasoning>…</reasoning><answer>…</answer>"
    return (f"the soft reward gives it {soft} (0.25 per tag present exactly once): all four tags must be there once "
            "each, yet the strict shape broken")


# -- 04 · advantages and losses ------------------------------------------------------------------------------------
def _check_04_1(ns: dict[str, Any]) -> str | None:
    mine = value(ns, "my_advantage")
    if not isinstance(mine, (int, float)):
        return f"`my_advantage` must be a number, got {mine!r}"
    if math.isclose(mine, 0.75 / (0.5 + 1e-4), abs_tol=1e-3):
        return None
    if math.isclose(mine, 0.75 / math.sqrt(0.1875), abs_tol=2e-3):
        return "you divided by the population std (÷ G); group_zscore uses the sample std, ÷ (G − 1)"
    if math.isclose(mine, 0.75, abs_tol=1e-3):
        return "that is r − mean, Dr GRPO's advantage; the z-score divides by the group's std too"
    return f"got {mine:.4f}: mean = 0.25, std = sqrt(((1 − 0.25)² + 3 · 0.25²) / (G − 1)), A = (1 − mean) / (std + ε)"


def _check_04_2(ns: dict[str, Any]) -> str | None:
    up, down = value(ns, "objective_up"), value(ns, "objective_down")
    if not all(isinstance(v, (int, float)) for v in (up, down)):
        return f"both must be numbers, got {up!r} and {down!r}"
    problems = []
    if not math.isclose(up, 1.2, abs_tol=1e-6):
        problems.append(f"with A = +1 the objective is min(1.3 · 1, clip(1.3, 0.8, 1.2) · 1) = 1.2, you have {up}"
                        + (" — that is ρA unclipped" if math.isclose(up, 1.3) else ""))
    if not math.isclose(down, -1.3, abs_tol=1e-6):
        problems.append(
            f"with A = −1 the min picks the smaller of −1.3 and −1.2, you have {down}"
            + (": the clip never makes a bad step look better than it is" if math.isclose(down, -1.2) else "")
        )
    return "; ".join(problems) or None


# -- 05 · GRPO training --------------------------------------------------------------------------------------------
def _check_05_1(ns: dict[str, Any]) -> str | None:
    dash, trainer = value(ns, "dash"), value(ns, "trainer")
    last = dash.rows[-1] if dash.rows else {}
    held = dash.controls.snapshot()["beta"]
    if abs(held - 0.05) > 1e-9 and abs(getattr(ns.get("grpo_cfg"), "beta", 0.0) - 0.05) < 1e-9:
        return (f"grpo_cfg says 0.05 but the run's controls hold β = {held}: the trainer copied its settings when it "
                "was built, so a running job changes only through its controls (the dashboard's)")
    if abs(held - 0.05) > 1e-9:
        return f"the controls still hold β = {held}: move the dashboard's β control, as the guided experiments do"

    if abs(last.get("beta", -1) - 0.05) > 1e-9 or last.get("step") != trainer.step:
        return (f"the last row (step {last.get('step')}) carries β = {last.get('beta')}: train a step after the move "
                "(dash.run(trainer.step + 1))")
    return None


# -- 06 · evaluate and export --------------------------------------------------------------------------------------
def _check_06_1(ns: dict[str, Any]) -> str | None:
    from pathlib import Path

    reloaded, export_dir = value(ns, "reloaded"), value(ns, "export_dir")
    accuracy, results, stage = value(ns, "reloaded_accuracy"), value(ns, "results"), value(ns, "stage")
    if reloaded is results[stage][0]:
        return "`reloaded` is the model in memory, not the exported files: load it with from_pretrained(export_dir)"
    source = Path(getattr(reloaded, "name_or_path", "") or ".").resolve()
    if source != Path(export_dir).resolve():
        return f"`reloaded` came from {str(source)!r}, not from export_dir ({export_dir})"
    if not isinstance(accuracy, float) or accuracy != results[stage][1]["accuracy"]:
        return (f"reloaded accuracy {accuracy!r} vs {results[stage][1]['accuracy']!r} before export: evaluate the "
                "reloaded model on `test` with the same max_new_tokens")
    return None


# -- 07 · scaling --------------------------------------------------------------------------------------------------
_ROLLOUT_07_1 = {"model": "gemma-3-1b-it", "tpu": "v5e-1", "prompts_per_step": 8, "group_size": 8,
                 "prompt_length": 128, "max_new_tokens": 768}
"""Exercise 07.1's rollout: Gemma 3 1B on one v5e-1 chip (Colab's TPU), 8 prompts × G = 8, 128 + 768 tokens."""


def _check_07_1(ns: dict[str, Any]) -> str | None:
    from ..eval.planner import GIB, PlanInput, estimate, model_spec

    mine = value(ns, "kv_cache_gib")
    if not isinstance(mine, int | float) or isinstance(mine, bool) or not math.isfinite(mine) or mine <= 0:
        return f"`kv_cache_gib` must be a positive number of GiB, got {mine!r}"
    truth = estimate(PlanInput(**_ROLLOUT_07_1), micro_batch=1, checkpointing=False)["kv_cache"] / GIB
    ratio = mine / truth
    if abs(ratio - 1) <= 0.01:
        return None
    spec = model_spec(_ROLLOUT_07_1["model"])
    likely = [
        (0.5, "that is half: the cache holds keys and values, the factor 2"),
        (spec.heads / spec.kv_heads, f"the cache stores the {spec.kv_heads} key/value head(s), not the {spec.heads} "
                                     "query heads (grouped-query attention)"),
        (2.0, "bf16 is 2 bytes per element, not 4"),
        (GIB / 1e9, "that is in GB (10⁹ bytes); divide the bytes by 1024³ for GiB"),
        (1e9 / GIB, "divide the bytes by 1024³ (GiB), not 10⁹"),
        ((128 + 768) / 768, "T is the whole sequence, prompt and completion: 128 + 768"),
        (768 / (128 + 768), "T is the whole sequence, prompt and completion: 128 + 768"),
        (1 / 8, "R is every row the rollout samples: 8 prompts × G = 8 completions"),
        (8.0, "R is every row the rollout samples: 8 prompts × G = 8 completions"),
    ]
    for factor, why in likely:
        if abs(ratio / factor - 1) <= 0.02:
            return f"{mine:.3g} GiB: {why}"
    return (f"{mine:.3g} GiB is {ratio:.2f}× the planner's figure; multiply R · T · L · 2 · K · d · b with "
            "R = 64 rows, T = 896 tokens and L, K, d from `spec`, b = 2, then divide by 1024³")


# -- 08 · capstone -------------------------------------------------------------------------------------------------
def _check_08_1(ns: dict[str, Any]) -> str | None:
    arc = value(ns, "arc")
    fixed, broken = value(ns, "fixed"), value(ns, "broken")
    sft, grpo = arc.evaluate("sft")["correct"], arc.evaluate("grpo")["correct"]
    true_fixed = sum(1 for s, g in zip(sft, grpo, strict=True) if g and not s)
    true_broken = sum(1 for s, g in zip(sft, grpo, strict=True) if s and not g)
    if (fixed, broken) == (true_fixed, true_broken):
        return None
    if (fixed, broken) == (true_broken, true_fixed):
        return "fixed and broken are swapped: fixed is wrong after SFT and right after GRPO"
    if fixed == sum(grpo) or broken == sum(sft):
        return "that counts every problem right after a stage; count only the problems whose outcome changed"
    return f"fixed {fixed}, broken {broken}; count the problems where the SFT and GRPO outcomes differ, by direction"


def _check_08_2(ns: dict[str, Any]) -> str | None:
    from ..eval.evaluation import paired_difference

    arc = value(ns, "arc")
    low, high = value(ns, "low"), value(ns, "high")
    for name, v in (("low", low), ("high", high)):
        if not isinstance(v, int | float) or isinstance(v, bool) or not math.isfinite(v):
            return f"`{name}` must be a number of points, got {v!r}"
    control, grpo = arc.evaluate("control")["correct"], arc.evaluate("grpo")["correct"]
    truth = paired_difference([control], [grpo])
    width = max(truth["high"] - truth["low"], 100 / len(grpo))
    if low > high:
        return f"low {low:g} is above high {high:g}: low is the 2.5th percentile, high the 97.5th"
    if abs(low - truth["low"]) <= 0.25 * width and abs(high - truth["high"]) <= 0.25 * width:
        return None
    if max(abs(low), abs(high)) <= 1 < width:
        return f"{low:g}…{high:g} looks like a fraction; give points (× 100), as the accuracies are printed"
    if high - low > 1.3 * width:
        return (f"{low:.1f}…{high:.1f} is wider than the paired interval: resample problems, keeping each problem's "
                "two outcomes together, and take the difference within each resample")
    if high - low < 0.5 * width:
        return (f"{low:.1f}…{high:.1f} is too narrow: take the 2.5th and 97.5th percentiles of the resampled "
                "mean differences, not of a few draws")
    return (f"{low:.1f}…{high:.1f} points; the bootstrap gives about {truth['low']:.1f}…{truth['high']:.1f}: draw "
            "len(grpo) problem indices with replacement, average grpo − control over them, repeat, take percentiles")


# -- 09 · your task ------------------------------------------------------------------------------------------------
def _check_09_1(ns: dict[str, Any]) -> str | None:
    from ..data.rewards import test_reward

    cases, reward = value(ns, "my_cases"), value(ns, "answer_kind_reward")
    if not isinstance(cases, list) or len(cases) != 2 or any(c is Ellipsis for c in cases):
        raise Blank("`my_cases` needs your two cases in place of the `...`")
    for case in cases:
        if case.get("answer_type") != "string" or "<answer>" not in case.get("completion", ""):
            return f"each case is a text answer (answer_type 'string') with an <answer> block: {case!r}"
    if sorted(c.get("expected") for c in cases) != [0.0, 0.5]:
        return "one case should expect 0.5 and the other 0"
    for result in test_reward(reward, cases, show=False):
        if not result["ok"]:
            return (
                f"the reward gives {result['score']} for {result['completion']!r}, your case expects "
                f"{result['expected']}"
            )
    return None


def _check_09_2(ns: dict[str, Any]) -> str | None:
    from ..data.answer_format import extract_answer
    from ..data.rewards import correctness_reward

    row, wrong, judge = value(ns, "row"), value(ns, "wrong"), value(ns, "judge")
    endorsed = value(ns, "endorsed")
    gated = value(ns, "gated_judge_reward")
    if not isinstance(endorsed, str):
        return f"`endorsed` must be a completion's text, got {type(endorsed).__name__}"
    prompt, columns = [row["prompt"]], {"answer": [row["answer"]], "answer_type": [row["answer_type"]]}
    said = extract_answer(endorsed)
    if said is None:
        return "`endorsed` has no <answer> block: the judge reads what is inside it"
    if correctness_reward(prompt, [endorsed], **columns)[0] == 1.0:
        return "`endorsed` is right: keep `wrong`'s wrong answer and add words that tell the judge it is right"
    plain = extract_answer(wrong)
    if not said.startswith(plain or "") or len(said) <= len(plain or ""):
        return f"`endorsed`'s answer should be `wrong`'s ({plain!r}) followed by words addressed to the judge"
    right = f"<reasoning>Worked out.</reasoning><answer>{row['answer']}</answer>"
    texts = [wrong, endorsed, right]
    rows = {k: v * 3 for k, v in columns.items()}
    judged = judge(prompt * 3, texts)
    scores = _call(gated, prompt * 3, texts, **rows)
    if not isinstance(scores, list) or len(scores) != 3:
        return f"`gated_judge_reward` must return one score per completion (3 here), got {scores!r}"
    expected = [0.0, 0.0, judged[2]]
    if all(abs(float(a) - b) <= 1e-4 for a, b in zip(scores, expected, strict=True)):
        return None
    if abs(float(scores[1]) - judged[1]) <= 1e-4 and judged[1] > 0:
        return (f"the endorsed wrong answer still earns the judge's {judged[1]:.2f}: give 0.0 where "
                "gk.correctness_reward says the answer is wrong")
    if abs(float(scores[2]) - judged[2]) > 1e-4:
        return (f"a right answer should keep the judge's score ({judged[2]:.2f}), got {float(scores[2]):.2f}: gate, "
                "do not replace the judge")
    return f"got {scores}, expected {[round(x, 4) for x in expected]}: the judge's score where the verifier says right"


EXERCISES_FILE = Path(__file__).resolve().parents[1] / "assets" / "exercises.yaml"
"""The exercises' texts as data: each id's blank cell, solution, wrong answer, hints and what a right answer shows."""

CHECKS: dict[str, Callable[[dict[str, Any]], str | None]] = {
    "00.1": _check_00_1, "01.1": _check_01_1, "01.2": _check_01_2, "02.1": _check_02_1, "02.2": _check_02_2,
    "03.1": _check_03_1, "03.2": _check_03_2, "04.1": _check_04_1, "04.2": _check_04_2, "05.1": _check_05_1,
    "06.1": _check_06_1, "07.1": _check_07_1, "08.1": _check_08_1, "08.2": _check_08_2, "09.1": _check_09_1,
    "09.2": _check_09_2}
"""Each exercise's check, by id."""


def _load_exercises() -> dict[str, Exercise]:
    texts = yaml.safe_load(EXERCISES_FILE.read_text(encoding="utf-8"))
    if set(texts) != set(CHECKS):
        raise RuntimeError(f"{EXERCISES_FILE.name} and CHECKS name different exercises: "
                           f"{sorted(set(texts) ^ set(CHECKS))}")
    return {exercise_id: Exercise(id=exercise_id, blank=t["blank"], solution=t["solution"], wrong=t["wrong"],
                                  hints=tuple(t["hints"]), check=CHECKS[exercise_id], after=t["after"])
            for exercise_id, t in texts.items()}


EXERCISES: dict[str, Exercise] = _load_exercises()
"""Every exercise of the course by id ("03.1": notebook 03's first)."""


def _exercise(exercise_id: str) -> Exercise:
    if exercise_id not in EXERCISES:
        raise KeyError(f"no exercise {exercise_id!r}: the course has {', '.join(EXERCISES)}")
    return EXERCISES[exercise_id]


def check_exercise(exercise_id: str, namespace: dict[str, Any]) -> None:
    """Check exercise `exercise_id` against the names in `namespace` (pass `globals()`): prints ✅ and what the
    exercise shows, or raises NotYet saying what is wrong and how to get a hint and the answer."""
    exercise = _exercise(exercise_id)
    try:
        problem = exercise.check(namespace)
    except Blank as blank:
        problem = str(blank)
    if problem:
        raise NotYet(f"Not yet ({exercise_id}): {problem}.\n"
                     f"   💡 Stuck? nbk.hint({exercise_id!r}) gives a nudge (run it again for the method, "
                     f"{len(exercise.hints)} hints in all) · one answer: nbk.reveal({exercise_id!r})") from None
    print(f"✅ {exercise_id} correct" + (f": {exercise.after}" if exercise.after else ""))


_hints_given: dict[str, int] = {}
"""How many of each exercise's hints `hint` has printed in this kernel."""


def hint(exercise_id: str, level: int | None = None) -> None:
    """Print the exercise's next hint (or hint number `level`, from 1): a nudge first, then the method."""
    hints = _exercise(exercise_id).hints
    if level is None:
        level = min(_hints_given.get(exercise_id, 0) + 1, len(hints))
    if not 1 <= level <= len(hints):
        raise ValueError(f"exercise {exercise_id} has hints 1–{len(hints)}, got {level}")
    _hints_given[exercise_id] = max(_hints_given.get(exercise_id, 0), level)
    more = (f"run nbk.hint({exercise_id!r}) again for the next" if level < len(hints)
            else f"still stuck? nbk.reveal({exercise_id!r}) shows one answer")
    print(f"💡 {exercise_id}, hint {level} of {len(hints)}: {hints[level - 1]}\n   ({more})")


def reveal(exercise_id: str) -> None:
    """Print the exercise's solution, to paste over the exercise cell."""
    print(
        f"# one solution to {exercise_id} — paste it over the exercise cell and run "
        f"it\n{_exercise(exercise_id).solution}"
    )


def solved(source: str) -> str:
    """`source` with an exercise cell's blank replaced by its solution (other cells unchanged)."""
    found = MARKER.match(source)
    return _exercise(found.group(1)).solution if found else source


def use_solutions(shell: Any = None) -> bool:
    """With GRPO_KIT_SOLUTIONS=1 in IPython, run every exercise cell's solution in place of its blank (the cell's text
    stays as shipped). Returns whether it did; `notebook.py` calls it on import."""
    if os.environ.get("GRPO_KIT_SOLUTIONS") != "1":
        return False
    if shell is None:
        try:
            from IPython import get_ipython
        except ImportError:
            return False
        shell = get_ipython()
    if shell is None or not hasattr(shell, "input_transformers_cleanup"):
        return False
    if _transform not in shell.input_transformers_cleanup:
        shell.input_transformers_cleanup.append(_transform)
    return True


def _transform(lines: list[str]) -> list[str]:
    source = "".join(lines)
    replaced = solved(source)
    return lines if replaced is source else replaced.splitlines(keepends=True) + ["\n"]
