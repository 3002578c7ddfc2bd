"""Shared fixtures. Tests use the embedded tiny Gemma (no hub access) on the CPU."""

from __future__ import annotations

import os

os.environ.setdefault("PJRT_DEVICE", "CPU")
# fp32 LM-head products in the CPU sampler, on every CPU: most tests compare the kit with fp32 references at 1e-4.
# The bf16 products (`products.product_dtype`) have their own tests, which turn them on.
os.environ.setdefault("GRPO_KIT_CPU_BF16", "0")
# The XLA CPU backend's LLVM at -O0 (XLA's graph passes still run; what the tests count — graphs, recompiles, ops
# that fall back to the CPU — and the 1e-4 agreement with eager do not change). The tests run tiny models for a few
# steps, so compiling is most of their time: alone on a 2-core Zen 3, `grpo-kit xla-check --devices 8 --steps 4`
# took 90 s instead of 163 (compiling 63 s instead of 139; a step 3.0 s instead of 2.5). Set before torch_xla
# starts, here and in every process the tests start (subprocesses and notebook kernels inherit it).
if "xla_backend_optimization_level" not in os.environ.get("XLA_FLAGS", ""):
    os.environ["XLA_FLAGS"] = f"{os.environ.get('XLA_FLAGS', '')} --xla_backend_optimization_level=0".strip()

import pytest  # noqa: E402
import torch  # noqa: E402

# the kernel-starting tests, and those sharing a costly fixture, each in one xdist process (hooks, found here by name)
from scheduling import pytest_runtest_setup, pytest_xdist_make_scheduler  # noqa: E402, F401

from grpo_kit.data.tasks import ArithmeticTask  # noqa: E402
from grpo_kit.engine.device import xla_available  # noqa: E402
from grpo_kit.engine.model_config import ModelConfig  # noqa: E402
from grpo_kit.engine.models import load_model  # noqa: E402

if xla_available():
    # torch_xla 2.9: a CPU .backward() before the first XLA device call breaks every later XLA backward in
    # the process, so touch the device before any test runs.
    import torch_xla

    torch_xla.device()


@pytest.fixture(autouse=True)
def fresh_held_out_splits():
    """Each test starts with no data task's held-out rows registered (in a user's process they accumulate: a
    question one loaded file holds out is refused in any training set)."""
    from grpo_kit.data import tasks

    tasks.HELD_OUT.clear()
    yield
    tasks.HELD_OUT.clear()


@pytest.fixture(scope="session")
def cpu() -> torch.device:
    return torch.device("cpu")


@pytest.fixture()
def tiny(cpu):
    """A freshly initialised tiny Gemma and its tokenizer (seed 0)."""
    return load_model(ModelConfig(), cpu)


@pytest.fixture(scope="session")
def task() -> ArithmeticTask:
    return ArithmeticTask(num_demonstrations=64, num_test=32)


@pytest.fixture(scope="session")
def sft_state(task, tmp_path_factory, worker_id):
    """Weights of the tiny Gemma after a short SFT warm-up (150 steps: ≈ 45 s), computed once per test run: under
    xdist by the first process that needs them, saved in the run's temporary folder, which its processes share, and
    read back by the others."""
    from filelock import FileLock

    from grpo_kit.train.config import SFTConfig
    from grpo_kit.train.sft import SFTTrainer

    def warmed_up() -> dict[str, torch.Tensor]:
        model, tok = load_model(ModelConfig(), torch.device("cpu"))
        SFTTrainer(model, tok, task.demonstrations(), SFTConfig(steps=150, batch_size=32, output_dir=None)).train(
            progress=False)
        return {k: v.clone() for k, v in model.state_dict().items()}

    if worker_id == "master":  # one process: nothing to share
        return warmed_up()
    path = tmp_path_factory.getbasetemp().parent / "sft_state.pt"  # this run's folder (each process has one inside)
    with FileLock(f"{path}.lock"):
        if not path.exists():
            torch.save(warmed_up(), path)
        return torch.load(path)


@pytest.fixture()
def sft_model(tiny, sft_state):
    """A fresh tiny Gemma loaded with the warmed-up weights."""
    model, tok = tiny
    model.load_state_dict(sft_state)
    return model, tok
