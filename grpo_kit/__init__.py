"""grpo_kit: learn and run GRPO on Gemma (SFT warm-up, reward design, GRPO) on TPU, GPU or CPU."""

from .device import SetupError, torch_xla_mismatch

_mismatch = torch_xla_mismatch()
if _mismatch:  # transformers would fail later, inside an import, with an undefined-symbol error
    raise SetupError(_mismatch)
