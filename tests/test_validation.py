"""Bad settings, from YAML, the command line and the live controls: each is refused with one line naming the
setting, its value and what is allowed (exit status 2 from the CLI), within seconds, and nothing in the output
directory is touched."""

from __future__ import annotations

import time

import pytest

from grpo_kit.cli import main
from grpo_kit.train.config import GRPOConfig, load_run_config
from grpo_kit.train.controls import Controls
from grpo_kit.validation import ConfigError

BAD_YAML = [
    ("grpo: {learning_rate: -1}", "GRPOConfig.learning_rate=-1.0: must be > 0"),
    ("grpo: {learning_rate: fast}", "GRPOConfig.learning_rate='fast': expected a number"),
    ("grpo: {micro_batch_size: 0}", "GRPOConfig.micro_batch_size=0: must be ≥ 1"),
    ("grpo: {prompts_per_step: 0}", "GRPOConfig.prompts_per_step=0: must be ≥ 1"),
    ("grpo: {max_new_tokens: 0}", "GRPOConfig.max_new_tokens=0: must be ≥ 1"),
    ("grpo: {temperature: 0}", "GRPOConfig.temperature=0.0: must be > 0"),
    ("grpo: {top_p: 1.5}", "GRPOConfig.top_p=1.5: must be in (0, 1]"),
    ("grpo: {group_size: 1}", "GRPOConfig.group_size=1: must be ≥ 2"),
    ("grpo: {micro_batch_size: 48}", "GRPOConfig.micro_batch_size=48: must divide prompts_per_step × group_size = 512"),
    ("grpo: {loss_type: ppo}", "GRPOConfig.loss_type='ppo': must be one of grpo, bnpo, dapo, dr_grpo, cispo"),
    ("grpo: {advantage: rank}", "GRPOConfig.advantage='rank': must be one of zscore, centered, mad, batch"),
    ("grpo: {epsilon: 1.5}", "GRPOConfig.epsilon=1.5: must be in (0, 1)"),
    ("grpo: {beta: -0.1}", "GRPOConfig.beta=-0.1: must be ≥ 0"),
    ("grpo: {winsorize_quantile: 0.7}", "GRPOConfig.winsorize_quantile=0.7: must be in [0, 0.5)"),
    ("grpo: {steps: 2.5}", "GRPOConfig.steps=2.5: expected a whole number"),
    ("grpo: {steps: many}", "GRPOConfig.steps='many': expected a whole number"),
    ("grpo: {log_kl: maybe}", "GRPOConfig.log_kl='maybe': expected true or false"),
    ("grpo: {reward_weights: {correctness_reward: high}}", "GRPOConfig.reward_weights['correctness_reward']='high'"),
    ("grpo: {reward_weights: 3}", "GRPOConfig.reward_weights=3: expected a mapping of names to numbers"),
    ("grpo: {max_seconds: .nan}", "GRPOConfig.max_seconds=nan: expected a finite number, or null"),
    ("model: {lora: maybe}", "ModelConfig.lora='maybe': expected true or false, or null"),
    ("grpo: {reward_timeout_seconds: 0}", "GRPOConfig.reward_timeout_seconds=0.0: must be > 0"),
    ("grpo: 3", "grpo: expected a mapping of settings, got 3"),
    ("grpo: {lerning_rate: 0.001}", "unknown setting 'lerning_rate'"),
    ("sft: {batch_size: 0}", "SFTConfig.batch_size=0: must be ≥ 1"),
    ("sft: {learning_rate: 0}", "SFTConfig.learning_rate=0.0: must be > 0"),
    ("sft: {max_length: 2}", "SFTConfig.max_length=2: must be ≥ 8"),
    ("sft: {save_every_seconds: 0}", "SFTConfig.save_every_seconds=0.0: must be > 0"),
    ("model: {lora_r: 0}", "ModelConfig.lora_r=0: must be ≥ 1"),
    ("model: {dtype: float16}", "ModelConfig.dtype='float16': must be one of auto, float32, bfloat16"),
    ("model: {lora_target_modules: q_proj}", "ModelConfig.lora_target_modules='q_proj': expected a list of strings"),
    ("task: {num_test: 0}", "TaskConfig.num_test=0: must be ≥ 1"),
    ("task: {min_value: 50, max_value: 10}", "TaskConfig.max_value=10: must be ≥ min_value (50)"),
    ("- a\n- list", "expected a mapping of settings at the top level"),
    ("grpo: {learning_rate: [1", "not valid YAML at line 2, column 1: expected ',' or ']'"),
]


@pytest.fixture()
def out_dir(tmp_path):
    """An output directory holding an earlier run's files, which a refused command must leave as they are."""
    out = tmp_path / "run"
    out.mkdir()
    (out / "metrics.jsonl").write_text('{"step": 1, "reward_mean": 0.5}\n')
    (out / "notes.txt").write_text("mine")
    return out


