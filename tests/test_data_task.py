"""Tasks from a user's own file: formats, column mapping, answer types per row, the frozen split, refusals."""

import json

import pytest

from grpo_kit.data.rewards import correctness_reward
from grpo_kit.data.tasks import check_no_overlap, load_task
from grpo_kit.eval.evaluation import evaluate
from grpo_kit.validation import DataError


def _rows(n=30):
    rows = []
    for i in range(n):
        if i % 3 == 0:
            rows.append({"q": f"What is {i} + {i}?", "a": str(2 * i), "why": f"{i} + {i} = {2 * i}."})
        elif i % 3 == 1:
            rows.append({"q": f"Which is larger? (A) {i} (B) {i + 5}", "a": "B", "why": ""})
        else:
            rows.append({"q": f"Spell the number {i} backwards.", "a": str(i)[::-1] + " (reversed)", "why": None})
    return rows


def _jsonl(path, rows):
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def test_a_jsonl_file_gives_a_frozen_split_typed_answers_and_sft_rows(tmp_path):
    path = _jsonl(tmp_path / "mine.jsonl", _rows())
    task = load_task(path, columns={"prompt": "q", "answer": "a", "solution": "why"}, num_test=10, seed=7)
    test, demos = task.test_set(), task.demonstrations()
    assert len(test) == 10 and set(test.column_names) == {"prompt", "answer", "answer_type"}
    assert test[0]["prompt"][-1]["role"] == "user"
    types = {r["answer"]: r["answer_type"] for r in list(test) + list(demos)}
    assert {"number", "choice", "string"} >= set(types.values()) and types.get("B", "choice") == "choice"
    assert all(r["completion"].startswith("<reasoning>") and r["completion"].endswith(f"<answer>{r['answer']}</answer>")
               for r in demos)
    assert len(demos) == sum(1 for r in _rows() if r["why"]) - sum(1 for r in test if r["answer_type"] == "number")
    again = load_task(path, columns={"prompt": "q", "answer": "a", "solution": "why"}, num_test=10, seed=7)
    assert again.split_hash == task.split_hash and list(again.test_set()) == list(test)
    assert load_task(path, columns={"prompt": "q", "answer": "a"}, num_test=10, seed=8).split_hash != task.split_hash
    held = {r["prompt"][-1]["content"] for r in test}
    stream = task.prompt_stream()
    drawn = [next(stream) for _ in range(60)]
    assert (
        not held & {r["prompt"][-1]["content"] for r in drawn}
        and len({r["prompt"][-1]["content"] for r in drawn}) == 20
    )
    with pytest.raises(DataError, match="row 0 is a held-out question"):
        check_no_overlap([test[0]["prompt"]] + [r["prompt"] for r in drawn], test)
    check_no_overlap([r["prompt"] for r in drawn], test)


def test_csv_and_parquet_read_the_same_and_a_row_may_set_its_type(tmp_path):
    import pandas as pd

    rows = [{"question": f"Name colour {i}", "answer": "colou?r", "answer_type": "regex"} for i in range(5)]
    rows += [{"question": f"{i} * 2?", "answer": str(2 * i), "answer_type": None} for i in range(5)]
    frame = pd.DataFrame(rows)
    frame.to_csv(tmp_path / "t.csv", index=False)
    frame.to_parquet(tmp_path / "t.parquet")
    a = load_task(tmp_path / "t.csv", columns={"prompt": "question"}, num_test=3, system_prompt="Answer briefly.")
    b = load_task(tmp_path / "t.parquet", columns={"prompt": "question"}, num_test=3)
    assert a.split_hash == b.split_hash  # the same rows, whatever instruction they get
    rows_a = list(a.test_set()) + [next(a.prompt_stream()) for _ in range(7)]
    assert {r["answer_type"] for r in rows_a} == {"regex", "number"}
    assert rows_a[0]["prompt"][0] == {"role": "system", "content": "Answer briefly."}


