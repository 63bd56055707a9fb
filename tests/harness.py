"""The one way the suites run the `provision` command line (a plain module, not collected;
conftest.py hands these out as fixtures, and a test module may import them directly).

Subprocesses run the checkout's code whatever their working folder (PYTHONPATH), never an
installed copy that may be older.
"""
from __future__ import annotations

import contextlib
import io
import os
import subprocess
import sys
import textwrap
from dataclasses import dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


@dataclass
class Outcome:
    returncode: int
    stdout: str
    stderr: str

    @property
    def code(self) -> int:
        return self.returncode


def invoke(args: list, cwd: Path | None = None) -> Outcome:
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


def _run(command: list, cwd, env, timeout) -> Outcome:
    path = os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")]))
    proc = subprocess.run(command, capture_output=True, text=True, cwd=cwd or REPO,
                          timeout=timeout, env={**os.environ, "PYTHONPATH": path, **(env or {})})
    return Outcome(proc.returncode, proc.stdout, proc.stderr)


def run_cli(*args, cwd: Path | None = None, env: dict | None = None,
            timeout: float = 600) -> Outcome:
    """The one subprocess runner of the command line: `python -m provisioner.cli ARGS`."""
    return _run([sys.executable, "-m", "provisioner.cli", *map(str, args)], cwd, env, timeout)


def run_python(code: str, cwd: Path | None = None, env: dict | None = None,
               timeout: float = 600) -> Outcome:
    return _run([sys.executable, "-c", textwrap.dedent(code)], cwd, env, timeout)


def assert_bad_input(outcome: Outcome, *names: str) -> str:
    """Exit 2, one line on stderr `provision: error: ...` naming every one of `names`, and no
    traceback anywhere."""
    assert outcome.returncode == 2, (outcome.returncode, outcome.stderr[-2000:],
                                     outcome.stdout[-500:])
    lines = outcome.stderr.splitlines()
    assert len(lines) == 1, outcome.stderr
    line = lines[0]
    assert line.startswith("provision: error: "), line
    assert "Traceback" not in outcome.stderr + outcome.stdout
    for name in names:
        assert str(name) in line, (name, line)
    return line
