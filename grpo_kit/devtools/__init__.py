"""Developer tools, not the course's API: `grpo-kit bench` (the kit against HF generate and TRL), `grpo-kit smoke`
(a real Gemma end to end), `grpo-kit xla-check` (the XLA path against eager CPU), and the scripts run by hand
on other machines (`python -m grpo_kit.devtools.gpu_check`, `python -m grpo_kit.devtools.plan_vs_measured`).
They import the package; nothing in the package imports them."""
