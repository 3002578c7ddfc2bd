"""What device.py decides from the runtime: a TPU machine needs a working torch_xla that matches torch, and
says how to get one; nothing falls back to the host CPU silently."""

from __future__ import annotations

import functools
import importlib.metadata
import subprocess
import sys

import pytest
import torch

from grpo_kit.engine import device as device_module
from grpo_kit.engine.device import SetupError, get_device, padded_rows, xla_problem


def fake_versions(monkeypatch, **versions):
    real = importlib.metadata.version

    def version(name: str) -> str:
        key = name.replace("-", "_").lower()
        if key in versions:
            if versions[key] is None:
                raise importlib.metadata.PackageNotFoundError(name)
            return versions[key]
        return real(name)

    monkeypatch.setattr(importlib.metadata, "version", version)


@pytest.mark.parametrize(("installed", "starts", "also"), [
    (None, "torch_xla is not installed: run  %pip install 'torch_xla[tpu]~=2.9.0'", "restart"),
    ("2.8.0", "torch_xla 2.8.0 does not match torch 2.9.0: run  %pip install "
              "'torch_xla[tpu]~=2.9.0'", "install torch 2.8"),
])
def test_a_missing_or_mismatched_torch_xla_is_named_with_its_fix(monkeypatch, installed, starts, also):
    monkeypatch.setattr(torch, "__version__", "2.9.0+cpu")
    fake_versions(monkeypatch, torch_xla=installed)
    problem = xla_problem()
    assert problem.startswith(starts) and also in problem


def test_a_mismatched_pair_stops_the_import_of_the_kit(monkeypatch):
    """transformers imports an installed torch_xla on its own, so `import grpo_kit` checks the pair first."""
    import importlib

    import grpo_kit

    monkeypatch.setattr(torch, "__version__", "2.8.0+cpu")
    fake_versions(monkeypatch, torch_xla="2.9.0")
    with pytest.raises(
        SetupError, match=r"^torch_xla 2.9.0 does not match torch 2.8.0: run  %pip install 'torch_xla\[tpu\]~=2.8.0'"
    ):
        importlib.reload(grpo_kit)
    fake_versions(monkeypatch, torch_xla=None)
    assert device_module.torch_xla_mismatch() is None
    importlib.reload(grpo_kit)


def test_a_tpu_runtime_without_torch_xla_is_an_error_not_the_host_cpu(monkeypatch):
    monkeypatch.setenv("TPU_ACCELERATOR_TYPE", "v5litepod-8")
    monkeypatch.delenv("GRPO_KIT_DEVICE", raising=False)
    monkeypatch.setattr(device_module, "xla_problem", lambda: "torch_xla is not installed: run  %pip install 'x'")
    with pytest.raises(
        SetupError, match=r"^this is a TPU runtime, but torch_xla is not installed: run  %pip install 'x'$"
    ):
        get_device()
    with pytest.raises(SetupError, match="device 'xla' asked for, but torch_xla is not installed"):
        get_device("xla")
    assert get_device("cpu").type == "cpu"  # asked for by name, the CPU is still there


def test_setup_errors_show_one_line_in_jupyter():
    """IPython prints `_render_traceback_()` instead of the frames: the message and nothing else."""
    lines = SetupError("torch_xla 2.8.0 does not match torch 2.9.0: run …")._render_traceback_()
    assert len(lines) == 1 and "SetupError: torch_xla 2.8.0 does not match torch 2.9.0" in lines[0]


def test_the_stand_in_tpu_is_a_tpu_but_not_real_chips(monkeypatch):
    """Platform replicas set TPU_ACCELERATOR_TYPE with PJRT_DEVICE=CPU: the kit takes its TPU path (preset, XLA,
    SPMD) but does not open the persistent compile cache, which only real chips can read back."""
    monkeypatch.setenv("TPU_ACCELERATOR_TYPE", "v5litepod-1")
    monkeypatch.setenv("PJRT_DEVICE", "CPU")
    assert device_module.tpu_present() and not device_module.tpu_chips_attached()
    assert device_module.enable_compile_cache() is None
    monkeypatch.setenv("PJRT_DEVICE", "TPU")
    assert device_module.tpu_chips_attached()


