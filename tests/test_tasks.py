import json
from pathlib import Path

import pytest

from grpo_kit.rewards import correctness_reward, strict_format_reward
from grpo_kit.tasks import ArithmeticTask, addition_reasoning, load_gsm8k

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
