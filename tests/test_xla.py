"""The XLA path on the CPU (PJRT_DEVICE=CPU): compile counts, recompiles, agreement with eager, SPMD.

Linux x86_64 has torch_xla wheels, so there these tests must run: a missing torch_xla fails them. Elsewhere
(macOS, Windows) they skip with that reason.
"""

from __future__ import annotations

import json
import os
import platform
import subprocess
import sys

import pytest
import torch

from grpo_kit.engine.device import CompileMonitor, get_device, mark_step, move_model, xla_available

HAS_WHEELS = sys.platform == "linux" and platform.machine() == "x86_64"
if not xla_available():
    if HAS_WHEELS:
        raise RuntimeError("torch_xla is not installed, but this is Linux x86_64 where it must be: run `make test`")
    pytest.skip(f"torch_xla has no wheels for {sys.platform}/{platform.machine()}", allow_module_level=True)


def xla_check(*args: str) -> dict:
    """`grpo-kit xla-check` as a user runs it: with the CPU's own choice of weight products (bf16 where it has them
    natively, which conftest turns off for the other tests), so the check's eager fp32 reference is tested too."""
    env = {key: value for key, value in os.environ.items() if key != "GRPO_KIT_CPU_BF16"}
    env["PJRT_DEVICE"] = "CPU"
    proc = subprocess.run([sys.executable, "-m", "grpo_kit.cli", "xla-check", "--json", *args],
                          capture_output=True, text=True, env=env, timeout=1500)
    lines = [line for line in proc.stdout.splitlines() if line.startswith("{")]
    assert lines, f"xla-check printed no JSON (rc {proc.returncode}):\n{proc.stderr[-3000:]}"
    report = json.loads(lines[-1])
    report["returncode"] = proc.returncode
    return report


@pytest.fixture(scope="module")
def one_device() -> dict:
    return xla_check("--devices", "1", "--steps", "20")


def test_xla_grpo_20_steps_compiles_a_fixed_set_of_graphs(one_device):
    r = one_device
    assert r["returncode"] == 0, r
    assert r["steps"] == 20
    assert r["recompiles_after_warmup"] == 0
    assert all(c == 0 for c in r["compiles_per_step"][2:]), r["compiles_per_step"]
    # each phase compiles its graphs (prefill, the decode step, the log-prob and training forwards) and no more
    phases = r["graphs_per_phase"]
    assert all(phases.get(p, 0) >= 1 for p in ("prefill", "decode", "train")), phases
    assert 4 <= r["total_graphs"] <= 10 and r["total_graphs"] == sum(phases.values()), phases
    assert r["cpu_fallback_ops"] == {}
    # it learned something: the length/format reward rose
    assert r["reward_mean_per_step"][-1] > r["reward_mean_per_step"][0]


def test_xla_matches_eager_cpu(one_device):
    assert one_device["max_scaled_diff_vs_eager"] <= 1e-4, one_device["abs_diff_by_metric"]
    assert one_device["update_rel_diff"] <= one_device["update_tolerance"], one_device["update_rel_diff_per_step"]
    # the XLA sampler draws the same tokens as the eager one from the same CPU noise
    assert min(one_device["sampled_token_agreement"]) >= 0.99


def test_graph_count_does_not_grow_with_max_new_tokens(one_device):
    longer = xla_check("--devices", "1", "--steps", "3", "--max-new-tokens", "32")
    assert longer["returncode"] == 0, longer
    assert longer["total_graphs"] == one_device["total_graphs"], (longer["graphs_per_phase"],
                                                                  one_device["graphs_per_phase"])


def test_spmd_8_devices_matches_1_device(one_device):
    r = xla_check("--devices", "8", "--steps", "20")
    assert r["returncode"] == 0, r
    assert r["spmd"] and r["devices"] == 8
    assert r["recompiles_after_warmup"] == 0 and r["cpu_fallback_ops"] == {}
    assert r["total_graphs"] == one_device["total_graphs"]
    diffs = [abs(a - b) for a, b in zip(r["policy_loss_per_step"], one_device["policy_loss_per_step"], strict=True)]
    assert max(diffs) <= 1e-4
    assert r["reward_mean_per_step"] == one_device["reward_mean_per_step"]


