import math

import pytest
import torch
from transformers import Gemma3TextConfig

from grpo_kit import rewards as R

GOOD = "<reasoning>7+8=15, 4+3+1=8</reasoning><answer>85</answer>"


def test_format_rewards():
    comps = [GOOD, "  <reasoning>x</reasoning>\n<answer>1</answer>\n", "<reasoning>x</reasoning>", "85", GOOD + GOOD]
    assert R.strict_format_reward(None, comps) == [1.0, 1.0, 0.0, 0.0, 0.0]
    assert R.soft_format_reward(None, comps) == [1.0, 1.0, 0.5, 0.0, 0.0]
    # TRL's chat-message form is accepted too
    assert R.strict_format_reward(None, [[{"role": "assistant", "content": GOOD}]]) == [1.0]


def test_correctness_exact_and_numeric():
    comps = [GOOD, "<answer>85.0</answer>", "<answer> 85 </answer>", "<answer>84</answer>", "no answer"]
    assert R.correctness_reward(None, comps, answer=["85"] * 5) == [1.0, 1.0, 1.0, 0.0, 0.0]
    half = R.make_correctness_reward(numeric_credit=0.5, rel_tol=0.02, name="lenient")
    assert half(None, ["<answer>85.0</answer>", "<answer>86</answer>", "<answer>90</answer>"], answer=["85"] * 3) == [
        0.5, 0.5, 0.0]
    assert half.__name__ == "lenient"
    with pytest.raises(ValueError, match="answer"):
        R.correctness_reward(None, [GOOD])


def test_answer_digits_reward_gives_partial_credit_from_the_right():
    def c(ans: str) -> str:
        return f"<reasoning>x</reasoning><answer>{ans}</answer>"

    got = R.answer_digits_reward(None, [c("85"), c("84"), c("75"), c("185"), c("5"), "no answer", c("8.5")],
                                 answer=["85"] * 7)
    assert got == [1.0, 0.5, 0.5, pytest.approx(2 / 3), 0.5, 0.0, 0.0]
    assert R.answer_digits_reward(None, [c("x")], answer=["x"]) == [1.0]  # non-integers: exact match
    with pytest.raises(ValueError, match="answer_digits_reward needs the dataset column 'answer'"):
        R.answer_digits_reward(None, [c("1")])


def test_arithmetic_steps_reward():
    comps = [GOOD, "<reasoning>6+0=7, 1+8=9</reasoning>", "<reasoning>no steps</reasoning>", "7+8=15",
             "<reasoning>2*3+4=10, 9-4=5</reasoning>"]
    assert R.arithmetic_steps_reward(None, comps) == [1.0, 0.5, 0.0, 0.0, 1.0]


def test_length_penalty_dapo_shape():
    pen = R.make_length_penalty(max_tokens=10, buffer=4, penalty=1.0)
    ids = [[0] * n for n in (5, 6, 8, 10, 12)]
    assert pen(None, ["x"] * 5, completion_ids=ids) == [0.0, 0.0, -0.5, -1.0, -1.0]
    assert pen(None, ["abcdefgh"]) == [-0.5]  # characters without completion_ids
    with pytest.raises(ValueError, match="buffer"):
        R.make_length_penalty(4, 8)


def test_compute_rewards_weights_and_none():
    def sometimes(prompts, completions, **_):
        return [None if "skip" in c else 1.0 for c in completions]

    res = R.compute_rewards([R.strict_format_reward, sometimes], ["p"] * 2, [GOOD, "skip"],
                            weights={"strict_format_reward": 2.0, "sometimes": 0.5})
    assert res.names == ["strict_format_reward", "sometimes"]
    assert math.isnan(res.per_function[1, 1].item())
    assert res.total.tolist() == [2.5, 0.0]


def test_reward_errors_name_the_reward_and_completion():
    def broken(prompts, completions, **_):
        return [1 / 0 if c == "bad" else 1.0 for c in completions]

    def nan_reward(prompts, completions, **_):
        return [float("nan") if c == "bad" else 0.0 for c in completions]

    with pytest.raises(R.RewardError, match=r"'broken' raised ZeroDivisionError.*completion 1: 'bad'"):
        R.compute_rewards([broken], ["p", "p"], ["ok", "bad"])
    with pytest.raises(R.RewardError, match=r"'nan_reward' returned nan for completion 1"):
        R.compute_rewards([nan_reward], ["p", "p"], ["ok", "bad"])
    res = R.compute_rewards([broken, nan_reward], ["p", "p"], ["ok", "bad"], on_error="zero")
    assert res.failures == {"broken": 1, "nan_reward": 1}
    assert res.total.tolist() == [1.0, 0.0]  # the good completion keeps its score
    with pytest.raises(R.RewardError, match="returned 1 scores for 2"):
        R.compute_rewards([lambda prompts, completions, **_: [1.0]], ["p", "p"], ["a", "b"])
    with pytest.raises(ValueError, match="unknown rewards"):
        R.compute_rewards([R.strict_format_reward], ["p"], ["a"], weights={"typo": 1.0})


