"""The memory planner, the hardware presets and `grpo-kit plan`."""

from __future__ import annotations

import json

import pytest
import torch

from grpo_kit.cli import main
from grpo_kit.engine.models import count_parameters
from grpo_kit.eval.planner import GIB, MODEL_SHAPES, MODELS, PlanInput, estimate, model_spec, plan, table
from grpo_kit.train.config import PRESETS, auto_preset, load_run_config


def test_parameter_count_matches_the_real_tiny_model(tiny):
    model, _ = tiny
    assert MODELS["tiny-gemma"].params == count_parameters(model)["total"]
    assert model_spec(str(MODEL_SHAPES / "tiny-gemma")).params == MODELS["tiny-gemma"].params


def test_known_sizes_are_right():
    assert 265e6 < MODELS["gemma-3-270m"].params < 272e6
    assert 0.98e9 < MODELS["gemma-3-1b-it"].params < 1.01e9
    assert 2.5e9 < MODELS["gemma-2-2b-it"].params < 2.7e9
    assert model_spec("google/gemma-3-1b-it") is MODELS["gemma-3-1b-it"]


def test_estimate_components_follow_the_formulas():
    p = PlanInput(model="gemma-3-1b-it", tpu="v2-8", lora=True, prompts_per_step=8, group_size=8,
                  prompt_length=128, max_new_tokens=256)
    e = estimate(p, micro_batch=32, checkpointing=False)
    spec = MODELS["gemma-3-1b-it"]
    assert e["weights"] == spec.params * 2  # bf16, replicated under LoRA
    assert e["optimizer"] == 2 * e["gradients"] == 2 * spec.lora_params(8, p.lora_targets) * 4
    assert e["kv_cache"] == 8 * 384 * spec.layers * 2 * spec.kv_heads * spec.head_dim * 2  # 64 rows / 8 devices
    with_ckpt = estimate(p, micro_batch=32, checkpointing=True)
    assert with_ckpt["activations"] < e["activations"] / 5
    full = estimate(PlanInput(model="gemma-3-1b-it", tpu="v2-8", lora=False), 32, False)
    assert full["weights"] == spec.params * 2 / 8  # FSDP-sharded


def test_planner_picks_settings_that_fit_and_refuses_what_cannot():
    r = plan(PlanInput(model="gemma-3-1b-it", tpu="v2-8"))
    assert r["fits"] and r["estimate_gib"]["total"] <= 8.0
    bigger = plan(PlanInput(model="gemma-3-1b-it", tpu="v2-8", micro_batch_size=64))
    assert not bigger["fits"] or bigger["estimate_gib"]["total"] <= 8.0
    no = plan(PlanInput(model="gemma-2-2b-it", tpu="v5e-1", lora=False))
    assert not no["fits"]
    assert "use LoRA" in no["advice"] and "16 GiB" in no["advice"]
    with pytest.raises(ValueError, match="cannot be split over 8 devices"):
        plan(PlanInput(prompts_per_step=3, group_size=3))
    with pytest.raises(ValueError, match="unknown accelerator 'v9-8'"):
        plan(PlanInput(tpu="v9-8"))


def _board(name: str) -> str | None:
    if name.startswith("tpu-"):
        return "-".join(name.split("-")[1:3])
    return {"gpu-gemma-3-1b": "t4", "gpu-gemma-4-e2b": "t4", "cpu-gemma-270m": "cpu"}.get(name)


def _longest_prompt(cfg) -> int:
    """The preset's longest prompt in tokens: measured on the generated word problems; for GSM8K (not here offline)
    its one prompt bucket, which holds every GSM8K question."""
    if cfg.task.kind != "word_problems":
        return cfg.grpo.prompt_bucket
    from grpo_kit.data.tasks import make_task
    from grpo_kit.engine.hub import resolve_model
    from grpo_kit.engine.models import load_tokenizer
    from grpo_kit.engine.sampling import bucket_length, prompt_tokens

    tokenizer = load_tokenizer(resolve_model(cfg.model.name).path)
    longest = max(prompt_tokens(tokenizer, row["prompt"]) for row in make_task(cfg.task).test_set())
    return bucket_length(longest, cfg.grpo.prompt_bucket)


