"""The trainers and what a run needs around them: the settings (`config`), live controls (`controls`), the
training loop every trainer shares (`loop`: resume, budgets, metrics, checkpoints), GRPO (`grpo`), SFT (`sft`),
rejection-sampling fine-tuning (`rft`), the metrics rows and trackers (`metrics`, `trackers`), crash-safe
checkpoints (`checkpoint`) and the ownership of output directories (`rundir`).

Import rule: the foundations, `algo`, `data` and `engine`; never `eval` or `course`.
"""
