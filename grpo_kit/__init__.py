"""grpo_kit: learn and run GRPO on Gemma (SFT warm-up, reward design, GRPO) on TPU, GPU or CPU."""

from .device import SetupError, torch_xla_mismatch

if torch_xla_mismatch():  # transformers would fail later, inside an import, with an undefined-symbol error
    raise SetupError(torch_xla_mismatch())
