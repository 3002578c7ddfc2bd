import json
import re
from fractions import Fraction
from pathlib import Path

import pytest

from grpo_kit.data.rewards import correctness_reward, strict_format_reward
from grpo_kit.data.tasks import ArithmeticTask, addition_reasoning, load_gsm8k

DATA = Path(__file__).resolve().parent.parent / "data"


def test_addition_reasoning_with_carries():
    assert addition_reasoning(47, 38) == "7+8=15, 4+3+1=8"
    assert addition_reasoning(67, 58) == "7+8=15, 6+5+1=12"
    assert addition_reasoning(10, 20) == "0+0=0, 1+2=3"


def test_splits_are_seeded_and_disjoint():
    task = ArithmeticTask(seed=7, num_demonstrations=50, num_test=40)
    demos, test = task.demonstrations(), task.test_set()
    assert len(demos) == 50 and len(test) == 40
    assert demos[0] == ArithmeticTask(seed=7, num_demonstrations=50, num_test=40).demonstrations()[0]
    key = lambda row: row["completion"].split("<answer>")[0]  # noqa: E731 - reasoning identifies the operands
    stream = [next(iter_) for iter_ in [task.prompt_stream()] for _ in range(500)]
    test_keys = {(r["prompt"][0]["content"], r["answer"]) for r in test}
    assert not test_keys & {(r["prompt"][0]["content"], r["answer"]) for r in stream}
    assert not {key(r) for r in test} & {key(r) for r in demos}


def test_demonstrations_earn_full_reward():
    demos = ArithmeticTask(num_demonstrations=30, num_test=10).demonstrations()
    comps = list(demos["completion"])
    assert strict_format_reward(None, comps) == [1.0] * 30
    assert correctness_reward(None, comps, answer=list(demos["answer"])) == [1.0] * 30


def test_system_prompt_and_bad_ranges():
    task = ArithmeticTask(num_demonstrations=5, num_test=5, system_prompt="Think first.")
    assert task.demonstrations()[0]["prompt"][0] == {"role": "system", "content": "Think first."}
    with pytest.raises(ValueError, match="no prompts for GRPO"):
        ArithmeticTask(min_value=1, max_value=5, num_demonstrations=20, num_test=10)


def test_gsm8k_loader_on_rows_in_the_repo():
    ds = load_gsm8k(DATA / "gsm8k_sample.jsonl")
    rows = [json.loads(line) for line in (DATA / "gsm8k_sample.jsonl").read_text().splitlines()]
    assert len(ds) == len(rows) >= 3
    first = ds[0]
    assert first["prompt"] == [{"role": "user", "content": rows[0]["question"]}]
    assert first["answer"] == rows[0]["answer"].split("####")[-1].strip().replace(",", "")
    assert "<<" not in first["completion"] and first["completion"].endswith(f"<answer>{first['answer']}</answer>")
    assert correctness_reward(None, list(ds["completion"]), answer=list(ds["answer"])) == [1.0] * len(ds)
    with pytest.raises(ValueError, match="row 1: answer does not end"):
        load_gsm8k([rows[0], {"question": "q", "answer": "no final"}])
    with pytest.raises(ValueError, match="row 0: missing column 'answer'"):
        load_gsm8k([{"question": "q"}])


def test_a_gsm8k_problem_is_levelled_by_its_solution_steps_so_difficulty_targeting_can_draw_on_it():
    from grpo_kit.algo.difficulty import DifficultyTargeting
    from grpo_kit.data.tasks import gsm8k_level, make_task
    from grpo_kit.train.config import PRESETS, TaskConfig, load_run_config

    ds = load_gsm8k(DATA / "gsm8k_sample.jsonl")
    rows = [json.loads(line) for line in (DATA / "gsm8k_sample.jsonl").read_text().splitlines()]
    assert list(ds["level"]) == [f"{max(r['answer'].count('<<'), 1)} steps" for r in rows]
    assert gsm8k_level("2 + 3 = <<2+3=5>>5 and 5 * 4 = <<5*4=20>>20\n") == "2 steps"
    assert gsm8k_level("She has 2 + 3 = 5.\nThen 5 * 4 = 20.\n\n") == "2 steps"  # no annotations: its lines
    task = make_task(TaskConfig(kind="gsm8k", source=str(DATA / "gsm8k_sample.jsonl"), num_test=3,
                                num_demonstrations=2))
    targeting, stream = DifficultyTargeting(seed=0), task.prompt_stream()
    targeting.record([targeting.level(next(stream)) for _ in range(4)], [1.0, 0.0, 1.0, 0.0])
    assert targeting.next_prompt(stream)["level"].endswith(" steps") and targeting.pass_rates()
    for name in (n for n in PRESETS if "gemma" in n):  # every real-Gemma preset, GSM8K's too, runs the recipe
        grpo = load_run_config(name).grpo
        assert (grpo.gate_shaped_rewards, grpo.difficulty_targeting, grpo.skip_zero_advantage_groups) == (
            True, True, True), name


