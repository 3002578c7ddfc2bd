"""Online difficulty targeting: the keep probabilities, the mix of levels they give, and the trainer using them."""

import itertools

import pytest

from grpo_kit.algo.difficulty import MIN_WEIGHT, DifficultyTargeting, keep_probability, pass_rate
from grpo_kit.train.config import GRPOConfig
from grpo_kit.train.grpo import GRPOTrainer
from grpo_kit.validation import ConfigError

SMALL = dict(prompts_per_step=4, group_size=4, max_new_tokens=24, micro_batch_size=8, warmup_steps=1)


def test_keep_probability_is_largest_at_an_even_pass_rate_and_never_zero():
    assert pass_rate(0, 0) == 0.5 and keep_probability(0, 0) == 1.0  # a level never seen is always kept
    assert keep_probability(5, 10) == 1.0
    assert keep_probability(9, 10) == pytest.approx((10 / 12) * (2 / 12) / 0.25)
    assert keep_probability(0, 100) == pytest.approx(MIN_WEIGHT / 0.25)  # looks hopeless: still drawn now and then
    assert keep_probability(100, 100) == keep_probability(0, 100)


def test_kept_prompts_come_from_levels_in_proportion_to_p_times_one_minus_p():
    targeting = DifficultyTargeting(seed=1)
    targeting.record(["even"] * 20 + ["hard"] * 20 + ["easy"] * 20, [1, 0] * 10 + [0] * 19 + [1] + [1] * 18 + [0, 0])
    rates = targeting.pass_rates()
    assert rates["even"] == 0.5 and rates["hard"] == pytest.approx(2 / 22) and rates["easy"] == pytest.approx(19 / 22)
    stream = itertools.cycle([{"level": "even"}, {"level": "hard"}, {"level": "easy"}])
    kept = [targeting.next_prompt(stream)["level"] for _ in range(3000)]
    weights = {level: keep_probability(*targeting.counts[level]) for level in rates}
    total = sum(weights.values())
    for level, weight in weights.items():
        assert kept.count(level) / len(kept) == pytest.approx(weight / total, abs=0.03), level
    assert targeting.draws > len(kept)
    # evidence fades: after a batch in which the hard level is solved half the time its estimate moves up
    before = rates["hard"]
    targeting.record(["hard"] * 20, [1, 0] * 10)
    assert targeting.pass_rates()["hard"] > before + 0.1
    with pytest.raises(ValueError, match="a prompt row has no 'level' column"):
        targeting.next_prompt(iter([{"prompt": "x"}]))


def test_the_trainer_draws_more_prompts_from_the_level_whose_groups_differ_and_resumes_the_same(
    sft_model, task, tmp_path
):
    """A reward that is always right on one level and right half the time on the other: after the first steps the
    trainer keeps mostly prompts of the second; a resumed run draws the same prompts as the uninterrupted one."""
    model, tok = sft_model
    rows = [{**r, "level": "solved" if i % 2 else "open"} for i, r in enumerate(task.test_set())]

    def outcome(prompts, completions, level, **_):
        return [1.0 if lv == "solved" else float(i % 2) for i, lv in enumerate(level)]

    cfg = GRPOConfig(**SMALL, output_dir=str(tmp_path / "run"), difficulty_targeting=True, accuracy_reward="outcome",
                     learning_rate=1e-6)
    trainer = GRPOTrainer(model, tok, [outcome], iter(itertools.cycle(rows)), cfg)
    seen = []
    rollout = trainer.rollout
    trainer.rollout = lambda batch, controls: seen.append([r["level"] for r in batch]) or rollout(batch, controls)
    for _ in range(3):
        row = trainer.train_step()
    assert seen[0].count("solved") == 2  # nothing measured yet: the stream's own order
    later = seen[1] + seen[2]
    assert later.count("open") > later.count("solved")
    assert row["level_pass_rates"]["solved"] > 0.9 and row["level_pass_rates"]["open"] == pytest.approx(0.5)
    trainer.save(tmp_path / "run" / "checkpoint")
    resumed = GRPOTrainer(model, tok, [outcome], iter(itertools.cycle(rows)), cfg)
    resumed.load(tmp_path / "run" / "checkpoint")
    assert resumed.difficulty.counts == trainer.difficulty.counts
    assert [resumed._next_prompt()["prompt"] for _ in range(8)] == [trainer._next_prompt()["prompt"] for _ in range(8)]
    with pytest.raises(ConfigError, match="difficulty_targeting needs accuracy_reward"):
        GRPOTrainer(model, tok, [outcome], iter(rows), GRPOConfig(**SMALL, output_dir=None, difficulty_targeting=True))


def test_a_task_without_levels_is_refused_before_any_work_and_your_own_level_column_is_kept(tmp_path):
    """Difficulty targeting on rows with no `level` column fails as the arc's SFT starts, with the setting named (not
    after SFT, at GRPO's first prompt); the arc still opens (to evaluate or export what it holds). A data file's own
    `level` column reaches the prompt rows."""
    import dataclasses
    import json

    from grpo_kit.course.arc import Arc
    from grpo_kit.data.tasks import load_task
    from grpo_kit.train.config import TaskConfig, load_run_config

    rows = [{"question": f"What is {i} + {i}?", "answer": str(2 * i), "solution": f"{i} + {i} = {2 * i}",
             "level": "easy" if i < 20 else "hard"} for i in range(40)]
    data = tmp_path / "task.jsonl"
    data.write_text("".join(json.dumps(r) + "\n" for r in rows))
    levelled = load_task(data, columns={"prompt": "question"}, num_test=8)
    assert {r["level"] for r in levelled.test_set()} | {next(levelled.prompt_stream())["level"]} <= {"easy", "hard"}

    data.write_text("".join(json.dumps({k: v for k, v in r.items() if k != "level"}) + "\n" for r in rows))
    cfg = load_run_config("cpu-tiny-quick")
    cfg = dataclasses.replace(
        cfg, output_dir=str(tmp_path / "arc"), grpo=dataclasses.replace(cfg.grpo, difficulty_targeting=True),
        task=TaskConfig(kind="file", source=str(data), prompt_column="question", solution_column="solution",
                        num_test=8))
    arc = Arc(cfg, progress=False)
    with pytest.raises(ValueError, match="difficulty_targeting: a prompt row has no 'level' column"):
        arc.sft()
    assert not arc.done("sft") and not (tmp_path / "arc" / "sft").exists()