def test_gemma4_grpo_on_8_devices_compiles_a_fixed_set_of_graphs_and_matches_eager():
    """Gemma 4's layers (per-layer inputs, KV sharing, k = v, both head sizes) through 20 GRPO steps under SPMD:
    nothing compiles after warm-up, nothing falls back, every step agrees with eager from the same state."""
    r = xla_check("--model", "tiny-gemma-4", "--devices", "8", "--steps", "20")
    assert r["returncode"] == 0, r
    assert r["model"] == "tiny-gemma-4" and r["spmd"] and r["steps"] == 20
    assert r["recompiles_after_warmup"] == 0 and r["cpu_fallback_ops"] == {}
    assert all(c == 0 for c in r["compiles_per_step"][2:]), r["compiles_per_step"]
    assert r["max_scaled_diff_vs_eager"] <= 1e-4, r["abs_diff_by_metric"]
    assert r["update_rel_diff"] <= r["update_tolerance"], r["update_rel_diff_per_step"]
    assert min(r["sampled_token_agreement"]) >= 0.99


def test_the_update_comparison_catches_an_update_computed_differently():
    """`xla_check` compares each step's weight update from a shared state: the same AdamW step agrees to rounding, one
    with another learning rate (what a wrong step count or schedule on the device would do) is far over the bar."""
    from types import SimpleNamespace

    from grpo_kit.eval.xla_check import UPDATE_TOLERANCE, _take_state, _update_rel_diff

    def trainer(lr: float, seed: int) -> SimpleNamespace:
        params = [torch.nn.Parameter(torch.randn(16, 8, generator=torch.Generator().manual_seed(seed)))]
        return SimpleNamespace(params=params, optimizer=torch.optim.AdamW(params, lr=lr))

    def step(t: SimpleNamespace) -> None:
        t.optimizer.zero_grad()
        (t.params[0] ** 3).sum().backward()
        t.optimizer.step()

    for other_lr, agrees in ((1e-3, True), (2e-3, False)):
        reference, other = trainer(1e-3, seed=0), trainer(other_lr, seed=1)
        for _ in range(3):  # the reference takes the other's weights and moments, then both step
            start = _take_state(reference, other)
            assert torch.equal(reference.params[0], other.params[0])
            step(reference), step(other)
            diff = _update_rel_diff(start, reference, other)
        assert (diff <= 1e-6) if agrees else (diff > 50 * UPDATE_TOLERANCE), (other_lr, diff)


# ---- in-process checks (conftest touches the XLA device before any CPU backward) ----------------------


def test_move_to_xla_keeps_embeddings_tied_and_gradients_equal(tiny):
    model, tok = tiny
    ids = torch.tensor([[2, 10, 11, 12, 13, 14]])
    cpu_loss = model(input_ids=ids, labels=ids, use_cache=False).loss
    cpu_loss.backward()
    cpu_grad = model.get_input_embeddings().weight.grad.clone()
    model.zero_grad(set_to_none=True)
    xla = get_device("xla")
    model = move_model(model, xla)
    assert model.lm_head.weight is model.get_input_embeddings().weight
    loss = model(input_ids=ids.to(xla), labels=ids.to(xla), use_cache=False).loss
    loss.backward()
    mark_step(xla)
    xla_grad = model.get_input_embeddings().weight.grad.cpu()
    assert torch.allclose(cpu_loss, loss.cpu(), atol=1e-5)
    assert torch.allclose(cpu_grad, xla_grad, atol=1e-5)


def test_a_checkpoint_of_a_model_on_xla_resumes_on_it(tiny, tmp_path):
    """The optimizer state is read to the host and the optimizer moves it to each parameter's device (torch.load
    cannot place a tensor on an XLA device): a run on a TPU resumes."""
    from grpo_kit.train.checkpoint import load_checkpoint, save_checkpoint

    model, _ = tiny
    xla = get_device("xla")
    model = move_model(model, xla)
    params = [p for p in model.parameters() if p.requires_grad]
    optimizer = torch.optim.AdamW(params, lr=1e-3)
    ids = torch.tensor([[2, 10, 11, 12, 13, 14]], device=xla)
    model(input_ids=ids, labels=ids, use_cache=False).loss.backward()
    optimizer.step()
    mark_step(xla)
    save_checkpoint(tmp_path / "ckpt", model, optimizer, 1)
    moments = [optimizer.state[p]["exp_avg"].cpu() for p in params]
    fresh = torch.optim.AdamW(params, lr=1e-3)
    assert load_checkpoint(tmp_path / "ckpt", model, fresh)["step"] == 1
    for p, expected in zip(params, moments, strict=True):
        assert fresh.state[p]["exp_avg"].device.type == "xla"
        assert torch.equal(fresh.state[p]["exp_avg"].cpu(), expected)