def _snapshot(out):
    return {p.name: p.read_bytes() for p in sorted(out.iterdir())}


def test_an_optional_setting_says_null_is_allowed_and_its_items_do_not(tmp_path):
    path = tmp_path / "bad.yaml"
    for text, message in (("task: {demonstration_operations: 3}",
                           "TaskConfig.demonstration_operations=3: expected a list of whole numbers, or null (None)"),
                          ("task: {demonstration_operations: [two]}",
                           "TaskConfig.demonstration_operations[0]='two': expected a whole number")):
        path.write_text(text + "\n")
        with pytest.raises(ConfigError) as refused:
            load_run_config("cpu-tiny", path)
        assert str(refused.value) == message


@pytest.mark.parametrize(("text", "message"), BAD_YAML, ids=[t for t, _ in BAD_YAML])
def test_bad_yaml_setting_exits_2_naming_it(tmp_path, out_dir, capsys, text, message):
    path = tmp_path / "bad.yaml"
    path.write_text(text + "\n")
    before, start = _snapshot(out_dir), time.monotonic()
    assert main(["train", "--preset", "cpu-tiny", "--config", str(path), "--output-dir", str(out_dir), "--quiet"]) == 2
    err = capsys.readouterr().err.strip()
    assert message in err and "\n" not in err and "Traceback" not in err, err
    assert time.monotonic() - start < 10
    assert _snapshot(out_dir) == before


@pytest.mark.parametrize(("argv", "message"), [
    (["--device", "quantum"], "unknown device kind 'quantum'"),
    (["--config", "/nowhere/settings.yaml"], "/nowhere/settings.yaml"),
], ids=["device", "config-file"])
def test_bad_command_line_exits_2_naming_it(out_dir, capsys, argv, message):
    before = _snapshot(out_dir)
    assert main(["train", "--preset", "cpu-tiny", *argv, "--output-dir", str(out_dir), "--quiet"]) == 2
    err = capsys.readouterr().err.strip()
    assert message in err and "Traceback" not in err, err
    assert _snapshot(out_dir) == before


def test_an_unknown_preset_is_refused_by_the_parser(capsys):
    with pytest.raises(SystemExit) as info:
        main(["train", "--preset", "cpu-huge"])
    assert info.value.code == 2 and "invalid choice: 'cpu-huge'" in capsys.readouterr().err


def test_unambiguous_values_are_coerced(tmp_path):
    path = tmp_path / "ok.yaml"
    path.write_text(
        "grpo: {learning_rate: 3e-4, steps: 10.0, max_seconds: '90'}\nmodel: {lora_target_modules: [q_proj, v_proj]}\n")
    cfg = load_run_config("cpu-tiny", path)
    assert GRPOConfig(output_dir=tmp_path / "run").output_dir == str(tmp_path / "run")  # a Path is a directory name
    assert cfg.grpo.learning_rate == 3e-4 and isinstance(cfg.grpo.learning_rate, float)
    assert cfg.grpo.steps == 10 and isinstance(cfg.grpo.steps, int) and cfg.grpo.max_seconds == 90.0
    assert cfg.model.lora_target_modules == ("q_proj", "v_proj")


@pytest.mark.parametrize(("change", "message"), [
    ({"learning_rate": -1e-3}, "Controls.learning_rate=-0.001: must be > 0"),
    ({"temperature": 0.0}, "Controls.temperature=0.0: must be > 0"),
    ({"top_p": 0.0}, "Controls.top_p=0.0: must be in (0, 1]"),
    ({"beta": -1.0}, "Controls.beta=-1.0: must be ≥ 0"),
    ({"epsilon": "wide"}, "Controls.epsilon='wide': expected a number"),
    ({"reward_weights": {"correctness_reward": None}}, "Controls.reward_weights['correctness_reward']=None"),
    ({"paused": "yes"}, "Controls.paused='yes': expected true or false"),
])
def test_live_controls_are_checked_like_the_config_and_a_bad_update_changes_nothing(change, message):
    controls = Controls.from_config(GRPOConfig())
    before = controls.snapshot()
    with pytest.raises(ConfigError) as info:
        controls.update(save_requested=True, **change)  # a good value beside the bad one is not applied either
    assert message in str(info.value)
    assert controls.snapshot() == before


