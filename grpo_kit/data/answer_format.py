"""The answer format, in one place: the tags a completion writes, the instructions that ask for them, how the final
answer is read back, and how it is compared with the right one. Tasks, rewards, the tiny tokenizer, the presets'
instructions and the evaluation all read it from here; change the format here and nowhere else.

    <reasoning>47 + 38: 7+8=15, 4+3+1=8</reasoning><answer>85</answer>     (`format_completion`)

`STRICT_FORMAT` is the whole-completion shape the strict format reward checks, `extract_answer` the text of the last
`<answer>` block. Answer types say how that text is compared with the right answer:

    number    one number, within a tolerance: "$1,350.00" = "1350", "18 dollars." = "18" (`parse_number`)
    choice    one of the letters A–E, also inside prose: "(b)", "B)", "The answer is B." = "B"
    string    text after normalising: case, surrounding whitespace and punctuation, runs of spaces, a leading
              "the"/"a"/"an": "  The Eiffel Tower. " = "eiffel tower"
    regex     the right answer is a regular expression the whole answer must match (case-insensitive)
    math      a mathematical answer read by math-verify (the `math` extra, as TRL's `accuracy_reward` reads them):
              fractions, LaTeX and expressions: "\\frac{2}{3}" = "2/3", "(x+1)^2" = "x^2+2x+1"; two numbers match
              within the tolerance, as `number` does ("0.666…" = "2/3" where abs_tol ≥ 0.001)
    function  a user function f(predicted, truth) -> bool

`parse_number` reads the one number in an answer as people and models write it. `infer_answer_type` picks number,
choice or string from the right answer itself, row by row, so one dataset may mix them; a task can also set one type
for every row. `answer_matches` is the comparison every reward and the evaluation use for tasks from a user's data.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Callable
from decimal import Decimal

from ..options import ANSWER_TYPES

REASONING_OPEN, REASONING_CLOSE = "<reasoning>", "</reasoning>"
ANSWER_OPEN, ANSWER_CLOSE = "<answer>", "</answer>"
TAGS = (REASONING_OPEN, REASONING_CLOSE, ANSWER_OPEN, ANSWER_CLOSE)
"""The four tags, in order (the tiny Gemma's tokenizer has each as one token; the soft format reward counts them)."""

STRICT_FORMAT = re.compile(rf"^\s*{REASONING_OPEN}[\s\S]+?{REASONING_CLOSE}\s*{ANSWER_OPEN}[\s\S]+?{ANSWER_CLOSE}\s*$")
"""A whole completion in the format: one reasoning block, then one answer block, whitespace around them allowed."""
ANSWER_BLOCK = re.compile(rf"{ANSWER_OPEN}([\s\S]*?){ANSWER_CLOSE}")
REASONING_BLOCK = re.compile(rf"{REASONING_OPEN}([\s\S]*?){REASONING_CLOSE}")

WORD_PROBLEM_INSTRUCTION = (f"Solve the problem step by step inside {REASONING_OPEN}{REASONING_CLOSE}, then give only "
                            f"the final number inside {ANSWER_OPEN}{ANSWER_CLOSE}.")
"""The system prompt of the presets that train on word problems (generated or GSM8K)."""
YOUR_TASK_INSTRUCTION = (f"Think step by step inside {REASONING_OPEN}{REASONING_CLOSE}, then give only the final "
                         f"answer inside {ANSWER_OPEN}{ANSWER_CLOSE}.")
"""The instruction notebook 09 gives every question of a user's task (numbers, letters or text)."""


def format_completion(reasoning: str, answer: str) -> str:
    """The output format every reward checks: `<reasoning>…</reasoning><answer>…</answer>`."""
    return f"{REASONING_OPEN}{reasoning}{REASONING_CLOSE}{ANSWER_OPEN}{answer}{ANSWER_CLOSE}"


def extract_answer(text: str) -> str | None:
    """The content of the last `<answer>…</answer>` block, stripped; None when there is none."""
    found = ANSWER_BLOCK.findall(text)
    return found[-1].strip() if found else None



_NUMBER = re.compile(r"-?\d+(?:\.\d+)?")
_THOUSANDS = re.compile(r"(?<=\d),(?=\d{3}(?!\d))")


def _number_text(text: str) -> str | None:
    cleaned = _THOUSANDS.sub("", str(text).replace("$", "").replace("\u2212", "-"))  # 1,350 → 1350; "3, 4" stays two
    found = _NUMBER.findall(cleaned)
    return found[0] if len(found) == 1 else None


def parse_number(text: str) -> float | None:
    """The one number in an answer as GSM8K writes it and models answer it — thousands separators, a currency sign,
    a unit or a trailing period around it: "$1,350.00" → 1350.0, "18 dollars." → 18.0, "-7" → -7.0, "0.5 kg" → 0.5.
    None when there is no number or more than one ("3 or 4", "2/3")."""
    found = _number_text(text)
    return None if found is None else float(found)


def canonical_number(text: str) -> str | None:
    """`parse_number`'s number written as the `answer` column holds it, exactly (no float rounding): "1,350.00" →
    "1350", "$27.50" → "27.5", "-3" → "-3". None as for `parse_number`."""
    found = _number_text(text)
    if found is None:
        return None
    value = format(Decimal(found).normalize(), "f")
    return "0" if value == "-0" else value



_CHOICE_ALONE = re.compile(r"^\W*\(?([A-Ea-e])\)?\W*$")
_CHOICE_IN_PROSE = (re.compile(r"\b(?:answer|option|choice)\s*(?:is|:)?\s*\(?([A-Ea-e])\)?(?![\w])", re.I),
                    re.compile(r"\(([A-Ea-e])\)"), re.compile(r"(?<![\w])([A-E])(?:\)|\.|:)?(?![\w])"))
_ARTICLE = re.compile(r"^(?:the|a|an)\s+")
_EDGE_PUNCTUATION = "\"'`.,;:!?()[]{}<>"


def infer_answer_type(answer: str) -> str:
    """`choice` for a single letter A–E ("C", "(c)"), `number` for one number with nothing but a currency sign,
    thousands separators, a percent sign or a unit word around it ("1,350", "$27.50", "12 kg"), else `string`."""
    text = str(answer).strip()
    if _CHOICE_ALONE.match(text):
        return "choice"
    if parse_number(text) is not None and re.fullmatch(r"[$€£]?\s*-?[\d,]*\.?\d+\s*(?:%|[A-Za-z]+\.?)?", text):
        return "number"
    return "string"


def parse_choice(text: str) -> str | None:
    """The one choice letter an answer names, upper-case: "B", "(b)", "b)", "The answer is B.", "I pick (c)" → C.
    None when there is none, or when the answer names two different letters ("A or B")."""
    text = str(text).strip()
    if m := _CHOICE_ALONE.match(text):
        return m.group(1).upper()
    for pattern in _CHOICE_IN_PROSE:
        letters = {m.upper() for m in pattern.findall(text)}
        if len(letters) == 1:
            return letters.pop()
        if len(letters) > 1:
            return None
    return None


def normalize_text(text: str) -> str:
    """A free-text answer as compared: lower-case, runs of whitespace as one space, punctuation and quotes stripped
    from both ends, a leading article dropped ("  The Eiffel Tower. " → "eiffel tower")."""
    text = " ".join(str(text).casefold().split()).strip(_EDGE_PUNCTUATION + " ")
    return _ARTICLE.sub("", text)


def answer_matches(predicted: str | None, truth: str, answer_type: str = "auto", *, abs_tol: float = 1e-6,
                   rel_tol: float = 0.0, function: Callable[[str, str], bool] | None = None) -> bool:
    """Whether `predicted` (the model's answer text, None when it gave none) is right for `truth` under
    `answer_type` (see the module docstring; `auto` infers it from `truth`). Numbers match when
    |x − y| ≤ max(abs_tol, rel_tol·|y|)."""
    if predicted is None:
        return False
    kind = infer_answer_type(truth) if answer_type == "auto" else answer_type
    if kind == "number":
        x, y = parse_number(predicted), parse_number(truth)
        return x is not None and y is not None and abs(x - y) <= max(abs_tol, rel_tol * abs(y))
    if kind == "choice":
        return parse_choice(predicted) == parse_choice(truth) is not None
    if kind == "string":
        return normalize_text(predicted) == normalize_text(truth)
    if kind == "regex":
        return re.fullmatch(truth, predicted.strip(), flags=re.I) is not None
    if kind == "math":
        return math_matches(predicted, truth, abs_tol=abs_tol, rel_tol=rel_tol)
    if kind == "function":
        if function is None:
            raise ValueError("answer_type 'function' needs a function f(predicted, truth) -> bool")
        return bool(function(predicted, truth))
    raise ValueError(f"answer_type {answer_type!r}: one of {', '.join(ANSWER_TYPES)}")


def _math_parse(text: str) -> list:
    """math-verify's reading of an answer; a bare LaTeX or algebra answer (a backslash, ^, _ or braces, no $) is read
    as inline math. No timeout: math-verify's works by signals, which a reward in the kit's worker thread cannot use
    (the reward's own timeout, GRPOConfig.reward_timeout_seconds, still holds); its warning about that is dropped."""
    from math_verify import parse

    _quiet_math_verify()
    if "$" not in text and re.search(r"[\\^_{}]", text):
        text = f"${text}$"
    return parse(text, parsing_timeout=None)


def _quiet_math_verify() -> None:
    for name in ("math_verify.parser", "math_verify.grader"):
        logger = logging.getLogger(name)
        if not any(isinstance(f, _NoTimeoutNotice) for f in logger.filters):
            logger.addFilter(_NoTimeoutNotice())


class _NoTimeoutNotice(logging.Filter):
    def filter(self, record: logging.LogRecord) -> bool:
        return not str(record.msg).startswith("Timeout is disabled")


def math_matches(predicted: str, truth: str, *, abs_tol: float = 1e-6, rel_tol: float = 0.0) -> bool:
    """Whether a mathematical answer equals the right one (answer type `math`): both read by math-verify; two numbers
    within max(abs_tol, rel_tol·|truth|), anything else by math-verify's symbolic `verify`."""
    try:
        from math_verify import verify
    except ImportError:
        raise ValueError("answer_type 'math' needs math-verify: pip install 'grpo-kit[math]'") from None
    gold, answer = _math_parse(str(truth)), _math_parse(str(predicted))
    if not gold or not answer:
        return False
    x, y = _as_number(answer[0]), _as_number(gold[0])
    if x is not None and y is not None:
        return abs(x - y) <= max(abs_tol, rel_tol * abs(y))
    return bool(verify(gold, answer, timeout_seconds=None))


def _as_number(value: object) -> float | None:
    """A math-verify reading as a float when it is a plain real number (sympy's is_number), else None."""
    if getattr(value, "is_number", False) and getattr(value, "is_real", False):
        return float(value)  # type: ignore[arg-type]
    return None
