"""The course around the kit: the whole arc `grpo-kit demo` runs (`arc`), its stage names (`stages`), the quick and
full modes and time headers (`modes`), the notebooks' helpers (`notebook`), exercises and quizzes (`exercises`,
`quizzes`), the live dashboard (`dashboard`) and the plots (`plots`).

Import rule: any part of the package below it; nothing in the package imports the course except its two entry
points, `grpo_kit/__init__.py` (the `gk.*` names) and `cli.py` (`grpo-kit demo`).
"""
