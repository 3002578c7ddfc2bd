"""Judging and shipping a model: greedy and sampled accuracy with paired intervals (`evaluation`), the frozen
harness and the leaderboard (`scoring`), export and upload (`export`), the memory planner (`planner`) and the
XLA-against-eager check (`xla_check`).

Import rule: the foundations, `algo`, `data`, `engine` and `train`; never `course`.
"""
