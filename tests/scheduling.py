"""How `make test` (`-n logical --dist loadgroup`) spreads the tests over its pytest-xdist processes. Each test is
its own unit of work, taken by whichever process is free, except two kinds of group, each run in one process in
collection order:

- **The tests that start Jupyter kernels**: the notebooks, because a later one loads an earlier one's checkpoint from
  `runs/` (as on a user's machine) and would otherwise rebuild it while the earlier one still writes it; and the tests
  marked `kernel` (a Jupyter server, a notebook client), so that no two kernels start at once.
- **The tests that share a costly module-scoped fixture** (`SHARED_FIXTURE_TESTS`): a module-scoped fixture is
  computed once in each process that runs one of its tests, so split over two processes it is computed twice
  (`one_device`, a 20-step GRPO run on XLA, took 174 and 182 s in the two processes of one run).

The groups are decided on the controller from the test's id, through xdist's scheduler hook. An `xdist_group` marker
is not enough: xdist appends the group to `item._nodeid`, which pytest 9.2 no longer reads (pytest-xdist issue 1386,
open), so marked tests spread over both processes, and notebook 06 would rebuild notebook 05's checkpoint while 05
still trains into the same folder. A test that the rules miss (marked `kernel`, or using a listed fixture, without
its id listed) fails before it runs."""

from __future__ import annotations

from typing import Any

import pytest

KERNEL_GROUP = "kernels"
KERNEL_TESTS = (
    "tests/browser/",
    "tests/test_notebooks.py::test_the_setup_notebook_shows_no_hub_token",
)
"""Ids (or their beginnings) of the tests marked `kernel`; notebooks (`.ipynb`) belong to the group anyway."""

SHARED_FIXTURE_TESTS: dict[str, tuple[str, ...]] = {
    "one_device": (
        "tests/test_xla.py::test_xla_grpo_20_steps_compiles_a_fixed_set_of_graphs",
        "tests/test_xla.py::test_xla_matches_eager_cpu",
        "tests/test_xla.py::test_graph_count_does_not_grow_with_max_new_tokens",
        "tests/test_xla.py::test_spmd_8_devices_matches_1_device",
    ),
}
"""A costly module-scoped fixture's name → the ids of every test that uses it (without parameters); each group
runs in one process, so its fixture is computed once."""


def starts_kernels(nodeid: str) -> bool:
    """Whether the test with this id starts Jupyter kernels: a notebook run by nbmake, or one of KERNEL_TESTS."""
    return nodeid.split("::", 1)[0].endswith(".ipynb") or nodeid.startswith(KERNEL_TESTS)


def scope_of(nodeid: str) -> str:
    """The unit of work this test belongs to: the kernel group, a shared fixture's group, or the test alone."""
    if starts_kernels(nodeid):
        return KERNEL_GROUP
    function = nodeid.split("[", 1)[0]
    return next((fixture for fixture, ids in SHARED_FIXTURE_TESTS.items() if function in ids), nodeid)


def pytest_runtest_setup(item: pytest.Item) -> None:
    """Fail a test that the rules miss, before it runs: one marked `kernel` that `starts_kernels` does not recognise
    (it would run beside the notebooks), or one that uses a fixture of SHARED_FIXTURE_TESTS without being listed
    under it (the fixture would be computed again in another process)."""
    if item.get_closest_marker("kernel") and not starts_kernels(item.nodeid):
        pytest.fail(
            f"{item.nodeid} is marked kernel but tests/scheduling.py's KERNEL_TESTS does not list it: add its id "
            "there so that it runs in the notebooks' test process",
            pytrace=False,
        )
    for fixture in set(SHARED_FIXTURE_TESTS) & set(getattr(item, "fixturenames", ())):
        if scope_of(item.nodeid) != fixture:
            pytest.fail(
                f"{item.nodeid} uses the fixture {fixture} but tests/scheduling.py's SHARED_FIXTURE_TESTS does not "
                f"list it under {fixture!r}: add its id there so that the fixture is computed once",
                pytrace=False,
            )


@pytest.hookimpl(optionalhook=True)  # an xdist hook: pytest without xdist runs the tests too
def pytest_xdist_make_scheduler(config: pytest.Config, log: Any) -> Any:
    """Under `--dist loadgroup`: xdist's scope scheduling with the scopes of `scope_of`."""
    if config.getvalue("dist") != "loadgroup":
        return None
    from xdist.scheduler import LoadScopeScheduling

    class GroupsInOneProcess(LoadScopeScheduling):
        def _split_scope(self, nodeid: str) -> str:
            return scope_of(nodeid)

    return GroupsInOneProcess(config, log)
