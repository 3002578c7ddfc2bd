"""The bench runs end to end (at small sizes: correctness, not speed — benchmarks print numbers, tests
never time anything) and writes its report; on XLA the kit's graph count does not grow with new tokens."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

pytest.importorskip("trl", reason="TRL is the bench's comparison (extra `bench`)")


def run_bench_at_small_sizes(tmp_path, *, real: bool) -> dict:
    """`run_bench` at small sizes in its own process (TRL's accelerate kept off XLA, as `python -m tools bench`
    keeps it), its report written to `tmp_path`; `real`: with the real-model and capstone sections (Gemma 3 270M,
    offline)."""
    env = {**os.environ, "PJRT_DEVICE": "CPU", "USE_TORCH_XLA": "0"}
    without = "" if real else "real_model=None, capstone_preset=None, gemma4_models=('tiny-gemma-4',),"
    script = (
        "import json; from tools.bench import BenchSizes, run_bench, write_report\n"
        "sizes = BenchSizes(prompts=2, group=4, new_tokens=8, repeats=2, rollout_repeats=2, sft_steps=10,\n"
        "                   xla_token_counts=(2, 4), learning_budget_s=3, eval_every_s=1, num_eval=8,\n"
        "                   learning_overrides={'prompts_per_step': 4, 'micro_batch_size': 16, 'max_new_tokens': 8},\n"
        "                   real_prompts=1, real_group=2, real_new_tokens=4, real_repeats=2, capstone_steps=1,\n"
        f"                   capstone_rounds=2, capstone_sft_steps=1, {without}\n"
        "                   capstone_overrides={'task': {'num_demonstrations': 8, 'num_test': 4}, 'grpo': {\n"
        "                       'prompts_per_step': 1, 'group_size': 2, 'max_new_tokens': 4, 'micro_batch_size': 2}})\n"
        f"result = run_bench(sizes, progress=False); write_report(result, {str(tmp_path)!r})\n"
        "real = result['details']['real']\n"
        "rounds = len(real['rollouts']['speedup']['all']) if real else None\n"
        "avx2 = (result['details']['capstone'] or {}).get('avx2', {})\n"
        "isa = [avx2.get('cpu_capability'), avx2.get('cpu_bf16_products')]\n"
        "timed = {v: len(((result['details']['capstone'] or {}).get(v) or {}).get('step_s', {}).get('all', []))\n"
        "         for v in ('native', 'avx2')}\n"
        "print(json.dumps({**{k: v for k, v in result.items() if k != 'details'}, 'real_rounds': rounds,\n"
        "                  'capstone_avx2_isa': isa, 'capstone_timed_steps': timed}, default=str))\n"
    )
    proc = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, env=env, timeout=1200)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


@pytest.mark.slow
def test_bench_tiny_runs_every_part_and_writes_the_report(tmp_path):
    """Every tiny-model part (numbers mean nothing at these sizes) and the report; the real-model and capstone
    sections are `make bench-test`'s (they load Gemma 3 270M five times: minutes)."""
    result = run_bench_at_small_sizes(tmp_path, real=False)
    for key in ("sampler_tokens_per_s", "hf_generate_tokens_per_s"):
        assert result[key] > 0
    assert set(result["grpo_step_s"]) == set(result["trl_step_s"]) == {"0.0", "0.04"}
    assert all(v > 0 for v in [*result["grpo_step_s"].values(), *result["trl_step_s"].values()])
    low, high = result["sampler_speedup_spread"]
    assert low <= result["sampler_speedup"] <= high
    for beta, ratio in result["step_time_ratio"].items():  # the median of pairs lies within their spread
        assert result["step_time_ratio_spread"][beta][0] <= ratio <= result["step_time_ratio_spread"][beta][1]
    assert result["real_model"] is None and result["capstone_preset"] is None
    assert set(result["gemma4_rollout_speedup"]) == set(result["gemma4_rollout_speedup_vs_best_hf"]) == {"tiny-gemma-4"}
    assert result["gemma4_rollout_speedup"]["tiny-gemma-4"] > 0

    kit, hf = result["xla_graphs_kit"], result["xla_graphs_hf"]
    assert set(kit) == set(hf) == {"2", "4"}
    assert kit["2"] == kit["4"] > 0, f"the kit's rollout graphs depend on the number of new tokens: {kit}"
    assert hf["4"] > hf["2"], f"HF generate's graphs were expected to grow with new tokens: {hf}"

    curves = result["accuracy_vs_seconds"]
    assert len(curves["kit"]) >= 2 and len(curves["trl"]) >= 2
    assert curves["kit"][0] == curves["trl"][0]  # the same SFT start
    assert all(0.0 <= acc <= 1.0 for _, acc in curves["kit"] + curves["trl"])

    report = (tmp_path / "benchmarks.md").read_text()
    assert "| rollout tokens/s" in report and "TRL" in report and "**gemma-3-270m**" not in report
    assert "**tiny-gemma-4** (random weights), LoRA r 8: against HF's best (static cache + `torch.compile`" in report
    for png in ("bench_rollout.png", "bench_step.png", "bench_learning.png"):
        assert (tmp_path / png).read_bytes()[:4] == b"\x89PNG"
    assert json.loads((tmp_path / "benchmarks.json").read_text())["sizes"]["new_tokens"] == 8


