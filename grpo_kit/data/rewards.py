"""Reward functions with TRL's signature, and their weighted combination.

A reward function is `f(prompts, completions, **kwargs) -> list[float | None]`: one score per completion, None
meaning "does not apply to this row" (it is then left out of that row's weighted sum, as in TRL). It is called as
TRL's GRPOTrainer calls it, by keyword (`f(prompts=…, completions=…, completion_ids=…, **columns, trainer_state=…,
log_metric=…, log_extra=…)`; a function without a `completions` parameter gets prompts and completions by
position, as `f(p, c, **columns)`), so a reward written for TRL runs unchanged:

    completions    TRL's conversational format when the prompts are chat messages (the kit's always are): each
                   completion a list of one message, [{"role": "assistant", "content": "<reasoning>…"}];
                   `completion_text(c)` gives its text either way. Plain strings where the prompts are text.
    columns        the dataset's columns (e.g. `answer`, `answer_type`) repeated per completion
    completion_ids each completion's token ids
    trainer_state  `RewardState`: the step (`global_step`) and the run's length (`max_steps`), as TRL's TrainerState
    log_metric     `log_metric(name, value)`: a number for this step's metrics row (`logged/<name>`, averaged over
                   the calls of the step) and the dashboard
    log_extra      `log_extra(column, values)`: one value per completion, shown beside the logged completions

Keyword arguments a function does not take are left out, unless it takes **kwargs.
"""

from __future__ import annotations

import inspect
import math
import re
import threading
from collections import defaultdict
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch

from .answer_format import (
    REASONING_BLOCK,
    STRICT_FORMAT,
    TAGS,
    answer_matches,
    extract_answer,
    infer_answer_type,
)
from .tasks import completion_text

RewardFunc = Callable[..., list]



def strict_format_reward(prompts: list, completions: list, **_: Any) -> list[float]:
    """1.0 when the whole completion is `<reasoning>…</reasoning><answer>…</answer>` (whitespace allowed
    around the blocks, each tag exactly once), else 0.0."""
    texts = [completion_text(c) for c in completions]
    return [1.0 if STRICT_FORMAT.match(t) and all(t.count(tag) == 1 for tag in TAGS) else 0.0 for t in texts]


def soft_format_reward(prompts: list, completions: list, **_: Any) -> list[float]:
    """Partial credit: 0.25 for each of the four tags that appears exactly once (max 1.0).

    Gives a gradient toward the format before the strict reward ever fires.
    """
    return [sum(0.25 for tag in TAGS if completion_text(c).count(tag) == 1) for c in completions]






def make_correctness_reward(
    abs_tol: float = 1e-6, rel_tol: float = 0.0, numeric_credit: float = 1.0, name: str = "correctness_reward"
) -> RewardFunc:
    """Build a correctness reward for the extracted answer, by the row's answer type (the dataset column
    `answer_type` where it has one, else inferred from the answer: `answer_format.infer_answer_type`):

    - number: 1.0 for an exact string match, `numeric_credit` when both hold one number (`answer_format.parse_number`:
      "$1,350.00", "18 dollars.") and |x − y| ≤ max(abs_tol, rel_tol·|y|) (e.g. "68.0" vs "68"), else 0.0;
    - choice, string, regex: 1.0 when `answer_format.answer_matches` says so ("(b)" for B, "the Nile." for Nile), else
    0.0.

    Needs the dataset column `answer`.
    """

    def reward(prompts: list, completions: list, answer: list[str] | None = None, answer_type: list[str] | None = None,
               **_: Any) -> list[float]:
        if answer is None:
            raise ValueError(f"{name} needs the dataset column 'answer'")
        types = answer_type if answer_type is not None else [None] * len(answer)
        scores = []
        for c, truth, kind in zip(completions, answer, types, strict=True):
            got, truth = extract_answer(completion_text(c)), str(truth).strip()
            kind = infer_answer_type(truth) if kind in (None, "auto") else kind
            if got is None:
                scores.append(0.0)
            elif kind != "number":
                scores.append(float(answer_matches(got, truth, kind)))
            elif got == truth:
                scores.append(1.0)
            else:
                scores.append(
                    numeric_credit if answer_matches(got, truth, "number", abs_tol=abs_tol, rel_tol=rel_tol) else 0.0)
        return scores

    reward.__name__ = name
    return reward