def test_every_real_gemma_preset_fits_its_board_per_the_planner():
    checked = []
    for name in PRESETS:
        board = _board(name)
        if board is None:
            continue
        cfg = load_run_config(name)
        g = cfg.grpo
        r = plan(
            PlanInput(model=cfg.model.name, tpu=board, lora=bool(cfg.model.lora), prompts_per_step=g.prompts_per_step,
                      group_size=g.group_size, prompt_length=_longest_prompt(cfg), max_new_tokens=g.max_new_tokens,
                      micro_batch_size=g.micro_batch_size, gradient_checkpointing=cfg.model.gradient_checkpointing,
                      beta=g.beta, ple_on_host=cfg.model.ple_on_host)
        )
        assert r["fits"], (name, r["estimate_gib"])
        checked.append(name)
    assert sorted(checked) == ["cpu-gemma-270m", "gpu-gemma-3-1b", "gpu-gemma-4-e2b", "tpu-v2-8-gemma-3-1b",
                               "tpu-v3-8-gemma-3-1b", "tpu-v5e-1-gemma-3-1b", "tpu-v5e-1-gemma-4-e2b",
                               "tpu-v5e-8-gemma-3-1b", "tpu-v5e-8-gemma-4-e2b", "tpu-v6e-1-gemma-3-1b",
                               "tpu-v6e-1-gemma-4-e2b", "tpu-v6e-8-gemma-3-1b"]


def test_the_gemma4_presets_are_planned_for_their_boards_and_the_t4_needs_the_table_on_the_host():
    """Each Gemma 4 E2B preset's micro-batch is the largest the planner fits on its board at its settings (so none
    is set by hand), the TPU ones keep the per-layer table in HBM, and on a T4 in float32 E2B fits only with it on
    the host (the planner says so where it does not)."""
    for name in ("tpu-v5e-8-gemma-4-e2b", "tpu-v6e-1-gemma-4-e2b", "tpu-v5e-1-gemma-4-e2b", "gpu-gemma-4-e2b"):
        cfg, board = load_run_config(name), _board(name)
        g = cfg.grpo
        picked = plan(PlanInput(model=cfg.model.name, tpu=board, prompts_per_step=g.prompts_per_step,
                                group_size=g.group_size, prompt_length=_longest_prompt(cfg),
                                max_new_tokens=g.max_new_tokens, beta=g.beta, ple_on_host=cfg.model.ple_on_host))
        assert picked["fits"] and picked["micro_batch_size"] == g.micro_batch_size, (name, picked["micro_batch_size"])
        assert picked["gradient_checkpointing"] == cfg.model.gradient_checkpointing, name
        assert cfg.model.ple_on_host == (board == "t4"), name
    cfg = load_run_config("gpu-gemma-4-e2b")
    device_table = plan(PlanInput(model=cfg.model.name, tpu="t4", prompts_per_step=cfg.grpo.prompts_per_step,
                                  max_new_tokens=cfg.grpo.max_new_tokens, prompt_length=cfg.grpo.prompt_bucket))
    assert not device_table["fits"] and "--ple-on-host: 8.8 GiB less on the GPU" in device_table["advice"]


def test_auto_picks_gemma4s_preset_only_when_the_model_is_gemma4(monkeypatch, capsys):
    """`--preset auto` stays Gemma 3 1B's (the default where the planner prefers it); naming Gemma 4 E2B, in any of its
    spellings, picks the board's E2B preset; the CPU keeps its demo."""
    for spelling in ("gemma-4-e2b-it", "google/gemma-4-E2B-it", "gemma-4-e2b"):
        assert auto_preset("v5e-8", model=spelling) == "tpu-v5e-8-gemma-4-e2b"
        assert auto_preset("v6e-1", model=spelling) == "tpu-v6e-1-gemma-4-e2b"
        assert auto_preset("cuda", model=spelling) == "gpu-gemma-4-e2b"
        assert auto_preset("cpu", model=spelling) == "cpu-tiny"
    assert auto_preset("v5e-8") == auto_preset("v5e-8", model="google/gemma-3-1b-it") == "tpu-v5e-8-gemma-3-1b"
    from grpo_kit.engine import device

    monkeypatch.setattr(device, "xla_device_memory", lambda: (8, 32.0))  # v6e-8: no E2B preset of its own
    assert auto_preset("v6e-8", model="gemma-4-e2b-it") == "tpu-v5e-8-gemma-4-e2b"
    assert "TPU v6e-8 has no gemma-4-e2b preset of its own" in capsys.readouterr().err
    monkeypatch.setenv("TPU_ACCELERATOR_TYPE", "v5litepod-8")  # Kaggle's TPU v5e-8
    assert load_run_config("auto", model="gemma-4-e2b-it").model.name == "google/gemma-4-E2B-it"
    assert load_run_config("auto").model.name == "google/gemma-3-1b-it"


