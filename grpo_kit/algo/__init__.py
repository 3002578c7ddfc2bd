"""The algorithm's math as pure tensor functions: group advantages and their estimators (`advantages`), the policy
losses and KL estimators (`losses`), and online difficulty targeting (`difficulty`). Each docstring gives its
formula; the estimators and losses are registered by name, and those registries are where `grpo_kit.options`
takes the names from.

Import rule: torch and the kit's foundations (`options`, `validation`) only — no model, tokenizer or trainer.
"""