def test_the_correctness_reward_and_evaluation_use_each_rows_type(tmp_path):
    assert correctness_reward(
        [None] * 4,
        ["<answer>The answer is b</answer>", "<answer>1,350</answer>", "<answer> the Nile. </answer>", "no tags"],
        answer=["B", "1350", "Nile", "4"], answer_type=["choice", "number", "string", "number"]) == [1, 1, 1, 0]
    assert correctness_reward([None], ["<answer>3.0</answer>"], answer=["3"]) == [1.0]  # no type column: inferred

    class Echo:  # a "model" whose completions are scripted through generate_completions
        pass

    path = _jsonl(tmp_path / "mine.jsonl", _rows())
    task = load_task(path, columns={"prompt": "q", "answer": "a"}, num_test=6)
    import grpo_kit.eval.evaluation as evaluation

    truth = {r["prompt"][-1]["content"]: r["answer"] for r in task.test_set()}
    original = evaluation.generate_completions
    evaluation.generate_completions = lambda model, tok, prompts, **kw: [
        f"<reasoning>x</reasoning><answer>{truth[p[-1]['content']].upper()}.</answer>" for p in prompts]
    try:
        result = evaluate(Echo(), None, task.test_set())
    finally:
        evaluation.generate_completions = original
    assert result["accuracy"] == 1.0  # "B." for B, "12." for 12, upper-cased text for text: each under its type


ONE_TEST_ROW = {"columns": {"prompt": "q", "answer": "a"}, "num_test": 1}


@pytest.mark.parametrize(("rows", "kwargs", "message"), [
    ([{"q": "x", "a": "1"}] * 5, {}, "no column 'prompt' for the prompt (columns: a, q); pass columns={'prompt': "),
    ([{"q": "x", "a": "1"}] * 5, {"columns": {"prompt": "q", "answer": "a", "solution": "s"}},
     "no column 's' for the solution"),
    ([{"q": "x", "a": "1"}] * 5, {"columns": {"question": "q"}}, "columns: 'question' is not a role; the roles are "
     "prompt, answer, solution, system"),
    ([{"q": "x", "a": "1"}] * 4 + [{"q": "", "a": "1"}], ONE_TEST_ROW, "row 4, column 'q': is empty"),
    ([{"q": "x", "a": "1"}] * 3 + [{"q": "y", "a": " "}], ONE_TEST_ROW,
     "row 3, column 'a': needs the right final answer"),
    ([{"q": "x", "a": "1", "answer_type": "fuzzy"}] * 3, ONE_TEST_ROW, "row 0, column 'answer_type': 'fuzzy'"),
    ([{"q": "x", "a": "1"}] * 3, {"columns": {"prompt": "q", "answer": "a"}, "num_test": 3}, "3 rows, but num_test=3"),
    ([{"q": "x", "a": "1"}] * 3, {**ONE_TEST_ROW, "answer_type": "fuzzy"}, "answer_type='fuzzy'"),
])
def test_bad_data_is_refused_in_one_line_naming_row_and_column(tmp_path, rows, kwargs, message):
    path = _jsonl(tmp_path / "bad.jsonl", rows)
    with pytest.raises(DataError) as caught:
        load_task(path, **kwargs)
    assert message in str(caught.value) and "\n" not in str(caught.value) and str(caught.value).startswith(str(path))


def test_a_task_without_solutions_says_so_when_asked_for_sft_rows(tmp_path):
    task = load_task(
        _jsonl(tmp_path / "qa.jsonl", [{"prompt": f"q{i}", "answer": str(i)} for i in range(10)]), num_test=2
    )
    with pytest.raises(DataError, match="no training row has a worked solution"):
        task.demonstrations()
    with pytest.raises(FileNotFoundError, match="missing.jsonl: no such file"):
        load_task(tmp_path / "missing.jsonl")
    (tmp_path / "notes.txt").write_text("hello")
    with pytest.raises(DataError, match="cannot read a .txt file; use one of .jsonl, .json, .csv, .parquet"):
        load_task(tmp_path / "notes.txt")