correctness_reward = make_correctness_reward()


def answer_digits_reward(prompts: list, completions: list, answer: list[str] | None = None, **_: Any) -> list[float]:
    """Partial credit for an integer answer, digit by digit from the right:

        r = #{i : pred[-i] = truth[-i]} / max(len(pred), len(truth))

    so 85 for 85 scores 1.0, 84 for 85 scores 0.5, 185 for 85 scores 2/3, no `<answer>` or a non-integer 0.0.
    Still a verifier (it compares with the true answer, so it cannot be gamed the way a step-checker can) but
    denser than exact match: a completion that got the ones column right and slipped on the carry is told
    so. Needs the dataset column `answer`; answers that are not integers score by exact match.
    """
    if answer is None:
        raise ValueError("answer_digits_reward needs the dataset column 'answer'")
    scores = []
    for c, truth in zip(completions, answer, strict=True):
        got, truth = extract_answer(completion_text(c)), str(truth).strip()
        if got is None:
            scores.append(0.0)
        elif not (got.lstrip("-").isdigit() and truth.lstrip("-").isdigit()):
            scores.append(1.0 if got == truth else 0.0)
        else:
            same = sum(1 for x, y in zip(reversed(got), reversed(truth), strict=False) if x == y)
            scores.append(same / max(len(got), len(truth)))
    return scores

_STEP = re.compile(r"(\d+(?:\s*[-+*]\s*\d+)+)\s*=\s*(-?\d+)")


def _arithmetic(expr: str) -> int:
    """Evaluate digits joined by + − × (standard precedence) without eval()."""
    total, term, sign = 0, None, 1
    for tok in re.findall(r"\d+|[-+*]", expr):
        if tok == "*":
            continue
        if tok in "+-":
            total, term, sign = total + sign * term, None, (1 if tok == "+" else -1)
            continue
        # a number right after "*" multiplies the running term; after + or − it starts a new term
        term = int(tok) if term is None else term * int(tok)
    return total + sign * (term or 0)


def arithmetic_steps_reward(prompts: list, completions: list, **_: Any) -> list[float]:
    """Process reward: the fraction of `expression = value` steps inside `<reasoning>` whose arithmetic is
    right (e.g. "7+8=15" right, "6+0=7" wrong); 0.0 when there are no such steps.

    A verifier like correctness, but dense: a completion with one slip still gets credit for its right
    steps, so groups where every final answer is wrong still carry signal. It can be gamed by padding the
    reasoning with true but useless steps ("1+1=2"): use it next to correctness, never alone.
    """
    scores = []
    for c in completions:
        block = REASONING_BLOCK.search(completion_text(c))
        steps = _STEP.findall(block.group(1)) if block else []
        right = sum(1 for expr, value in steps if _arithmetic(expr) == int(value))
        scores.append(right / len(steps) if steps else 0.0)
    return scores


class JudgeReward:
    """A judge-model reward for answers no verifier can check: a causal LM (e.g. a larger Gemma) reads the `rubric`,
    the question and the completion's answer, and the reward is its probability of "Yes" against "No" for the next
    token: r = p(Yes) / (p(Yes) + p(No)), in [0, 1]. Slower than a verifier (one forward per completion) and as
    fallible as the judge: check it on cases with `test_reward` first, and keep a verifier where one exists."""

    def __init__(self, model: torch.nn.Module, tokenizer: Any, rubric: str, *, batch_size: int = 8,
                 name: str = "judge_reward") -> None:
        self.model, self.tokenizer, self.rubric, self.batch_size = model.eval(), tokenizer, rubric, batch_size
        self.__name__ = name
        self.choices = [self._token(word) for word in ("Yes", "No")]

    def _token(self, word: str) -> int:
        ids = self.tokenizer(word, add_special_tokens=False)["input_ids"]
        if not ids:
            raise ValueError(f"judge_reward: the judge's tokenizer has no token for {word!r}")
        return ids[0]

    def prompt(self, prompt: Any, completion: Any) -> str:
        """The judge's chat prompt for one completion (its `<answer>` if it has one, else the whole completion)."""
        question = prompt[-1]["content"] if isinstance(prompt, list) else str(prompt)
        text = completion_text(completion)
        answer = extract_answer(text) or text
        ask = (f"{self.rubric}\n\nQuestion: {question}\n\nAnswer: {answer}\n\nDoes the answer meet the rubric? "
               "Reply with Yes or No.")
        return self.tokenizer.apply_chat_template(
            [{"role": "user", "content": ask}], tokenize=False, add_generation_prompt=True
        )

    @torch.no_grad()
    def __call__(self, prompts: list, completions: list, **_: Any) -> list[float]:
        texts = [self.prompt(p, c) for p, c in zip(prompts, completions, strict=True)]
        device = next(self.model.parameters()).device
        side, self.tokenizer.padding_side = self.tokenizer.padding_side, "left"  # the last position is the next token
        try:
            scores: list[float] = []
            for i in range(0, len(texts), self.batch_size):
                enc = self.tokenizer(texts[i : i + self.batch_size], return_tensors="pt", padding=True,
                                     add_special_tokens=False).to(device)
                logits = self.model(**enc).logits[:, -1, self.choices].float()
                scores.extend(logits.softmax(-1)[:, 0].cpu().tolist())
        finally:
            self.tokenizer.padding_side = side
        return scores