@pytest.mark.parametrize("accelerator_type, board", [
    ("v5litepod-1", "v5e-1"), ("v5litepod-8", "v5e-8"), ("v6e-1", "v6e-1"), ("v6e-8", "v6e-8"), ("v2-8", "v2-8"),
    ("v3-8", "v3-8")])
def test_each_board_colab_and_kaggle_name_picks_its_own_preset(monkeypatch, accelerator_type, board):
    """TPU_ACCELERATOR_TYPE as the runtimes set it (Colab v5e-1 and v6e-1, Kaggle v5e-8) → the board → its preset."""
    from grpo_kit.engine.device import detect_accelerator

    monkeypatch.setenv("TPU_ACCELERATOR_TYPE", accelerator_type)
    assert detect_accelerator() == board
    assert auto_preset() == f"tpu-{board}-gemma-3-1b"
    preset = PRESETS[f"tpu-{board}-gemma-3-1b"]
    assert load_run_config("auto").grpo.micro_batch_size == preset["grpo"]["micro_batch_size"]


def test_auto_preset_follows_the_hardware():
    assert auto_preset("v2-8") == "tpu-v2-8-gemma-3-1b"
    assert auto_preset("v5e-8") == "tpu-v5e-8-gemma-3-1b"
    assert auto_preset("v6e-1") == "tpu-v6e-1-gemma-3-1b"
    assert auto_preset("cuda") == "gpu-gemma-3-1b"
    assert auto_preset("cpu") == "cpu-tiny"


def test_a_board_without_a_preset_runs_what_fits_the_memory_its_runtime_reports(monkeypatch, capsys):
    """Not v2-8's eight devices of 8 GiB: the devices and memory the runtime reports choose a board whose preset the
    planner fits into no more memory per device, said in one line; a board that reports nothing is refused so."""
    from grpo_kit.engine import device
    from grpo_kit.train.config import board_for_memory

    monkeypatch.setattr(device, "xla_device_memory", lambda: (8, 32.0))  # v4-8-like: 8 devices of 32 GiB
    assert auto_preset("v4-8") == "tpu-v6e-8-gemma-3-1b"
    said = capsys.readouterr().err.strip().splitlines()
    assert said == ["grpo-kit: TPU v4-8 has no preset of its own; its runtime reports 8 devices of 32 GiB, so it runs "
                    "tpu-v6e-8-gemma-3-1b (planned for 8 of 32 GiB; each of yours holds as much or more)"]
    monkeypatch.setattr(device, "xla_device_memory", lambda: (4, 95.0))  # v5p-8: 4 chips of 95 GiB
    assert auto_preset("v5p-8") == "tpu-v6e-1-gemma-3-1b"  # one device's rows, split four ways
    assert board_for_memory(8, 16.0) == "v5e-8" and board_for_memory(2, 8.0) is None
    monkeypatch.setattr(device, "xla_device_memory", lambda: (16, 8.0))
    with pytest.raises(device.SetupError, match=r"^TPU v4-32 has no preset here, and no board's preset fits 16 "):
        auto_preset("v4-32")
    monkeypatch.setattr(device, "xla_device_memory", lambda: None)
    with pytest.raises(device.SetupError, match=r"^TPU v4-8 has no preset here and its runtime reports no device "):
        auto_preset("v4-8")


