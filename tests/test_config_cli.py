import json
import re
import tomllib
from pathlib import Path

import pytest
import torch
import yaml

from grpo_kit.cli import build_parser, main
from grpo_kit.train.config import PRESETS, GRPOConfig, RunConfig, load_run_config
from grpo_kit.train.controls import Controls

ROOT = Path(__file__).resolve().parent.parent


def test_every_config_field_is_documented():
    source = (ROOT / "grpo_kit" / "train" / "config.py").read_text() + (
        ROOT / "grpo_kit" / "engine" / "model_config.py").read_text()
    for cls in ("ModelConfig", "TaskConfig", "SFTConfig", "GRPOConfig"):
        body = source.split(f"class {cls}")[1].split("\nclass ")[0]
        fields = re.findall(r"^    (\w+): .*= .*$", body, re.M)
        for name in fields:
            after = body.split(f"    {name}:")[1].splitlines()[1].strip()
            assert after.startswith('"""'), f"{cls}.{name} has no docstring"


def test_presets_and_yaml(tmp_path):
    for name in PRESETS:
        assert isinstance(load_run_config(name), RunConfig)
    path = tmp_path / "c.yaml"
    path.write_text(yaml.safe_dump({"grpo": {"learning_rate": 5e-4, "loss_type": "dapo"}, "sft": {"steps": 7}}))
    cfg = load_run_config("cpu-tiny", path)
    assert (cfg.grpo.learning_rate, cfg.grpo.loss_type, cfg.sft.steps) == (5e-4, "dapo", 7)
    path.write_text(yaml.safe_dump({"grpo": {"learning_rat": 1}}))
    with pytest.raises(ValueError, match="unknown setting 'learning_rat'"):
        load_run_config("cpu-tiny", path)
    with pytest.raises(ValueError, match="unknown preset"):
        load_run_config("tpu-v9")


def test_bad_grpo_settings_name_the_setting():
    with pytest.raises(ValueError, match="loss_type='ppo'"):
        GRPOConfig(loss_type="ppo")
    with pytest.raises(ValueError, match="micro_batch_size=48"):
        GRPOConfig(micro_batch_size=48)
    with pytest.raises(ValueError, match="group_size=1"):
        GRPOConfig(group_size=1, micro_batch_size=16)


def test_controls_are_versioned_and_validated():
    c = Controls.from_config(GRPOConfig(learning_rate=1e-3))
    c.update(beta=0.5, reward_weights={"a": 2.0})
    c.update(reward_weights={"b": 1.0})
    snap = c.snapshot()
    assert snap["beta"] == 0.5 and snap["reward_weights"] == {"a": 2.0, "b": 1.0} and snap["version"] == 2
    with pytest.raises(ValueError, match="no setting 'bta'"):
        c.update(bta=1)
    c.update(save_requested=True)
    assert c.consume_save_request() and not c.consume_save_request()


def test_cli_has_the_subcommands():
    parser = build_parser()
    for cmd in ("demo", "sft", "train", "eval", "plan"):
        assert parser.parse_args([cmd]).command == cmd
    assert parser.parse_args(["export", "--out", "x"]).command == "export"
    commands = set(parser._subparsers._group_actions[0].choices)
    assert commands == {"demo", "sft", "train", "eval", "export", "score", "leaderboard", "plan", "xla-check"}
    from tools.__main__ import build_parser as tools_parser  # the repository's tools: python -m tools

    assert set(tools_parser()._subparsers._group_actions[0].choices) == {"study", "bench", "smoke", "scaling"}


def test_cli_quick_sft_train_eval(tmp_path, capsys):
    out = tmp_path / "sft"
    assert main(["sft", "--preset", "cpu-tiny-quick", "--output-dir", str(out), "--quiet"]) == 0
    sft = json.loads(capsys.readouterr().out)
    assert Path(sft["checkpoint"]).is_dir() and sft["steps"] == 40
    assert (
        main(
            ["train", "--preset", "cpu-tiny-quick", "--init-from", sft["checkpoint"], "--output-dir",
             str(tmp_path / "g"), "--quiet"]
        )
        == 0
    )
    train = json.loads(capsys.readouterr().out)
    assert train["steps"] == 6 and (tmp_path / "g" / "metrics.jsonl").exists()
    assert main(["eval", "--preset", "cpu-tiny-quick", "--checkpoint", train["checkpoint"], "--quiet"]) == 0
    assert 0.0 <= json.loads(capsys.readouterr().out)["accuracy"] <= 1.0
    assert main(["eval", "--checkpoint", str(tmp_path), "--quiet"]) == 2
    assert "not a grpo_kit checkpoint" in capsys.readouterr().err

    # export: the trained weights as a transformers directory that reloads to the same greedy completions
    assert (
        main(
            ["export", "--preset", "cpu-tiny-quick", "--checkpoint", train["checkpoint"], "--out", str(tmp_path / "x"),
             "--quiet"]
        )
        == 0
    )
    exported = json.loads(capsys.readouterr().out)["exported"]
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from grpo_kit.engine.model_config import ModelConfig
    from grpo_kit.engine.models import load_model
    from grpo_kit.eval.evaluation import generate_completions
    from grpo_kit.train.checkpoint import load_checkpoint

    trained, tokenizer = load_model(ModelConfig(), torch.device("cpu"))
    load_checkpoint(train["checkpoint"], trained)
    reloaded = AutoModelForCausalLM.from_pretrained(exported)
    prompts = [[{"role": "user", "content": "What is 12 + 30?"}]]
    assert generate_completions(reloaded, AutoTokenizer.from_pretrained(exported), prompts, max_new_tokens=16) == \
        generate_completions(trained, tokenizer, prompts, max_new_tokens=16)


