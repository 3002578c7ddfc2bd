"""The repository's own tools, outside the package and its wheel: the study (`tools/study.py`), the benchmark
(`tools/bench.py`), the smoke test (`tools/smoke.py`), and scripts run by hand on other machines
(`python -m tools.gpu_check`, `python -m tools.plan_vs_measured`, `python -m tools.rft_rate`).
`python -m tools --help` lists the commands the make targets run. They import the package as a user does;
nothing in the package imports them."""