def judge_reward(model: torch.nn.Module, tokenizer: Any, rubric: str, **kwargs: Any) -> JudgeReward:
    """A `JudgeReward`: `model` judges each answer against `rubric` (see the class)."""
    return JudgeReward(model, tokenizer, rubric, **kwargs)


def test_reward(func: RewardFunc, cases: Sequence[dict[str, Any]], *, tolerance: float = 1e-6, show: bool = True,
                ) -> list[dict[str, Any]]:
    """Unit-test a reward before training with it: each case is a dict with `completion` (its text), `expected` (the
    score it should get) and any dataset columns the reward reads (`answer`, …; `prompt`, its question's text,
    defaults to ""). The reward is called as a trainer calls it (`compute_rewards`): the prompt as chat messages and
    the completion in TRL's conversational form. Prints a table of case → score → expected (✓ within `tolerance`,
    ✗ otherwise) and returns its rows; a reward that raises shows its error in the table. `test_reward.__test__` is
    False, so pytest never collects it."""
    rows = []
    for i, case in enumerate(cases):
        columns = {k: [v] for k, v in case.items() if k not in ("completion", "expected", "prompt")}
        prompt = case.get("prompt", "")
        messages = prompt if isinstance(prompt, list) else [{"role": "user", "content": str(prompt)}]
        kwargs = {**columns, "trainer_state": RewardState(), "log_metric": lambda name, value: None,
                  "log_extra": lambda column, values: None}
        try:
            score: Any = call_reward(func, [messages], as_conversation([case["completion"]]), kwargs)[0]
        except Exception as e:  # noqa: BLE001 - the table shows it
            score = f"{type(e).__name__}: {e}"
        ok = isinstance(score, (int, float)) and abs(float(score) - float(case["expected"])) <= tolerance
        rows.append({"case": i, "completion": completion_text(case["completion"]), "score": score,
                     "expected": case["expected"], "ok": ok})
    if show:
        print(f"{'case':>4}  {'completion':<44}  {'score':>8}  {'expected':>8}")
        for r in rows:
            shown = r["completion"].replace("\n", " ")
            shown = shown if len(shown) <= 44 else shown[:41] + "..."
            score = f"{r['score']:.3f}" if isinstance(r["score"], (int, float)) else str(r["score"])[:30]
            print(f"{r['case']:>4}  {shown:<44}  {score:>8}  {float(r['expected']):>8.3f}  {'✓' if r['ok'] else '✗'}")
        print(f"{sum(r['ok'] for r in rows)} of {len(rows)} cases as expected")
    return rows


test_reward.__test__ = False  # type: ignore[attr-defined]


def make_length_penalty(max_tokens: int, buffer: int, penalty: float = 1.0, name: str = "length_penalty") -> RewardFunc:
    """DAPO's soft overlong punishment, in tokens (characters when `completion_ids` are not given):

        r(L) = 0                                  if L ≤ max_tokens − buffer
             = −penalty · (L − (max_tokens − buffer)) / buffer   if L < max_tokens
             = −penalty                           otherwise
    """
    if buffer <= 0 or buffer > max_tokens:
        raise ValueError(f"{name}: need 0 < buffer <= max_tokens, got buffer={buffer}, max_tokens={max_tokens}")
    start = max_tokens - buffer

    def reward(prompts: list, completions: list, completion_ids: list | None = None, **_: Any) -> list[float]:
        lengths = (
            [len(ids) for ids in completion_ids]
            if completion_ids is not None
            else [len(completion_text(c)) for c in completions]
        )
        return [0.0 if n <= start else -penalty * min(1.0, (n - start) / buffer) for n in lengths]

    reward.__name__ = name
    return reward