def test_a_task_config_of_kind_file_reads_the_file_with_its_column_names(tmp_path):
    from grpo_kit.data.tasks import make_task
    from grpo_kit.train.config import TaskConfig
    from grpo_kit.validation import ConfigError

    path = _jsonl(tmp_path / "mine.jsonl", _rows())
    task = make_task(
        TaskConfig(kind="file", source=str(path), prompt_column="q", answer_column="a", solution_column="why",
                   num_test=10, seed=7)
    )
    again = load_task(path, columns={"prompt": "q", "answer": "a", "solution": "why"}, num_test=10, seed=7)
    assert task.split_hash == again.split_hash
    with pytest.raises(FileNotFoundError, match="TaskConfig.source='nowhere.jsonl': no such file"):
        make_task(TaskConfig(kind="file", source="nowhere.jsonl"))
    with pytest.raises(ConfigError, match="TaskConfig.answer_type='fuzzy': must be one of auto, number"):
        TaskConfig(kind="file", answer_type="fuzzy")


def test_a_question_asked_twice_across_the_split_is_refused(tmp_path):
    rows = [{"prompt": f"q{i}", "answer": str(i)} for i in range(20)] + [{"prompt": "  Q3 ", "answer": "3"}]
    with pytest.raises(DataError, match=r"rows \d+ and \d+ ask the same question, and one of them is held out"):
        load_task(_jsonl(tmp_path / "dup.jsonl", rows), num_test=10, seed=0)


def test_the_trainers_refuse_a_held_out_row_handed_to_them_directly(tmp_path, tiny):
    """Rows a data task holds out never train: SFT's dataset, GRPO's sized prompts and GRPO's stream each stop with
    one line naming the row and the split; the training rows pass; loading the file again with another split
    replaces the first one's held-out rows."""
    from grpo_kit.train.config import GRPOConfig, SFTConfig
    from grpo_kit.train.grpo import GRPOTrainer
    from grpo_kit.train.sft import SFTTrainer

    model, tokenizer = tiny
    path = _jsonl(tmp_path / "mine.jsonl", _rows())
    seed_8 = load_task(path, columns={"prompt": "q", "answer": "a"}, num_test=10, seed=8)
    other_split = [r["prompt"] for r in seed_8.test_set()]
    task = load_task(path, columns={"prompt": "q", "answer": "a", "solution": "why"}, num_test=10, seed=7)
    leaked = next(r for r in task.test_set() if r["prompt"] not in other_split)  # held out by seed 7, not by seed 8
    demos = list(task.demonstrations())
    sft = SFTConfig(steps=1, batch_size=2)
    SFTTrainer(model, tokenizer, demos, sft)  # the training rows pass
    with pytest.raises(
        DataError, match=r"the SFT dataset row 2 is a held-out question of .*mine.jsonl \(seed 7, num_test 10\)"
    ):
        SFTTrainer(model, tokenizer, [*demos[:2], {**leaked, "completion": "<answer>x</answer>"}], sft)
    train = [next(task.prompt_stream()) for _ in range(1)]
    grpo = GRPOConfig(steps=1)
    GRPOTrainer(model, tokenizer, [correctness_reward], train, grpo)
    with pytest.raises(DataError, match="the GRPO prompts row 1 is a held-out question"):
        GRPOTrainer(model, tokenizer, [correctness_reward], [*train, leaked], grpo)
    stream = GRPOTrainer(model, tokenizer, [correctness_reward], iter([*train, leaked]), grpo).prompts
    next(stream)
    with pytest.raises(DataError, match="the GRPO prompt stream row 1 is a held-out question"):
        next(stream)
    load_task(path, columns={"prompt": "q", "answer": "a"}, num_test=10, seed=8)  # the file's split is seed 8's again
    GRPOTrainer(model, tokenizer, [correctness_reward], [*train, leaked], grpo)