@pytest.mark.bench
def test_bench_real_model_and_capstone_rows(tmp_path):
    """The real-model section (Gemma 3 270M, offline copy: both sides timed) and the capstone rows (the preset's own
    step, natively and under the AVX2 stand-in), at small sizes; with the tiny parts again, as `make bench` runs
    them."""
    result = run_bench_at_small_sizes(tmp_path, real=True)
    assert result["real_model"] == "gemma-3-270m"
    for key in ("real_rollout_tokens_per_s", "real_hf_generate_tokens_per_s", "real_grpo_step_s", "real_trl_step_s"):
        assert result[key] > 0, key
    assert set(result["real_breakdown"]) == {
        f"{p}_s" for p in ("rollout", "reward", "logprob", "forward", "backward", "optimizer")}
    assert sum(result["real_breakdown"].values()) <= result["real_grpo_step_s"] * 1.01 + 0.02
    assert (
        result["real_rollout_speedup_spread"][0]
        <= result["real_rollout_speedup"]
        <= result["real_rollout_speedup_spread"][1]
    )
    assert 0.0 <= result["real_zero_std_fraction"]["kit"] <= 1.0
    assert result["real_rounds"] == 2  # one rollout round after each timed step pair: real_repeats of them
    assert result["real_hf_static_compiled_tokens_per_s"] > 0 and result["real_rollout_speedup_vs_best_hf"] > 0
    assert set(result["gemma4_rollout_speedup_vs_best_hf"]) == {"tiny-gemma-4", "gemma-4-e2b-it shapes, 2 layers"}

    # the capstone rows: the preset's own step (its model and prompts; tiny sizes here), natively and as on AVX2
    assert result["capstone_preset"] == "cpu-gemma-270m"
    assert result["capstone_step_s"]["native"] > 0 and result["capstone_step_s"]["avx2"] > 0, result["capstone_step_s"]
    assert set(result["capstone_breakdown"]["avx2"]) == set(result["real_breakdown"]) and result[
        "capstone_avx2_isa"] == ["AVX2", False]
    assert result["capstone_timed_steps"] == {"native": 2, "avx2": 2}  # one step in each of two processes per variant

    report = (tmp_path / "benchmarks.md").read_text()
    assert "| capstone step s, `cpu-gemma-270m`" in report and "AVX2 stand-in (fp32)" in report
    assert "**gemma-3-270m**" in report and "step by phase" in report and "multiplies its weights in float32" in report


def test_paired_ratios_and_run_agreement():
    from tools.bench import paired_ratio, ratio_agreement

    ratio = paired_ratio([1.0, 2.0, 6.0], [2.0, 2.0, 3.0])  # pairs 0.5, 1, 2
    assert (ratio["median"], ratio["min"], ratio["max"]) == (1.0, 0.5, 2.0)
    with pytest.raises(ValueError):
        paired_ratio([1.0, 2.0], [1.0])  # unpaired repeats are a bug in the caller
    first = {"sampler_speedup": 2.0, "step_time_ratio": {"0.0": 0.5, "0.04": 0.4}, "real_step_time_ratio": None}
    second = {"sampler_speedup": 2.2, "step_time_ratio": {"0.0": 0.45, "0.04": 0.4}, "real_step_time_ratio": 0.3}
    gaps = ratio_agreement(first, second)
    assert gaps == pytest.approx({"sampler_speedup": 0.1, "step_time_ratio[0.0]": 0.1, "step_time_ratio[0.04]": 0.0})


def test_interleaved_runs_a_kit_step_after_each_trl_step_and_then_after_pair():
    from tools.bench import _interleaved

    calls: list[str] = []

    class Kit:
        def train_step(self):
            calls.append("kit")
            return {"step_seconds": 1.0}

    pairs = _interleaved(Kit(), after_pair=lambda i: calls.append(f"after {i}"))
    for _ in range(3):
        pairs.on_step_begin(None, None, None)
        calls.append("trl")
        pairs.on_step_end(None, None, None)
    assert calls == ["trl", "kit", "after 0", "trl", "kit", "after 1", "trl", "kit", "after 2"]
    assert len(pairs.trl_seconds) == len(pairs.kit_rows) == 3