class ClassifierReward:
    """A model-based reward: the probability (or logit) a sequence-classification model gives one label.

    Wraps any `AutoModelForSequenceClassification` — a toxicity classifier (reward = 1 − p(toxic): pass
    `label` of the non-toxic class), a judge or a reward model (`use_logit=True` for a scalar head).
    The text scored is `prompt_text + completion` when `include_prompt`, else the completion.
    """

    def __init__(
        self,
        model: torch.nn.Module,
        tokenizer: Any,
        label: int = 1,
        use_logit: bool = False,
        include_prompt: bool = False,
        batch_size: int = 16,
        max_length: int = 512,
        name: str | None = None,
    ) -> None:
        self.model, self.tokenizer = model.eval(), tokenizer
        self.label, self.use_logit, self.include_prompt = label, use_logit, include_prompt
        self.batch_size, self.max_length = batch_size, max_length
        self.__name__ = name or f"classifier_{type(model).__name__}"

    @torch.no_grad()
    def __call__(self, prompts: list, completions: list, **_: Any) -> list[float]:
        texts = []
        for p, c in zip(prompts, completions, strict=True):
            prefix = (
                (p if isinstance(p, str) else " ".join(m["content"] for m in p)) + "\n" if self.include_prompt else "")
            texts.append(prefix + completion_text(c))
        device = next(self.model.parameters()).device
        scores: list[float] = []
        for i in range(0, len(texts), self.batch_size):
            enc = self.tokenizer(
                texts[i : i + self.batch_size],
                return_tensors="pt",
                padding=True,
                truncation=True,
                max_length=self.max_length,
            ).to(device)
            logits = self.model(**enc).logits.float()
            values = logits[:, self.label] if self.use_logit else logits.softmax(-1)[:, self.label]
            scores.extend(values.cpu().tolist())
        return scores


def reward_name(func: RewardFunc) -> str:
    """The name a reward is logged and weighted under."""
    return getattr(func, "__name__", None) or type(func).__name__


class RewardError(RuntimeError):
    """A reward function raised, returned NaN/inf, or returned the wrong number of scores."""


@dataclass(frozen=True)
class RewardState:
    """What TRL's `trainer_state` gives a reward, under the same names: the step being scored (`global_step`, the
    steps finished before it) and the steps the run is set to take (`max_steps`)."""

    global_step: int = 0
    max_steps: int = 0


@dataclass
class RewardResult:
    per_function: torch.Tensor
    """(F, B) float32; NaN where a function returned None (not applicable)."""
    total: torch.Tensor
    """(B,) weighted sum over the functions that apply to each row."""
    names: list[str]
    weights: list[float]
    failures: dict[str, int]
    """Per function: completions scored 0 because the function failed on them (on_error='zero')."""
    logged: dict[str, list[float]] = field(default_factory=dict)
    """What the rewards logged with `log_metric`, by name: each call's value, in order (a step's row takes their
    mean)."""
    extra: dict[str, list] = field(default_factory=dict)
    """What the rewards logged with `log_extra`, by column: one value per completion."""


def call_reward(func: RewardFunc, prompts: list, completions: list, kwargs: dict[str, Any]) -> list:
    """`func` called as TRL calls a reward: by keyword (`prompts=`, `completions=`, then `kwargs`) where it has a
    parameter named `completions`; the kit's positional style `f(p, c, **columns)` otherwise. Either way it gets only
    the keyword arguments it names, or all of them where it takes **kwargs."""
    try:
        params = inspect.signature(func).parameters
    except (TypeError, ValueError):  # a builtin or C callable: give it everything, as TRL would
        return list(func(prompts=prompts, completions=completions, **kwargs))
    takes_all = any(p.kind is p.VAR_KEYWORD for p in params.values())
    by_name = {n for n, p in params.items() if p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY)}
    if "completions" in by_name:
        given = {"prompts": prompts, "completions": completions, **kwargs}
        return list(func(**{k: v for k, v in given.items() if takes_all or k in by_name}))
    return list(func(prompts, completions, **{k: v for k, v in kwargs.items() if takes_all or k in by_name}))


