"""Shared fixtures, and the one way the suites run the `provision` command line.

* `cli(args, cwd=None)`: `provision ARGS` in-process, the way `main()` runs it (sys.argv patched,
  stdout/stderr captured, no interpreter start-up per case).
* `run_cli(*args, cwd=None, env=None, timeout=600)`: `python -m provisioner.cli ARGS` in a real
  subprocess (cwd: the checkout unless given; env: added to the current environment).
* `run_python(code, cwd=None, env=None, timeout=600)`: `python -c CODE` in a subprocess.
* `bad_input(outcome, *names)`: the bad-input contract (exit 2, one line on stderr naming every
  one of `names`, no traceback).

All of them return or take an `Outcome` (returncode, stdout, stderr). Test modules never import
each other: the runners live in tests/harness.py, shared strategies and simulator helpers in
tests/strategies.py, the synthetic search oracles in tests/oracles.py (plain modules, not
collected).
"""
from __future__ import annotations

from pathlib import Path

import pytest

from harness import REPO, assert_bad_input, invoke, run_cli, run_python


@pytest.fixture(scope="session")
def repo() -> Path:
    return REPO


@pytest.fixture(scope="session", name="cli")
def cli_fixture():
    return invoke


@pytest.fixture(scope="session", name="run_cli")
def run_cli_fixture():
    return run_cli


@pytest.fixture(scope="session", name="run_python")
def run_python_fixture():
    return run_python


@pytest.fixture(scope="session", name="bad_input")
def bad_input_fixture():
    return assert_bad_input