def test_classifier_reward_with_a_tiny_classifier(tiny):
    from transformers import AutoModelForSequenceClassification

    _, tokenizer = tiny
    cfg = Gemma3TextConfig(vocab_size=len(tokenizer), hidden_size=32, intermediate_size=64, num_hidden_layers=1,
                           num_attention_heads=2, num_key_value_heads=1, head_dim=16, num_labels=2, pad_token_id=0,
                           layer_types=["full_attention"])
    torch.manual_seed(0)
    clf = AutoModelForSequenceClassification.from_config(cfg)
    reward = R.ClassifierReward(clf, tokenizer, label=1, name="judge")
    scores = reward(["p", "p", "p"], [GOOD, "hello", "<answer>1</answer>"])
    assert reward.__name__ == "judge" and len(scores) == 3
    assert all(0.0 <= s <= 1.0 for s in scores) and len(set(scores)) > 1
    # the scores are the classifier's own softmax probabilities of label 1
    enc = tokenizer(["hello"], return_tensors="pt")
    with torch.no_grad():
        expected = clf(**enc).logits.softmax(-1)[0, 1].item()
    assert scores[1] == pytest.approx(expected, abs=1e-5)
    res = R.compute_rewards([reward, R.strict_format_reward], ["p"] * 2, [GOOD, "x"])
    assert res.names == ["judge", "strict_format_reward"]


def test_a_reward_that_hangs_stops_the_run_naming_it():
    """No wall clock: the stuck reward waits on an event the test sets only after compute_rewards has given up."""
    import threading

    release = threading.Event()

    def stuck_reward(prompts, completions, **_):
        assert release.wait(60), "the test never released the reward"  # a server that never answers
        return [1.0] * len(completions)

    for on_error in ("raise", "zero"):
        with pytest.raises(R.RewardError, match=r"reward 'stuck_reward' did not return within 0.2 s on a batch of 2"):
            R.compute_rewards(
                [R.strict_format_reward, stuck_reward], ["p", "p"], [GOOD, "x"], on_error=on_error, timeout=0.2
            )
        assert not release.is_set()  # it returned while the reward was still stuck
    release.set()
    assert R.compute_rewards([stuck_reward], ["p"], ["x"], timeout=5.0).total.tolist() == [1.0]


@pytest.mark.parametrize("on_error", ["raise", "zero"])
def test_a_reward_that_raises_on_the_batch_then_hangs_on_a_row_stops_the_run_naming_it(on_error):
    """The row-by-row retry after a failed batch goes through the same timeout: a reward that raises on the batch
    and then blocks on a row (a flaky server) stops the run instead of hanging it."""
    import threading

    release, calls = threading.Event(), []

    def flaky_reward(prompts, completions, **_):
        calls.append(len(completions))
        if len(completions) > 1:
            raise ConnectionError("the judge server dropped the batch")
        assert release.wait(60), "the test never released the reward"
        return [1.0]

    with pytest.raises(R.RewardError, match=r"reward 'flaky_reward' did not return within 0.2 s on a batch of 1"):
        R.compute_rewards([flaky_reward], ["p", "p"], [GOOD, "x"], on_error=on_error, timeout=0.2)
    assert calls == [2, 1] and not release.is_set()
    release.set()


def test_test_reward_prints_a_table_and_flags_the_cases_that_disagree(capsys):
    from grpo_kit.data.rewards import correctness_reward
    from grpo_kit.data.rewards import test_reward as check_reward

    def broken(prompts, completions, answer=None, **_):
        raise KeyError("answer")

    cases = [{"completion": "<answer>42</answer>", "answer": "42", "expected": 1.0},
             {"completion": "<answer>41</answer>", "answer": "42", "expected": 1.0},  # the reward disagrees
             {"completion": "no tags at all", "answer": "42", "expected": 0.0}]
    rows = check_reward(correctness_reward, cases)
    assert [r["ok"] for r in rows] == [True, False, True] and rows[1]["score"] == 0.0
    out = capsys.readouterr().out
    assert "2 of 3 cases as expected" in out and "✗" in out.splitlines()[2] and "<answer>41</answer>" in out
    failing = check_reward(broken, cases[:1], show=False)
    assert failing[0]["ok"] is False and failing[0]["score"].startswith("KeyError")


def test_a_judge_reward_is_a_probability_per_completion_from_the_judges_yes_and_no(cpu):
    from grpo_kit.data.rewards import judge_reward
    from grpo_kit.engine.model_config import ModelConfig
    from grpo_kit.engine.models import load_model

    judge_model, tok = load_model(ModelConfig(), cpu)
    judge = judge_reward(judge_model, tok, "The answer names a colour.", batch_size=2)
    prompts = [[{"role": "user", "content": "What colour is the sky?"}]] * 3
    completions = ["<reasoning>look up</reasoning><answer>blue</answer>", "<answer>seven</answer>", "blue, of course"]
    scores = judge(prompts, completions)
    assert len(scores) == 3 and all(0.0 < s < 1.0 for s in scores)
    assert judge(prompts[:1], completions[:1]) == pytest.approx(scores[:1], abs=1e-5)  # batching changes nothing
    assert "Answer: blue\n" in judge.prompt(
        prompts[0], completions[0]
    ) and "The answer names a colour." in judge.prompt(prompts[0], completions[0])
