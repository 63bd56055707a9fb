"""Every example in the documentation is checked (issue 40).

A `console` block of README.md or a docs/ page is an example: `$ COMMAND` lines (a line ending
in `\\` continues on the next), each followed by the output it prints. The line just above the
block (in the page source: an HTML comment, not shown on the site or on GitHub) says which kind
it is:

- `<!-- checked -->`: this test runs every command of the block, in order, in one fresh folder
  (with `examples/` and `tests/` of the checkout linked into it, so the paths read as from the
  repository root; `provision` is `python -m provisioner.cli` on the checkout's sources; a fresh
  evaluation cache; 120 columns) and compares what each prints on stdout with the lines shown.
  A line `...` stands for any number of lines left out (so a block may show an excerpt);
  otherwise lines match exactly, after the normalization below (timings, the folder's path).
  Keep these cheap: a few seconds each, as the whole suite runs on 2 cores.
- `<!-- not checked: WHY -->`: too long for the test suite, or it needs data outside the
  repository (`../shared`); WHY says which.

A `console` block with neither marker fails `test_every_console_example_says_whether_it_is_checked`.
"""
from __future__ import annotations

import os
import re
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
PAGES = [REPO / "README.md", *sorted((REPO / "docs").glob("*.md"))]
CHECKED = "<!-- checked -->"
NOT_CHECKED = re.compile(r"^<!-- not checked: \S.* -->$")
FENCE = re.compile(r"^( *)```console\s*$")
# what may differ between two runs of the same command: wall-clock rates and times, and the
# spelling of the command itself (`provision` installed, `python -m provisioner.cli` here)
NORMALIZE = [
    (re.compile(r"\(\d[\d,.]*/s over [\d.,]+ s\)"), "(N/s over T s)"),
    (re.compile(r"python -m provisioner\.cli"), "provision"),
]


@dataclass(frozen=True)
class Block:
    page: str
    line: int                       # 1-based line of the opening fence
    marker: str                     # the line above the fence, stripped
    steps: tuple[tuple[str, tuple[str, ...]], ...]   # (command, the output lines shown)

    def __str__(self) -> str:
        return f"{self.page}:{self.line}"


def parse_steps(body: list[str]) -> tuple[tuple[str, tuple[str, ...]], ...]:
    steps: list[tuple[str, list[str]]] = []
    i = 0
    while i < len(body):
        line = body[i]
        if line.startswith("$ "):
            command = line[2:]
            while command.endswith("\\") and i + 1 < len(body):
                i += 1
                command = command[:-1].rstrip() + " " + body[i].strip()
            steps.append((command, []))
        elif steps:
            steps[-1][1].append(line.rstrip())
        elif line.strip():
            raise AssertionError(f"output before any `$ ` command: {line!r}")
        i += 1
    out = []
    for command, shown in steps:
        while shown and not shown[-1]:
            shown.pop()
        out.append((command, tuple(shown)))
    return tuple(out)


def console_blocks() -> list[Block]:
    blocks = []
    for page in PAGES:
        lines = page.read_text().splitlines()
        i = 0
        while i < len(lines):
            match = FENCE.match(lines[i])
            if match:
                indent = len(match.group(1))
                end = i + 1
                while lines[end].strip() != "```":
                    end += 1
                body = [line[indent:] for line in lines[i + 1:end]]
                marker = lines[i - 1].strip() if i else ""
                blocks.append(Block(str(page.relative_to(REPO)), i + 1, marker,
                                    parse_steps(body)))
                i = end
            i += 1
    return blocks


BLOCKS = console_blocks()
CHECKED_BLOCKS = [block for block in BLOCKS if block.marker == CHECKED]


def normalize(text: str) -> list[str]:
    for pattern, replacement in NORMALIZE:
        text = pattern.sub(replacement, text)
    lines = [line.rstrip() for line in text.splitlines()]
    while lines and not lines[-1]:
        lines.pop()
    return lines


def matches(shown: tuple[str, ...], printed: list[str]) -> bool:
    """`shown` (with `...` for any lines left out) against every line `printed`."""
    pattern = "".join(r"(?:[^\n]*\n)*?" if line.strip() == "..." else re.escape(line) + r"\n"
                      for line in normalize("\n".join(shown)))
    text = "".join(line + "\n" for line in normalize("\n".join(printed)))
    return re.fullmatch(pattern, text) is not None


def test_the_documentation_has_checked_examples():
    assert len(BLOCKS) >= 10 and len(CHECKED_BLOCKS) >= 6, [str(b) for b in BLOCKS]
    readme = [block for block in CHECKED_BLOCKS if block.page == "README.md"]
    assert len(readme) >= 3, "the README's examples are checked"


def test_every_console_example_says_whether_it_is_checked():
    unmarked = [str(block) for block in BLOCKS
                if block.marker != CHECKED and not NOT_CHECKED.match(block.marker)]
    assert not unmarked, ("put `<!-- checked -->` or `<!-- not checked: why -->` on the line "
                          f"above each of these console blocks: {unmarked}")
    for block in BLOCKS:
        assert block.steps, f"{block}: a console block shows at least one `$ ` command"


def test_the_wildcard_matching():
    assert matches(("a", "...", "d"), ["a", "b", "c", "d"])
    assert matches(("a", "...", "d"), ["a", "d"])
    assert not matches(("a", "d"), ["a", "b", "d"])
    assert not matches(("a",), ["a", "b"])
    assert matches(("...", "c"), ["a", "b", "c"])
    assert matches(("x (12/s over 3.4 s)",), ["x (1,000/s over 0.1 s)"])
    assert matches((), [])


@pytest.mark.parametrize("block", CHECKED_BLOCKS, ids=str)
def test_checked_example(block, tmp_path):
    work = tmp_path / "work"
    work.mkdir()
    for name in ("examples", "tests"):
        (work / name).symlink_to(REPO / name, target_is_directory=True)
    env = dict(os.environ, PYTHONPATH=str(REPO), COLUMNS="120", LINES="50", NO_COLOR="1",
               TERM="dumb", XDG_CACHE_HOME=str(tmp_path / "cache"),
               PROVISION_PYTHON=sys.executable)
    env.pop("FORCE_COLOR", None)
    shell = 'provision() { "$PROVISION_PYTHON" -m provisioner.cli "$@"; }\n'
    for command, shown in block.steps:
        run = subprocess.run(["bash", "-c", shell + command], cwd=work, env=env,
                             capture_output=True, text=True, timeout=300)
        printed = normalize(run.stdout.replace(str(work) + os.sep, ""))
        assert run.returncode in (0, 1), f"{block}: `{command}` failed:\n{run.stderr}"
        assert matches(shown, printed), (
            f"{block}: `{command}` now prints (update the page, or mark the block "
            "`<!-- not checked: why -->`):\n" + "\n".join(printed)
            + ("\n-- stderr:\n" + run.stderr if run.stderr else ""))