def as_conversation(completions: list) -> list:
    """Completions in TRL's conversational form: each text as a list of one assistant message."""
    return [c if isinstance(c, list) else [{"role": "assistant", "content": c}] for c in completions]


def _call_with_timeout(func: RewardFunc, prompts: list, completions: list, *, name: str, timeout: float | None,
                       columns: dict) -> list:
    """`call_reward(func, prompts, completions, columns)`, raising RewardError after `timeout` seconds. Python cannot
    stop a thread, so a reward that hangs is left running in a daemon thread (it ends with the process) while
    the run stops with the error."""
    if timeout is None:
        return call_reward(func, prompts, completions, columns)
    outcome: dict[str, Any] = {}

    def call() -> None:
        try:
            outcome["scores"] = call_reward(func, prompts, completions, columns)
        except BaseException as e:  # noqa: BLE001 - handed to the caller's thread
            outcome["error"] = e

    worker = threading.Thread(target=call, name=f"reward {name}", daemon=True)
    worker.start()
    worker.join(timeout)
    if worker.is_alive():
        raise RewardError(f"reward {name!r} did not return within {timeout:g} s on a batch of {len(completions)} "
                          "completions (GRPOConfig.reward_timeout_seconds): is it waiting on something?")
    if "error" in outcome:
        raise outcome["error"]
    return outcome["scores"]


def _as_score(value: Any) -> Any:
    """A numpy or torch scalar (a 0-dim array, a one-element tensor) as a Python number, as TRL accepts them;
    anything else unchanged, for the caller to judge."""
    if isinstance(value, (int, float)) or not hasattr(value, "item"):
        return value
    try:
        return value.item()
    except (TypeError, ValueError, RuntimeError):  # more than one element
        return value


def _finite_score(value: Any) -> float | None:
    """`value` (`_as_score`'d) as a float when it is a finite number, not a bool; else None."""
    value = _as_score(value)
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(float(value)):
        return None
    return float(value)


def _score_one_by_one(func: RewardFunc, name: str, prompts: list, completions: list, *, columns: dict, on_error: str,
                      first_error: Exception, timeout: float | None) -> tuple[list, int]:
    """After a batch call failed: score each completion alone, so the culprit is named and the rest kept. Each call
    has the same `timeout` as the batch: a reward that hangs on one row stops the run, naming it."""
    scores, failures = [], 0
    for i in range(len(completions)):
        row_cols = {k: v[i : i + 1] if isinstance(v, list) else v for k, v in columns.items()}
        try:
            value = _call_with_timeout(func, prompts[i : i + 1], completions[i : i + 1], name=name, timeout=timeout,
                                       columns=row_cols)[0]
        except RewardError:
            raise
        except Exception as e:  # noqa: BLE001 - any error in user code is reported with its row
            if on_error == "raise":
                raise RewardError(
                    f"reward {name!r} raised {type(e).__name__}: {e} on completion {i}: "
                    f"{completion_text(completions[i])[:200]!r}"
                ) from e
            value, failures = 0.0, failures + 1
        scores.append(value)
    if failures == 0 and on_error == "raise":
        raise RewardError(
            f"reward {name!r} raised {type(first_error).__name__} on the batch: {first_error}") from first_error
    return scores, failures