def _name(req: str) -> str:
    return re.sub(r"[-_.]+", "-", re.split(r"[<>=!;\[ ]", req)[0].lower())


def test_environment_yml_agrees_with_pyproject_and_lock():
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    wanted = {_name(d) for d in project["dependencies"]}
    for extra in ("xla", "notebooks", "dev", "gemma-offline", "bench", "math", "tracking"):
        wanted |= {_name(d) for d in project["optional-dependencies"][extra]}
    env = yaml.safe_load((ROOT / "environment.yml").read_text())
    pip = next(d["pip"] for d in env["dependencies"] if isinstance(d, dict))
    pinned = {_name(p): p.split("==")[1] for p in pip if "==" in p}
    assert set(pinned) == wanted
    lock = {
        _name(line): line.split("==")[1].strip()
        for line in (ROOT / "requirements/lock.txt").read_text().splitlines()
        if "==" in line and not line.startswith("#")
    }
    for name, version in pinned.items():
        assert lock.get(name) == version, f"{name}: environment.yml {version}, lock {lock.get(name)}"
    assert lock["torch"] == "2.9.0" and lock["torch-xla"] == "2.9.0"


def test_readme_gives_the_two_commands():
    readme = (ROOT / "README.md").read_text()
    assert "make demo" in readme and "make test" in readme
    assert "make test" in (ROOT / ".ci" / "run").read_text()


def test_notebooks_are_committed_without_outputs():
    for path in sorted((ROOT / "notebooks").glob("*.ipynb")):
        nb = json.loads(path.read_text())
        for cell in nb["cells"]:
            if cell["cell_type"] == "code":
                assert not cell.get("outputs") and cell.get("execution_count") is None, path.name


def test_an_unexpected_error_is_one_line_that_says_how_to_see_the_traceback(tmp_path, monkeypatch, capsys):
    import grpo_kit.cli as cli
    from grpo_kit.eval.evaluation import evaluate  # noqa: F401 - imported by cmd_eval

    def broken(*args, **kwargs):
        raise RuntimeError("CUDA out of memory. Tried to allocate 2.00 GiB")

    monkeypatch.setattr("grpo_kit.eval.evaluation.evaluate", broken)
    argv = ["eval", "--preset", "cpu-tiny-quick", "--device", "cpu", "--quiet"]
    monkeypatch.delenv(cli.DEBUG_VARIABLE, raising=False)
    assert cli.main(argv) == 2
    err = capsys.readouterr().err.strip()
    assert err == (
        "grpo-kit eval: error: CUDA out of memory. Tried to allocate 2.00 GiB (RuntimeError; GRPO_KIT_DEBUG=1 "
        "shows the traceback)"
    ), err
    monkeypatch.setenv(cli.DEBUG_VARIABLE, "1")
    with pytest.raises(RuntimeError, match="CUDA out of memory"):
        cli.main(argv)
    # a setting the user got wrong is explained in full by its message: no hint
    monkeypatch.delenv(cli.DEBUG_VARIABLE)
    assert cli.main(["eval", "--preset", "cpu-tiny-quick", "--device", "quantum"]) == 2
    assert "GRPO_KIT_DEBUG" not in capsys.readouterr().err


def test_messages_never_show_a_credential():
    from grpo_kit.engine.hub import redact

    assert redact("401 for hf_SENTINEL_abcdef at https://me:hf_SENTINEL_abcdef@host/x", ["hf_SENTINEL_abcdef"]) == \
        "401 for *** at https://me:***@host/x"
    assert (
        redact("git+https://oauth2:ghp_0123456789@github.com/o/r@v1", []) == "git+https://oauth2:***@github.com/o/r@v1")