RESUME_ON_MESH = """
import json, sys, torch
from grpo_kit.engine.device import enable_spmd, get_device
enable_spmd(2)
import torch_xla
from grpo_kit.engine.model_config import ModelConfig
from grpo_kit.engine.models import ReferencePolicy, load_model
from grpo_kit.train.checkpoint import load_checkpoint, save_checkpoint

xla = get_device("xla")
model = load_model(ModelConfig(lora=False, dtype="float32"), xla)[0]
reference = ReferencePolicy(model).frozen  # saved with the run once an EMA has moved it
spec = torch_xla._XLAC._get_xla_sharding_spec
copied = {name: spec(p) for name, p in reference.named_parameters()}
optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
model(input_ids=torch.tensor([[2, 40, 41, 42]], device=xla)).logits.sum().backward()
optimizer.step()
torch_xla.sync(wait=True)
save_checkpoint(sys.argv[1], model, optimizer, 1, modules={"reference": reference})
split = [name for name, p in model.named_parameters() if "devices=[2,1]" in spec(p)]
fresh = torch.optim.AdamW(model.parameters(), lr=1e-3)
load_checkpoint(sys.argv[1], model, fresh, modules={"reference": reference})
params, frozen = dict(model.named_parameters()), dict(reference.named_parameters())
print(json.dumps({"split": split, "after": {name: spec(params[name]) for name in split},
                  "moments": {name: spec(fresh.state[params[name]]["exp_avg"]) for name in split},
                  "reference": {name: spec(frozen[name]) for name in split},
                  "reference_as_made": {name: copied[name] for name in split}}))
"""


