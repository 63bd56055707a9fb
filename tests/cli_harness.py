"""Run `provision` in-process (no interpreter start-up per case) the way `main()` runs it.

`invoke(args)` patches sys.argv, captures stdout/stderr, calls `provisioner.cli.main` and returns
(exit code, stdout, stderr). A few cases in the suites still use real subprocesses.
"""
from __future__ import annotations

import contextlib
import io
import os
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


@dataclass
class Outcome:
    code: int
    stdout: str
    stderr: str


def invoke(args: list[str], cwd: Path | None = None) -> Outcome:
    from provisioner.cli import main

    out, err = io.StringIO(), io.StringIO()
    old_argv, old_cwd = sys.argv, os.getcwd()
    sys.argv = ["provision", *map(str, args)]
    code = 0
    try:
        if cwd is not None:
            os.chdir(cwd)
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            try:
                main()
            except SystemExit as exit_:
                code = exit_.code if isinstance(exit_.code, int) else (0 if exit_.code is None
                                                                       else 1)
    finally:
        sys.argv = old_argv
        os.chdir(old_cwd)
    return Outcome(code, out.getvalue(), err.getvalue())


def run_subprocess(args: list[str], cwd: Path | None = None, timeout: float = 120,
                   env: dict | None = None) -> Outcome:
    proc = subprocess.run([sys.executable, "-m", "provisioner.cli", *map(str, args)],
                          capture_output=True, text=True, cwd=cwd or REPO, timeout=timeout,
                          env={**os.environ, **(env or {})})
    return Outcome(proc.returncode, proc.stdout, proc.stderr)


def assert_bad_input(outcome: Outcome, *names: str) -> str:
    """Exit 2, one line on stderr `provision: error: ...` naming every one of `names`, and no
    traceback anywhere."""
    assert outcome.code == 2, (outcome.code, outcome.stderr[-2000:], outcome.stdout[-500:])
    lines = outcome.stderr.splitlines()
    assert len(lines) == 1, outcome.stderr
    line = lines[0]
    assert line.startswith("provision: error: "), line
    assert "Traceback" not in outcome.stderr + outcome.stdout
    for name in names:
        assert str(name) in line, (name, line)
    return line