def test_virtual_tpu_devices_counts_the_xla_cpu_devices_standing_in_for_a_board(monkeypatch):
    for name in ("TPU_ACCELERATOR_TYPE", "TPU_NAME", "PJRT_DEVICE", "CPU_NUM_DEVICES"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("TPU_ACCELERATOR_TYPE", "v5litepod-8")
    assert device_module.virtual_tpu_devices() == 0  # real chips
    monkeypatch.setenv("PJRT_DEVICE", "CPU")
    assert device_module.virtual_tpu_devices() == 1
    monkeypatch.setenv("CPU_NUM_DEVICES", "8")
    assert device_module.virtual_tpu_devices() == 8


def test_rows_are_padded_to_the_mesh_only_on_xla(monkeypatch):
    monkeypatch.setattr(device_module, "data_parallel_size", lambda: 8)
    assert [padded_rows(n, "xla") for n in (1, 3, 8, 9)] == [8, 8, 8, 16]
    assert padded_rows(3, "cpu") == 3


@pytest.mark.parametrize("variable, expected", [(None, "cores"), ("1", 1), ("3", 3), ("", "cores"), ("0", "cores"),
                                                ("two", "cores")])
def test_a_run_takes_omp_num_threads_where_it_is_set_else_every_core(monkeypatch, variable, expected):
    """`use_cpu_threads`: OMP_NUM_THREADS (a positive count) wins, so two runs (or test workers) can share a machine
    without each taking every core; anything else gives every core os.cpu_count() reports."""
    before = torch.get_num_threads()
    if variable is None:
        monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    else:
        monkeypatch.setenv("OMP_NUM_THREADS", variable)
    monkeypatch.setattr(device_module.os, "cpu_count", lambda: 2)
    try:
        count = device_module.use_cpu_threads()
        assert count == (2 if expected == "cores" else expected) == torch.get_num_threads()
    finally:
        torch.set_num_threads(before)


def test_importing_the_kit_flushes_denormals_on_every_cpu_thread():
    """`products.flush_denormals`: after `import grpo_kit` a product whose result is a denormal float is zero on every
    thread of a parallel op (without it, 1e-30 × 1e-10 is the denormal 1e-40, which CPUs compute with slowly)."""
    code = ("import torch, grpo_kit\n"
            "torch.set_num_threads(2)\n"
            "x = torch.full((1 << 22,), 1e-30) * torch.full((1 << 22,), 1e-10)\n"
            "print(int((x != 0).sum()))\n")
    bare = code.replace(", grpo_kit", "")
    run = functools.partial(subprocess.run, capture_output=True, text=True, check=True)
    assert run([sys.executable, "-c", bare]).stdout.split() == [str(1 << 22)]  # the check can fail
    assert run([sys.executable, "-c", code]).stdout.split() == ["0"]


def test_the_machine_record_tells_apart_cpus_that_share_a_model_name(monkeypatch):
    """A VM's /proc/cpuinfo names a Zen 3 and a Zen 4 alike ("AMD EPYC"); the family and model numbers differ."""
    for family_model, fields in (("25/1", {"cpu family": "25", "model": "1"}),
                                 ("25/17", {"cpu family": "25", "model": "17"})):
        cpuinfo = {"model name": "AMD EPYC", **fields}
        monkeypatch.setattr(device_module, "cpuinfo_field", lambda name, c=cpuinfo: c.get(name, ""))
        machine = device_module.describe_machine()
        assert (machine["cpu_model"], machine["cpu_family_model"]) == ("AMD EPYC", family_model)
    monkeypatch.setattr(device_module, "cpuinfo_field", lambda name: "")  # no /proc/cpuinfo: neither is claimed
    assert "cpu_family_model" not in device_module.describe_machine()