def test_a_checkpoint_loaded_on_an_spmd_mesh_keeps_the_weights_moments_and_ema_reference_split():
    """Loading copies the host's weights into the model, which left every weight whole on every device (XLA takes the
    host copy's placement): a resumed full fine-tuning, or one started from an SFT checkpoint, held the whole model,
    its gradients, its moments and its EMA reference on each chip. They are split over the mesh again, as before the
    save."""
    import tempfile

    env = {**os.environ, "PJRT_DEVICE": "CPU", "CPU_NUM_DEVICES": "2"}
    with tempfile.TemporaryDirectory() as tmp:
        proc = subprocess.run([sys.executable, "-c", RESUME_ON_MESH, f"{tmp}/checkpoint"], capture_output=True,
                              text=True, env=env, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    report = json.loads(proc.stdout.strip().splitlines()[-1])
    assert len(report["split"]) >= 10
    assert all("devices=[2,1]" in spec for spec in report["after"].values()), report["after"]
    assert all("devices=[2,1]" in spec for spec in report["moments"].values()), report["moments"]
    assert all("devices=[2,1]" in spec for spec in report["reference"].values()), report["reference"]
    # the frozen reference is made split like the policy (the planner counts a share of it per chip)
    assert all("devices=[2,1]" in spec for spec in report["reference_as_made"].values()), report["reference_as_made"]


def test_compile_monitor_names_the_phase_and_shape_that_recompiled():
    xla = get_device("xla")
    monitor = CompileMonitor()
    kept = []  # a lazy result must stay alive to be computed at the sync
    for _ in range(2):
        with monitor.phase("double", rows=3):
            kept.append((torch.ones(3, 7, device=xla) * 2).sum())
            mark_step(xla)
    monitor.end_warmup()
    with pytest.warns(RuntimeWarning, match=r"phase 'double' with \{'rows': 5\} — a shape not seen before"):
        with monitor.phase("double", rows=5):
            kept.append((torch.ones(5, 7, device=xla) * 2).sum())
            mark_step(xla)
    assert monitor.recompiles_after_warmup >= 1
    assert monitor.metrics()["xla_recompiles_after_warmup"] == monitor.recompiles_after_warmup


@pytest.mark.parametrize("name", ["tiny-gemma", "tiny-gemma-4"])
def test_lora_rollouts_on_xla_compile_once_and_match_eager(task, name):
    """The TPU path trains LoRA: its rollouts apply the adapters from their tensors (`decoder.linear_parts`,
    q/k/v fused with the LoRA inside; on Gemma 4 also its KV-shared layers reading an earlier layer's cache entry and
    the per-layer embeddings). On XLA that compiles a fixed set of graphs once — none on the next rollout, nothing
    falls back to the CPU — and draws the eager CPU sampler's tokens."""
    import torch_xla.debug.metrics as met

    from grpo_kit.data.chat import stop_token_ids
    from grpo_kit.engine.model_config import ModelConfig
    from grpo_kit.engine.models import load_model
    from grpo_kit.engine.sampling import SamplerSettings, encode_prompts, sample

    model, tok = load_model(ModelConfig(name=name, dtype="float32", lora=True), torch.device("cpu"))
    with torch.no_grad():  # a LoRA that does something (B starts at zero)
        for name, p in model.named_parameters():
            if "lora_B" in name:
                p.normal_(0, 0.05)
    ids, mask = encode_prompts(tok, list(task.test_set()["prompt"][:4]), bucket=16)
    ids, mask = ids.repeat_interleave(4, 0), mask.repeat_interleave(4, 0)
    settings, tokens_at = SamplerSettings(max_new_tokens=16, temperature=1.0), {"stop_ids": stop_token_ids(tok),
                                                                                   "pad_id": tok.pad_token_id}
    eager = sample(model, ids, mask, settings, **tokens_at, generator=torch.Generator().manual_seed(0), group_size=4)
    model = move_model(model, get_device("xla"))

    def compiles() -> int:
        data = met.metric_data("CompileTime")
        return data[0] if data else 0

    def fallbacks() -> dict[str, int]:  # ops run on the CPU instead (counters are per process: compare)
        return {name: met.counter_value(name) for name in met.counter_names() if name.startswith("aten::")}

    counts, fallbacks_before = [], fallbacks()
    for _ in range(2):
        before = compiles()
        roll = sample(model, ids, mask, settings, **tokens_at, generator=torch.Generator().manual_seed(0), group_size=4)
        tokens, logprobs = roll.completion_ids.cpu(), roll.sampling_logprobs.cpu()
        counts.append(compiles() - before)
    assert counts[0] > 0 and counts[1] == 0, counts
    assert fallbacks() == fallbacks_before
    assert torch.equal(tokens, eager.completion_ids)
    assert (logprobs - eager.sampling_logprobs).abs().max() < 1e-5


def test_dashboard_moves_after_warm_up_compile_nothing_new(task):
    """The live controls on a TPU: β 0 → 0.5 and temperature 1.0 → 0.3 after warm-up (XLA would bake the numbers
    0 and 1 into a graph), and a batch of shorter prompts than before, all reuse the compiled programs."""
    import dataclasses

    from grpo_kit.data.rewards import DEFAULT_REWARDS, DEFAULT_WEIGHTS
    from grpo_kit.engine.model_config import ModelConfig
    from grpo_kit.engine.models import load_model
    from grpo_kit.train.config import GRPOConfig
    from grpo_kit.train.grpo import GRPOTrainer

    model, tok = load_model(ModelConfig(dtype="float32"), torch.device("cpu"))
    model = move_model(model, get_device("xla"))
    prompts = task.prompt_stream()
    longest_first = sorted((next(prompts) for _ in range(40)), key=lambda r: -len(str(r["prompt"])))
    cfg = GRPOConfig(steps=6, prompts_per_step=4, group_size=4, micro_batch_size=16, max_new_tokens=12, beta=0.0,
                     temperature=1.0, learning_rate=1e-4, warmup_steps=0, output_dir=None, log_completions=0,
                     reward_weights=DEFAULT_WEIGHTS, compile_warmup_steps=2)
    trainer = GRPOTrainer(model, tok, DEFAULT_REWARDS, iter(longest_first), dataclasses.replace(cfg))
    trainer.train(3, progress=False)
    trainer.controls.update(beta=0.5, temperature=0.3)
    after = trainer.train(6, progress=False)[3:]
    assert [r["xla_recompiles_step"] for r in after] == [0, 0, 0], [r.get("graphs_per_phase") for r in after]
    assert after[-1]["beta"] == 0.5 and abs(after[-1]["temperature"] - 0.3) < 1e-9


def test_the_presets_grpo_recipe_runs_on_xla_without_recompiling(task):
    """The TPU presets run `config.GRPO_RECIPE`: gated shaped rewards and difficulty targeting are host-side (the
    rewards, the pass rates, which prompts a step keeps), so after warm-up a step compiles nothing new."""
    from grpo_kit.data.rewards import DEFAULT_REWARDS, DEFAULT_WEIGHTS
    from grpo_kit.engine.model_config import ModelConfig
    from grpo_kit.engine.models import load_model
    from grpo_kit.train.config import GRPO_RECIPE, GRPOConfig
    from grpo_kit.train.grpo import GRPOTrainer

    model, tok = load_model(ModelConfig(dtype="float32"), torch.device("cpu"))
    model = move_model(model, get_device("xla"))
    stream = task.prompt_stream()
    rows = ({**row, "level": f"{len(str(row['answer']))} digits"} for row in stream)
    cfg = GRPOConfig(steps=5, prompts_per_step=4, group_size=4, micro_batch_size=16, max_new_tokens=12, beta=0.0,
                     temperature=1.0, learning_rate=1e-4, warmup_steps=0, output_dir=None, log_completions=0,
                     reward_weights=DEFAULT_WEIGHTS, compile_warmup_steps=2, **GRPO_RECIPE)
    trainer = GRPOTrainer(model, tok, DEFAULT_REWARDS, rows, cfg)
    history = trainer.train(5, progress=False)
    assert [r["xla_recompiles_step"] for r in history[2:]] == [0, 0, 0], [r.get("graphs_per_phase") for r in history]
    assert history[-1]["level_pass_rates"] and trainer.difficulty.draws >= 5 * 4


def test_activation_checkpointing_runs_on_xla_with_the_gradients_of_the_cpu():
    """The two places the kit recomputes activations in the backward pass, on XLA: the chunked LM head of a
    ≥ 32k vocabulary (every real Gemma: `recompute`) and transformers' layer checkpointing
    (`ModelConfig.gradient_checkpointing`). torch's own checkpoint stops there with "module 'torch' has no
    attribute 'xla'"; the gradients must equal the CPU's."""
    from grpo_kit.engine.logprobs import HeadOptions, token_logprobs_and_entropy
    from grpo_kit.engine.model_config import ModelConfig
    from grpo_kit.engine.models import load_model

    xla = get_device("xla")
    gen = torch.Generator().manual_seed(0)
    hidden, weight = torch.randn(2, 8, 16, generator=gen), torch.randn(32768, 16, generator=gen) * 0.1
    ids = torch.randint(0, 32768, (2, 8), generator=gen)
    grads = []
    for device in (torch.device("cpu"), xla):
        h, w = hidden.to(device).detach().requires_grad_(), weight.to(device).detach().requires_grad_()
        logp, entropy = token_logprobs_and_entropy(h, w, ids.to(device), options=HeadOptions(recompute=True))
        (logp.sum() + entropy.sum()).backward()
        mark_step(device)
        grads.append((logp.detach().cpu(), h.grad.cpu(), w.grad.cpu()))
    for a, b in zip(*grads, strict=True):
        assert torch.allclose(a, b, atol=1e-4, rtol=1e-4)

    tokens = torch.tensor([[2, 10, 11, 12, 13, 14, 15, 16]])
    layer_grads = []
    for device in (torch.device("cpu"), xla):
        model, _ = load_model(ModelConfig(gradient_checkpointing=True, dtype="float32"), device)
        model.train()
        loss = model(input_ids=tokens.to(device), labels=tokens.to(device), use_cache=False).loss
        loss.backward()
        mark_step(device)
        layer_grads.append(model.model.layers[0].mlp.up_proj.weight.grad.cpu())
    assert layer_grads[0].abs().sum() > 0 and torch.allclose(*layer_grads, atol=1e-5)


SFT_ON_MESH = """
import json, sys, torch
from grpo_kit.engine.device import enable_spmd, get_device
devices = int(sys.argv[1])
if devices > 1:
    enable_spmd(devices)
import torch_xla
import grpo_kit.engine.logprobs
grpo_kit.engine.logprobs.LOGIT_CHUNK_ELEMENTS = 8 * 106  # the LM head in chunks, as Gemma's ≥ 32k vocabulary has it
from grpo_kit.engine.model_config import ModelConfig
from grpo_kit.train.config import SFTConfig
from grpo_kit.engine.models import load_model
from grpo_kit.train.sft import SFTTrainer
from grpo_kit.data.tasks import ArithmeticTask
from grpo_kit.validation import ConfigError
model, tok = load_model(ModelConfig(dtype="float32"), get_device("xla"))
rows = ArithmeticTask(num_demonstrations=32).demonstrations()
trainer = SFTTrainer(model, tok, rows, SFTConfig(steps=3, batch_size=8, output_dir=None))
spec = torch_xla._XLAC._get_xla_sharding_spec(trainer._next_batch()["input_ids"])
losses = [trainer.train_step()["loss"] for _ in range(3)]
try:
    SFTTrainer(model, tok, rows, SFTConfig(batch_size=6, output_dir=None))
    refused = ""
except ConfigError as e:
    refused = str(e)
print(json.dumps({"spec": spec, "losses": losses, "refused": refused}))
"""


def test_sft_under_spmd_splits_its_batch_over_the_devices_and_matches_one_device():
    """SFT's batch is data parallel over an 8-device mesh (each device its share of the rows, as GRPO's), with the
    1-device losses, its LM head in chunks (cut by position on XLA: chunks of the split batch's rows stopped the
    process in XLA's SPMD partitioner); a batch size that does not split is refused naming the setting."""
    runs = {}
    for devices in (1, 8):
        env = {**os.environ, "PJRT_DEVICE": "CPU", "CPU_NUM_DEVICES": str(devices)}
        proc = subprocess.run(
            [sys.executable, "-c", SFT_ON_MESH, str(devices)], capture_output=True, text=True, env=env, timeout=900
        )
        assert proc.returncode == 0, proc.stderr[-3000:]
        runs[devices] = json.loads(proc.stdout.strip().splitlines()[-1])
    assert "devices=[8,1]" in runs[8]["spec"], runs[8]["spec"]
    assert runs[1]["spec"] == "" and runs[1]["refused"] == ""
    assert runs[8]["refused"].startswith("SFTConfig.batch_size=6 cannot be split over the 8 devices")
    assert max(abs(a - b) for a, b in zip(runs[1]["losses"], runs[8]["losses"], strict=True)) <= 1e-4


RFT_ON_MESH = """
import json, torch
from grpo_kit.engine.device import enable_spmd, get_device
enable_spmd(8)
import torch_xla
import grpo_kit.train.rft as rft
from grpo_kit.engine.model_config import ModelConfig
from grpo_kit.train.config import RFTConfig
from grpo_kit.engine.models import load_model
from grpo_kit.data.tasks import ArithmeticTask

def three_accepted(rows, texts, **_):  # a step keeps 3 of its 8 samples: a row count the mesh cannot split
    return [{"prompt": rows[0]["prompt"], "completion": t or "1"} for t in texts[:3]]

rft.accepted_completions = three_accepted
model, tok = load_model(ModelConfig(dtype="float32"), get_device("xla"))
trainer = rft.RFTTrainer(model, tok, iter(ArithmeticTask().prompt_stream()),
                         RFTConfig(steps=2, prompts_per_step=2, group_size=4, max_new_tokens=8, output_dir=None))
batch = trainer._next_batch()
spec, rows = torch_xla._XLAC._get_xla_sharding_spec(batch["input_ids"]), batch["input_ids"].shape[0]
print(json.dumps({"spec": spec, "rows": rows, "losses": [trainer.train_step()["loss"] for _ in range(2)]}))
"""


def test_rft_under_spmd_grows_its_accepted_batch_to_split_over_the_devices():
    """RFT keeps a varying number of accepted completions per step; on an 8-device mesh its batch is grown to
    prompts × group rows (no target tokens in the added ones) and split over the devices, as SFT's is."""
    env = {**os.environ, "PJRT_DEVICE": "CPU", "CPU_NUM_DEVICES": "8"}
    proc = subprocess.run([sys.executable, "-c", RFT_ON_MESH], capture_output=True, text=True, env=env, timeout=900)
    assert proc.returncode == 0, proc.stderr[-3000:]
    run = json.loads(proc.stdout.strip().splitlines()[-1])
    assert "devices=[8,1]" in run["spec"] and run["rows"] == 8, run
    assert all(loss > 0 for loss in run["losses"]), run


LOGPROBS_ON_MESH = """
import json, sys, torch
from grpo_kit.engine.device import enable_spmd, get_device, mark_step, shard_batch
enable_spmd(8)
from grpo_kit.engine.logprobs import HeadOptions, token_logprobs_and_entropy
gen = torch.Generator().manual_seed(0)
hidden, weight = torch.randn(16, 12, 32, generator=gen), torch.randn(40_960, 32, generator=gen) * 0.3
ids, coef = torch.randint(0, 40_960, (16, 12), generator=gen), torch.randn(16, 12, generator=gen)
xla = get_device("xla")
h = shard_batch(hidden.to(xla)).requires_grad_()
w = weight.to(xla).requires_grad_()
# one row's logits per device at a time: 2 chunks of 6 positions (2 rows on each of the 8 devices)
logp, entropy = token_logprobs_and_entropy(h, w, ids.to(xla), temperature=0.9, options=HeadOptions(chunk_rows=1))
((logp * coef.to(xla)).sum() + entropy.sum()).backward()
mark_step(xla)
values = {"logp": logp, "entropy": entropy, "grad_hidden": h.grad, "grad_weight_rows": w.grad.cpu()[ids.flatten()],
          "grad_weight_norm": w.grad.norm()}
print(json.dumps({k: v.detach().cpu().tolist() for k, v in values.items()}))
"""


@pytest.mark.skipif(not xla_available(), reason="torch_xla not installed")
def test_lm_head_chunks_on_an_spmd_mesh_run_and_match_the_cpu():
    """Gemma's vocabulary (≥ 32k) makes the LM head run in chunks, recomputed in the backward pass. On an 8-device
    mesh, with the batch split over the devices, the chunks are cut by position (`logprobs.logit_chunks`): chunks of
    rows stopped the process in XLA's SPMD partitioner. Values and gradients equal the CPU's."""
    from grpo_kit.engine.logprobs import HeadOptions, token_logprobs_and_entropy

    env = {**os.environ, "PJRT_DEVICE": "CPU", "CPU_NUM_DEVICES": "8"}
    proc = subprocess.run(
        [sys.executable, "-c", LOGPROBS_ON_MESH], capture_output=True, text=True, env=env, timeout=900
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    got = {k: torch.tensor(v) for k, v in json.loads(proc.stdout.strip().splitlines()[-1]).items()}
    gen = torch.Generator().manual_seed(0)
    hidden, weight = torch.randn(16, 12, 32, generator=gen), torch.randn(40_960, 32, generator=gen) * 0.3
    ids, coef = torch.randint(0, 40_960, (16, 12), generator=gen), torch.randn(16, 12, generator=gen)
    hidden.requires_grad_(), weight.requires_grad_()
    logp, entropy = token_logprobs_and_entropy(hidden, weight, ids, temperature=0.9, options=HeadOptions(chunk_rows=1))
    ((logp * coef).sum() + entropy.sum()).backward()
    want = {"logp": logp, "entropy": entropy, "grad_hidden": hidden.grad,
            "grad_weight_rows": weight.grad[ids.flatten()], "grad_weight_norm": weight.grad.norm()}
    for name, value in want.items():  # the norm sums 1.3M squares: XLA's order and exp differ in the 4th digit
        rtol = 1e-3 if name == "grad_weight_norm" else 1e-4
        assert torch.allclose(got[name], value.detach(), atol=1e-4, rtol=rtol), (name, (got[name] - value).abs().max())


def test_logit_chunks_cut_rows_off_xla_and_positions_on_it(monkeypatch):
    from grpo_kit.engine import logprobs

    monkeypatch.setattr(logprobs, "LOGIT_CHUNK_ELEMENTS", 2 * 10 * 1000)
    rows, dim = logprobs.logit_chunks((5, 10), 1000)
    assert dim == 0 and [c[0] for c in rows] == [slice(0, 2), slice(2, 4), slice(4, 6)]
    monkeypatch.setattr(logprobs, "data_parallel_size", lambda: 4)
    columns, dim = logprobs.logit_chunks((8, 10), 1000, xla=True)  # 2 rows per device: 10 positions per chunk
    assert dim == 1 and [c for c in columns] == [(slice(None), slice(0, 10))]
    monkeypatch.setattr(logprobs, "data_parallel_size", lambda: 1)
    columns, dim = logprobs.logit_chunks((8, 10), 1000, xla=True)  # 8 rows on one device: 2 positions per chunk
    assert [c[1] for c in columns] == [slice(s, s + 2) for s in range(0, 10, 2)]
    columns, dim = logprobs.logit_chunks((8, 10), 1000, chunk_rows=4, xla=True)  # 4 rows' worth: 5 positions of 8
    assert [c[1] for c in columns] == [slice(0, 5), slice(5, 10)]