def compute_rewards(
    reward_funcs: Sequence[RewardFunc],
    prompts: list,
    completions: list,
    columns: dict[str, list] | None = None,
    weights: dict[str, float] | None = None,
    *,
    on_error: str = "raise",
    timeout: float | None = None,
    state: RewardState | None = None,
) -> RewardResult:
    """Score completions (text) with every reward function, called as TRL calls them (the module docstring: chat
    prompts get conversational completions, `state` arrives as `trainer_state`), and combine them:

        total_i = Σ_f w_f · r_f(i)   over the functions f whose r_f(i) is not None

    A function that raises, returns NaN/inf or the wrong count raises `RewardError` naming the function and
    the completion (on_error='raise'), or scores those completions 0 and counts them (on_error='zero'). A
    function still running after `timeout` seconds raises `RewardError` naming it, whatever on_error says.
    """
    names = _checked_inputs(reward_funcs, completions, columns or {}, weights or {})
    n = len(completions)
    w = [float((weights or {}).get(nm, 1.0)) for nm in names]
    table = torch.full((len(reward_funcs), n), float("nan"))
    failures: dict[str, int] = {}
    given = as_conversation(completions) if prompts and isinstance(prompts[0], list) else completions
    logged: dict[str, list[float]] = defaultdict(list)
    extra: dict[str, list] = {}

    def log_metric(name: str, value: float) -> None:
        number = _finite_score(value)
        if number is None:
            raise ValueError(f"log_metric({name!r}, {value!r}): the value must be a finite number")
        logged[str(name)].append(number)

    def log_extra(column: str, values: list) -> None:
        extra.setdefault(str(column), []).extend(values)

    kwargs = {**(columns or {}), "trainer_state": state or RewardState(), "log_metric": log_metric,
              "log_extra": log_extra}
    for fi, (func, name) in enumerate(zip(reward_funcs, names, strict=True)):
        try:
            scores = _call_with_timeout(func, prompts, given, name=name, timeout=timeout, columns=kwargs)
            failed = 0
        except RewardError:
            raise
        except Exception as e:  # noqa: BLE001
            scores, failed = _score_one_by_one(func, name, prompts, given, columns=kwargs, on_error=on_error,
                                               first_error=e, timeout=timeout)
        failures[name] = _fill_row(table[fi], scores, name=name, completions=completions, on_error=on_error,
                                   failed=failed)
    weighted = table * torch.tensor(w).unsqueeze(1)
    total = torch.nansum(weighted, dim=0)
    return RewardResult(per_function=table, total=total, names=names, weights=w, failures=failures,
                        logged=dict(logged), extra=extra)


def _checked_inputs(reward_funcs: Sequence[RewardFunc], completions: list, columns: dict[str, list],
                    weights: dict[str, float]) -> list[str]:
    """The reward functions' names, after checking what `compute_rewards` was given: a one-line ValueError names
    a missing function list, a column of the wrong length, a repeated name or a weight for an unknown reward."""
    if not reward_funcs:
        raise ValueError("compute_rewards: no reward functions given")
    n = len(completions)
    for key, values in columns.items():
        if len(values) != n:
            raise ValueError(f"compute_rewards: column {key!r} has {len(values)} values for {n} completions")
    names = [reward_name(f) for f in reward_funcs]
    if len(set(names)) != len(names):
        raise ValueError(f"compute_rewards: reward names must be unique, got {names}")
    unknown = set(weights) - set(names)
    if unknown:
        raise ValueError(f"compute_rewards: weights for unknown rewards {sorted(unknown)}; rewards are {names}")
    return names


def _fill_row(row: torch.Tensor, scores: list, *, name: str, completions: list, on_error: str, failed: int) -> int:
    """Write one reward function's `scores` into its `row` of the table (None stays NaN: the function does not
    apply); a non-finite score raises `RewardError` naming the completion (on_error='raise') or scores 0 and is
    counted. Returns the function's failures."""
    if len(scores) != len(completions):
        raise RewardError(f"reward {name!r} returned {len(scores)} scores for {len(completions)} completions")
    for i, s in enumerate(scores):
        if s is None:
            continue
        score = _finite_score(s)
        if score is None:
            if on_error == "raise":
                raise RewardError(f"reward {name!r} returned {_as_score(s)!r} for completion {i}: "
                                  f"{completion_text(completions[i])[:200]!r}")
            score, failed = 0.0, failed + 1
        row[i] = score
    return failed


DEFAULT_REWARDS: tuple[RewardFunc, ...] = (correctness_reward, answer_digits_reward, strict_format_reward)
"""Verifier rewards the demo trains with: correctness (1.0), answer digits (1.0: partial credit, so a group
whose answers are all wrong still says which were closer) and strict format (0.1). `arithmetic_steps_reward`
is left out on purpose: a policy can raise it with right sums of wrongly copied digits while its answers get
worse — the reward hack notebook 03 shows."""
DEFAULT_WEIGHTS: dict[str, float] = {"correctness_reward": 1.0, "answer_digits_reward": 1.0,
                                     "strict_format_reward": 0.1}