@pytest.mark.parametrize(("text", "number", "canonical"), [
    ("72", 72.0, "72"), ("1,350", 1350.0, "1350"), ("$1,350.00", 1350.0, "1350"), ("1,562,500", 1562500.0, "1562500"),
    ("18 dollars.", 18.0, "18"), ("$27.50", 27.5, "27.5"), ("0.5 kg", 0.5, "0.5"), ("-3", -3.0, "-3"),
    ("\u22124 degrees", -4.0, "-4"), ("-0", 0.0, "0"), ("100", 100.0, "100"), ("The answer is 42.", 42.0, "42"),
    ("3 or 4", None, None), ("2/3", None, None), ("3, 4", None, None), ("none", None, None), ("", None, None),
])
def test_answer_numbers_as_gsm8k_writes_them_and_models_answer_them(text, number, canonical):
    from grpo_kit.data.answer_format import canonical_number, parse_number

    assert parse_number(text) == number and canonical_number(text) == canonical


def test_gsm8k_final_answers_are_normalised_and_scored_numerically():
    """Real GSM8K rows and GSM8K-format rows with thousands separators, a currency sign, decimals and a negative
    answer: the answer column is the plain number, and a completion that writes it GSM8K's way still scores."""
    ds = load_gsm8k(DATA / "gsm8k_sample.jsonl")

    def row(start: str) -> dict:
        return next(r for r in ds if r["prompt"][-1]["content"].startswith(start))

    assert row("Natalia sold clips")["answer"] == "72"  # the first two rows of GSM8K's train split
    assert row("Weng earns $12")["answer"] == "10" and "<<" not in row("Weng earns $12")["completion"]
    assert row("The temperature was")["answer"] == "-3"
    assert row("A town spends $1,250,000")["answer"] == "1562500"
    assert row("A recipe needs 0.75")["answer"] == "1.5"
    written = ["<reasoning>…</reasoning><answer>$1,562,500</answer>",
               "<reasoning>…</reasoning><answer>1.50 cups.</answer>",
               "<reasoning>…</reasoning><answer>-3 degrees</answer>", "<reasoning>…</reasoning><answer>3</answer>"]
    assert correctness_reward(None, written, answer=["1562500", "1.5", "-3", "-3"]) == [1.0, 1.0, 1.0, 0.0]
    with pytest.raises(ValueError, match="row 0: the final answer '3 or 4' is not one number"):
        load_gsm8k([{"question": "q", "answer": "work\n#### 3 or 4"}])


def _solve_independently(question: str) -> tuple[Fraction, int]:
    """The answer of a generated word problem from its question text alone: the template whose wording it has, its
    numbers in order of appearance as the slots, the formula evaluated by Python on fractions."""
    from grpo_kit.data.tasks import WORD_PROBLEMS

    for template in WORD_PROBLEMS:
        pattern = re.escape(template.question).replace(re.escape("{name}"), r"\w+")
        for slot in template.slots:
            pattern = pattern.replace(re.escape("{" + slot + "}"), r"(\d+)")
        match = re.fullmatch(pattern, question)
        if match:
            values = {slot: Fraction(int(v)) for slot, v in zip(template.slots, match.groups(), strict=True)}
            return eval(template.formula, {"__builtins__": {}}, values), len(template.steps)  # noqa: S307
    raise AssertionError(f"no template reads {question!r}")


def test_generated_word_problems_are_right_by_an_independent_check():
    """Every generated problem (all three difficulties): the answer solved again from the question alone, every
    equation of the worked solution true, one equation per operation, and the demonstration in the course format."""
    from grpo_kit.data.tasks import WordProblemTask

    task = WordProblemTask(seed=3, num_demonstrations=150, num_test=150)
    stream = task.prompt_stream()
    rows = list(task.test_set()) + list(task.demonstrations()) + [next(stream) for _ in range(150)]
    seen_ops = set()
    for row in rows:
        answer, operations = _solve_independently(row["prompt"][-1]["content"])
        assert answer.denominator == 1 and answer > 0 and row["answer"] == str(answer.numerator), row
        equations = re.findall(r"(\d+) ([-+*/]) (\d+) = (\d+)", row["completion"])
        assert len(equations) == operations == row["operations"], row["completion"]
        for x, op, y, z in equations:
            assert eval(f"Fraction({x}) {op} "
                        f"Fraction({y})", {"Fraction": Fraction}) == int(z), row["completion"]  # noqa: S307
        seen_ops.add(operations)
    assert seen_ops == {2, 3, 4}
    assert strict_format_reward(None, [r["completion"] for r in rows]) == [1.0] * len(rows)
    assert correctness_reward(None, [r["completion"] for r in rows], answer=[r["answer"] for r in rows]) == [1.0] * len(
        rows)