@pytest.mark.parametrize("board", ["v6e-1", "v6e-8"])
def test_plan_command_on_the_trillium_boards(capsys, board):
    assert main(["plan", "--model", "gemma-3-1b-it", "--tpu", board]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["fits"] and report["devices"] == int(board[-1]) and report["gib_per_device"] == 32.0


def test_plan_command(capsys):
    assert main(["plan", "--model", "gemma-3-270m", "--tpu", "v5e-1"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["fits"] and report["devices"] == 1
    assert main(["plan", "--model", "gemma-2-2b-it", "--tpu", "v5e-1", "--full"]) == 1
    assert "does not fit" in capsys.readouterr().err
    assert main(["plan", "--table"]) == 0
    assert "| gemma-3-1b-it |" in capsys.readouterr().out
    assert table().count("\n") == 4
    assert GIB == 2**30



def test_plan_flags_come_from_the_plan_input_whose_defaults_are_the_tpu_presets(capsys):
    """Nothing declared twice: each `grpo-kit plan` flag is a `PlanInput` field (default and help from it), and
    PlanInput's GRPO settings are the ones every TPU preset runs."""
    import dataclasses

    from grpo_kit.cli import PLAN_FLAGS, build_parser
    from grpo_kit.eval.planner import PlanInput
    from grpo_kit.train.config import PRESETS, load_run_config

    args = build_parser().parse_args(["plan"])
    for name in PLAN_FLAGS:
        assert getattr(args, name) == getattr(PlanInput(), name), name
    for preset in (name for name in PRESETS if name.startswith("tpu-")):
        grpo = load_run_config(preset).grpo
        assert (grpo.prompts_per_step, grpo.group_size, grpo.max_new_tokens, grpo.beta) == (
            PlanInput.prompts_per_step, PlanInput.group_size, PlanInput.max_new_tokens, PlanInput.beta), preset
    assert set(PLAN_FLAGS) <= {f.name for f in dataclasses.fields(PlanInput)}
    assert main(["plan", "--group-size", "4", "--no-gradient-checkpointing"]) == 0
    assert json.loads(capsys.readouterr().out)["fits"]

def test_estimate_is_close_to_a_measured_peak_on_the_tiny_model():
    """The benchmark (tools/plan_vs_measured.py) measures; here only the order of magnitude is pinned,
    so a broken formula shows up in CI without timing or memory noise failing it."""
    p = PlanInput(model="tiny-gemma", tpu="cpu", lora=False, prompts_per_step=64, group_size=8,
                  prompt_length=48, max_new_tokens=32, beta=0.0, dtype_bytes=4)
    e = estimate(p, 512, False)
    assert 2 * GIB < e["training_phase"] < 5 * GIB


def test_cli_picks_the_preset_for_the_hardware_except_the_cpu_demo(monkeypatch):
    from grpo_kit.cli import build_parser

    parser = build_parser()
    assert parser.parse_args(["train"]).preset == "auto"
    assert parser.parse_args(["demo"]).preset == "cpu-tiny"
    monkeypatch.delenv("TPU_ACCELERATOR_TYPE", raising=False)
    monkeypatch.setattr("torch.cuda.is_available", lambda: False)
    assert auto_preset() == "cpu-tiny"


def test_every_real_gemma_preset_states_its_expected_times_and_where_they_come_from():
    from grpo_kit.train.config import PRESET_TIMES

    for name in PRESETS:
        if _board(name) is None:
            continue
        expected = PRESET_TIMES[name]
        assert expected["grpo_step_seconds"] > 0 and expected["run_minutes"] > 0, name
        assert expected["basis"].startswith(("measured: ", "estimate")), name
        assert expected["run_minutes"] == load_run_config(name).time_budget_minutes, name


def test_the_presets_data_holds_the_shared_recipe_and_instruction_and_times_only_for_presets_it_names():
    """assets/presets.yaml: every real-Gemma preset runs GRPO_RECIPE, the word-problem presets' system prompt is the
    answer format's instruction, `times` names presets that exist, and a TPU board's micro-batch is its preset's."""
    from grpo_kit.data.answer_format import WORD_PROBLEM_INSTRUCTION
    from grpo_kit.train.config import GRPO_RECIPE, PRESET_TIMES, TPU_BOARDS, tpu_board_micro_batch

    assert GRPO_RECIPE == {"gate_shaped_rewards": True, "difficulty_targeting": True,
                           "skip_zero_advantage_groups": True}
    for name in PRESETS:
        cfg = load_run_config(name)
        if _board(name) is not None:
            assert {k: getattr(cfg.grpo, k) for k in GRPO_RECIPE} == GRPO_RECIPE, name
        if cfg.task.kind in ("word_problems", "gsm8k"):
            assert cfg.task.system_prompt == WORD_PROBLEM_INSTRUCTION, name
    assert set(PRESET_TIMES) <= set(PRESETS)
    for board in TPU_BOARDS:
        assert tpu_board_micro_batch(board) == load_run_config(f"tpu-{board}-gemma-3-1b").grpo.micro_batch_size


def test_the_cpu_gemma_preset_trains_in_float32_on_a_cpu_and_bf16_where_notebook_08_falls_back_to_it():
    from grpo_kit.engine.device import resolve_dtype

    dtype = load_run_config("cpu-gemma-270m").model.dtype
    assert resolve_dtype(dtype, torch.device("cpu")) == torch.float32  # the measured CPU run
    assert resolve_dtype(dtype, torch.device("xla")) == torch.bfloat16  # a TPU without access to Gemma 3 1B


@pytest.mark.parametrize("name", ["gemma-4-e2b-it", "gemma-4-e4b-it"])
def test_gemma4_shapes_match_transformers_layer_by_layer(name):
    """The planner's Gemma 4 (PLE table, KV-shared layers without k/v, full layers with the wider head, the
    double-wide MLP of E2B's shared layers) against transformers' own Gemma4ForCausalLM built from the same shipped
    config on the meta device: the same parameter count, the same projections per layer (so LoRA's count), and the
    same layers holding keys and values."""
    from transformers import Gemma4ForCausalLM, Gemma4TextConfig

    config = json.loads((MODEL_SHAPES / name / "config.json").read_text())
    with torch.device("meta"):
        model = Gemma4ForCausalLM(Gemma4TextConfig(**config))
    spec = MODELS[name]
    assert spec.params == sum(p.numel() for p in model.parameters())
    for index, layer in enumerate(model.model.layers):
        linears = {n.rsplit(".", 1)[-1]: (m.in_features, m.out_features) for n, m in layer.named_modules()
                   if isinstance(m, torch.nn.Linear) and n.rsplit(".", 1)[-1].endswith("_proj")
                   and n.split(".")[0] in ("self_attn", "mlp")}
        assert linears == spec.layer_shapes(index), index
        assert spec.stores_kv(index) == hasattr(layer.self_attn, "k_proj"), index
    assert spec.ple_dim == 256 and spec.kv_shared_layers == model.config.num_kv_shared_layers > 0
    # "effective" parameters: all but the per-layer table (E2B ≈ 2.3B)
    effective = spec.params - spec.ple_vocab * spec.layers * spec.ple_dim
    assert {"gemma-4-e2b-it": 2.2e9 < effective < 2.4e9, "gemma-4-e4b-it": 4.5e9 < effective < 4.8e9}[name]


@pytest.mark.parametrize("board", ["v5e-8", "v6e-1", "v5e-1", "t4"])
def test_plan_command_plans_gemma4_e2b_from_its_config(capsys, board):
    """`grpo-kit plan --model gemma-4-e2b-it` on each board a Gemma 4 user would open: a plan from the shipped
    config (4.63B parameters with the per-layer table; its KV cache only over the 15 layers that store keys and
    values), the hub id accepted as well; on a T4 (fp32) it does not fit and says why."""
    code = main(["plan", "--model", "google/gemma-4-E2B-it", "--tpu", board])
    captured = capsys.readouterr()
    report = json.loads(captured.out)
    assert report["model"] == "gemma-4-e2b-it" and report["params"] == MODELS["gemma-4-e2b-it"].params
    spec = MODELS["gemma-4-e2b-it"]
    assert spec.kv_per_token == 2 * 256 * 12 + 2 * 512 * 3  # 12 sliding and 3 full layers store, K = 1
    assert code == (0 if report["fits"] else 1)
    assert report["fits"] == (board != "t4"), report["estimate_gib"]
    if board == "t4":
        assert "does not fit" in captured.err and report["estimate_gib"]["weights"] > 15