MESSAGES = [{"role": "user", "content": "What is 2 + 3?"}]
BAD_DATASETS = [
    ([], "the prompt dataset is empty"),
    ("empty-dataset", "the prompt dataset is empty"),
    ([{"question": "2 + 3?", "answer": "5"}], "no 'prompt' column (its columns: answer, question)"),
    ([{"prompt": "2 + 3?"}], "reward 'correctness_reward' reads the column 'answer', which the prompt dataset lacks"),
    ([{"prompt": "2 + 3?", "answer": "5"}, {"prompt": "4 + 4?", "answer": None}],
     "row 1: 'answer' is empty (reward 'correctness_reward' reads it)"),
    ([{"prompt": 42, "answer": "5"}], "row 0: 'prompt' must be a string or a non-empty list of chat messages"),
    ([{"prompt": "   ", "answer": "5"}], "row 0: 'prompt' is empty"),
    ([{"prompt": [{"text": "2 + 3?"}], "answer": "5"}], "row 0: 'prompt' must be a string or a non-empty list"),
    ([{"prompt": MESSAGES, "answer": "5"}, {"prompt": "9" * 3000, "answer": "9"}],
     "row 1: the prompt has … tokens, more than GRPOConfig.max_prompt_tokens=1024"),
    (["2 + 3?"], "a datasets.Dataset or a list of dicts"),
]


@pytest.mark.parametrize(("rows", "message"), BAD_DATASETS, ids=[m[:40] for _, m in BAD_DATASETS])
def test_bad_prompt_datasets_are_named_before_the_first_step(tiny, tmp_path, rows, message):
    from datasets import Dataset

    from grpo_kit.data.rewards import DEFAULT_REWARDS, DEFAULT_WEIGHTS
    from grpo_kit.train.grpo import GRPOTrainer
    from grpo_kit.validation import DataError

    model, tokenizer = tiny
    if rows == "empty-dataset":
        rows = Dataset.from_dict({"prompt": [], "answer": []})
    start = time.monotonic()
    with pytest.raises(DataError) as info:
        GRPOTrainer(model, tokenizer, DEFAULT_REWARDS, rows,
                    GRPOConfig(prompts_per_step=2, group_size=2, micro_batch_size=4, output_dir=str(tmp_path / "run"),
                               reward_weights=DEFAULT_WEIGHTS))
    assert all(part in str(info.value) for part in message.split(" … ")), str(info.value)
    assert time.monotonic() - start < 10
    assert not (tmp_path / "run").exists()  # refused before anything was written


@pytest.mark.parametrize(("rows", "message"), [
    ([], "the SFT dataset is empty"),
    ([{"prompt": MESSAGES}], "SFT row 0: needs columns 'prompt' and 'completion'"),
    ([{"prompt": MESSAGES, "completion": ""}], "SFT row 0: 'completion' must be a non-empty string"),
    ([{"prompt": None, "completion": "5"}], "SFT row 0: 'prompt' must be a string or a non-empty list"),
], ids=["empty", "no-completion", "blank-completion", "no-prompt"])
def test_bad_sft_datasets_are_named(tiny, rows, message):
    from grpo_kit.train.config import SFTConfig
    from grpo_kit.train.sft import SFTTrainer
    from grpo_kit.validation import DataError

    model, tokenizer = tiny
    with pytest.raises(DataError) as info:
        SFTTrainer(model, tokenizer, rows, SFTConfig(output_dir=None))
    assert message in str(info.value)


def test_each_rule_is_written_beside_its_field_and_a_new_one_is_checked_everywhere():
    """`ruled(default, rule)` in a config class is the one declaration: the class validates it on construction, a
    subclass inherits it, a live control reads its field's, and every default passes its own rule."""
    import dataclasses

    from grpo_kit import validation
    from grpo_kit.train import config

    assert not hasattr(validation, "RULES"), "rules live beside their fields (config.py), not in a table by class name"
    for cls in (config.ModelConfig, config.TaskConfig, config.SFTConfig, config.RFTConfig, config.GRPOConfig,
                config.RunConfig):
        for f in dataclasses.fields(cls):
            rule = f.metadata.get("rule")
            if rule is not None and f.default is not None and f.default is not dataclasses.MISSING:
                assert rule[0](f.default), f"{cls.__name__}.{f.name}'s default {f.default!r} breaks its rule"
    assert validation.field_rule(config.RFTConfig, "learning_rate") is validation.field_rule(
        config.SFTConfig, "learning_rate"
    )

    @dataclasses.dataclass
    class Made:
        width: int = validation.ruled(3, validation.at_least(2))

        def __post_init__(self) -> None:
            validation.validate(self)

    with pytest.raises(ConfigError, match=r"^Made.width=1: must be ≥ 2$"):
        Made(width=1)
    assert Made(width="4").width == 4  # coerced by its type, as YAML values are
    with pytest.raises(ConfigError, match=r"^Controls.top_p=0.0: must be in \(0, 1\]$"):
        Controls.from_config(GRPOConfig()).update(top_p=0)