def test_word_problem_splits_are_seeded_disjoint_and_by_difficulty():
    from grpo_kit.data.tasks import WordProblemTask

    def questions(rows) -> list[str]:  # noqa: ANN001
        return [r["prompt"][-1]["content"] for r in rows]

    task, again = (WordProblemTask(seed=5, num_demonstrations=80, num_test=60),
                   WordProblemTask(seed=5, num_demonstrations=80, num_test=60))
    test, demos = questions(task.test_set()), questions(task.demonstrations())
    assert test == questions(again.test_set()) and demos == questions(again.demonstrations())
    assert len(set(test)) == 60 and len(set(demos)) == 80 and not set(test) & set(demos)
    stream = task.prompt_stream(seed=1)
    assert not set(questions(next(stream) for _ in range(300))) & (set(test) | set(demos))
    hard = WordProblemTask(seed=5, num_demonstrations=10, num_test=10, operations=(4,))
    assert {r["operations"] for r in hard.test_set()} == {4}
    with pytest.raises(ValueError, match=r"operations=\(7,\): no template has that many steps \(have \[2, 3, 4\]\)"):
        WordProblemTask(operations=(7,))


def test_a_gsm8k_file_splits_into_held_out_demonstrations_and_prompts_the_same_way_every_time():
    from grpo_kit.data.tasks import GSM8KTask, make_task
    from grpo_kit.train.config import TaskConfig

    rows = [json.loads(line) for line in (DATA / "gsm8k_sample.jsonl").read_text().splitlines()]
    task = make_task(
        TaskConfig(kind="gsm8k", source=str(DATA / "gsm8k_sample.jsonl"), num_test=3, num_demonstrations=2))
    assert isinstance(task, GSM8KTask)
    test, demos = task.test_set(), task.demonstrations()
    assert [r["prompt"][-1]["content"] for r in test] == [
        r["question"].strip() for r in rows[:3]]  # the file's first rows
    assert [r["prompt"][-1]["content"] for r in demos] == [r["question"].strip() for r in rows[3:5]]
    stream = task.prompt_stream()
    seen = [next(stream)["prompt"][-1]["content"] for _ in range(3 * (len(rows) - 5))]
    assert sorted(set(seen)) == sorted(r["question"].strip() for r in rows[5:])  # the rest, every pass
    again = make_task(
        TaskConfig(kind="gsm8k", source=str(DATA / "gsm8k_sample.jsonl"), num_test=3, num_demonstrations=2))
    assert [row["prompt"][-1]["content"] for row, _ in zip(again.prompt_stream(), seen, strict=False)] == seen  # seeded
    assert test[0]["answer"] == canonical_of(rows[0]) and "<<" not in demos[0]["completion"]
    with pytest.raises(ValueError, match="too few"):
        GSM8KTask(DATA / "gsm8k_sample.jsonl", num_test=5, num_demonstrations=len(rows))


def canonical_of(row: dict) -> str:
    from grpo_kit.data.answer_format import canonical_number

    return canonical_number(row["answer"].split("####")[-1])


def test_task_settings_name_the_kind_and_the_difficulty():
    from grpo_kit.data.tasks import WordProblemTask, make_task
    from grpo_kit.train.config import TaskConfig
    from grpo_kit.validation import ConfigError

    task = make_task(TaskConfig(kind="word_problems", operations=[2], num_test=5, num_demonstrations=5))
    assert isinstance(task, WordProblemTask) and set(task.test_set()["operations"]) == {2}
    with pytest.raises(
        ConfigError, match=r"TaskConfig.kind='algebra': must be one of arithmetic, word_problems, gsm8k"
    ):
        TaskConfig(kind="algebra")
    with pytest.raises(ConfigError, match=r"TaskConfig.operations=\(5,\): must be a non-empty list of 2, 3 or 4"):
        TaskConfig(operations=[5])
    with pytest.raises(ConfigError, match=r"TaskConfig.operations\[0\]='two': expected a whole number"):
        TaskConfig(operations=["two"])
