"""Issue 27: the search progress's time left (ETA). It shows only after ETA_AFTER_S and once
some work is done, so short runs look as before; it counts the run's auxiliary searches
(--sensitivity, --load-curve, --survive-failures); it changes nothing but stderr."""
from __future__ import annotations

import io
import threading

import pytest
from rich.console import Console

import provisioner
from provisioner.api import planned_searches
from provisioner.chunked import progress_by_design
from provisioner.frontier import drive
from provisioner.study import Asked
from provisioner.terminal import ETA_AFTER_S, SearchProgress, eta_seconds

SMALL = dict(designs="splitwise-hh", model="llama2-70b", rate=10, duration=30, verify_seeds=2)


class Clock:
    """rich's clock, moved by hand."""

    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def _screen(progress: SearchProgress) -> str:
    """What the progress shows now, as plain text."""
    console = Console(file=io.StringIO(), width=120, color_system=None)
    console.print(progress._progress)
    return console.file.getvalue()


def test_eta_seconds_waits_for_the_threshold_and_for_some_work():
    assert ETA_AFTER_S == 3.0
    assert eta_seconds(2.99, 0.5) is None          # too early
    assert eta_seconds(10.0, 0.0) is None          # nothing done to go by
    assert eta_seconds(10.0, 1.0) is None          # done
    assert eta_seconds(4.0, 0.25) == pytest.approx(12.0)   # a quarter in 4 s: 12 s to go


def test_time_left_is_hidden_before_three_seconds_then_counts_down():
    clock, out = Clock(), io.StringIO()
    first, second = object(), object()   # two searches (the run's own, then a sensitivity one)
    with SearchProgress(["a", "b"], searches=2, clock=clock,
                        console=Console(file=out, width=120, color_system=None)) as progress:
        clock.now += 1.0
        progress.update(Asked({"a": 3, "b": 2}, {"a"}, first))   # a quarter done, after 1 s
        screen = _screen(progress)
        assert "left" not in screen and "searches" not in screen, screen
        assert len(screen.strip().splitlines()) == 2        # the design lines alone, as before

        clock.now += 1.9
        progress.update(Asked({"a": 5, "b": 4}, {"a", "b"}, first))   # half, after 2.9 s
        assert "left" not in _screen(progress)

        clock.now += 1.1   # 4 s: the second search has begun, its designs 2/5 and 1/4 along
        progress.update(Asked({"a": 2, "b": 1}, (), second))
        assert progress.fraction(frozenset()) == pytest.approx((1 + (2 / 5 + 1 / 4) / 2) / 2)
        screen = _screen(progress)
        # 4 s * (1 - 0.6625) / 0.6625 = 2.04 s
        assert "all 2 searches" in screen and "about 0:00:02 left" in screen, screen
        counts = [line.split(" evaluations")[0].split()[-1] for line in screen.splitlines()
                  if line.strip()]
        assert counts == ["7", "5", "12"], screen   # over both searches; the sum

        clock.now += 1.0   # no news for a second: the estimate counts down
        assert "about 0:00:01 left" in _screen(progress)
    final = out.getvalue()   # the last frame, on leaving: no estimate once it is over
    assert "all 2 searches" in final and "left" not in final, final


def test_a_short_run_shows_the_design_lines_alone():
    clock, out = Clock(), io.StringIO()
    with SearchProgress(["a", "b"], clock=clock,
                        console=Console(file=out, width=120, color_system=None)) as progress:
        for step in range(1, 6):
            clock.now += 0.5
            progress.update(Asked({"a": step, "b": 2 * step}, {"a"} if step > 2 else (), 1))
    lines = out.getvalue().strip().splitlines()
    assert len(lines) == 2 and "left" not in out.getvalue(), lines
    assert lines[0].split()[:2] == ["a", "5"] and lines[1].split()[:2] == ["b", "10"]


def _toy(name: str, steps: int):
    def search():
        for i in range(steps):
            yield [f"{name}{i}"]
        return name
    return search()


@pytest.mark.parametrize("concurrent", [False, True])
def test_drive_says_which_searches_finished(concurrent):
    seen, lock = [], threading.Lock()

    def on_batch(asked):
        with lock:
            seen.append((dict(asked), asked.finished, asked.search))

    run = lambda points: [None] * len(points)   # noqa: E731
    results = drive({"short": _toy("short", 1), "long": _toy("long", 3)}, run, on_batch,
                    concurrent)
    assert results == {"short": "short", "long": "long"}
    assert len({search for _, _, search in seen}) == 1   # one search, one object
    last_counts, last_finished, _ = seen[-1]
    assert last_counts == {"short": 1, "long": 3} and last_finished == {"short", "long"}
    assert any(f == {"short"} for _, f, _ in seen)        # the short one finished first
    again = []
    drive({"x": _toy("x", 1)}, run, lambda a: again.append(a.search))
    assert again[0] is not seen[0][2]                     # another search, another object


def test_budget_variants_finish_together_under_their_design():
    got = []
    update = progress_by_design(got.append, {"d@256": "d", "d@512": "d", "e": "e"})
    token = object()
    update(Asked({"d@256": 2, "d@512": 3, "e": 1}, {"d@256", "e"}, token))
    assert got[-1] == {"d": 5, "e": 1} and got[-1].finished == {"e"}
    assert got[-1].search is token
    update(Asked({"d@256": 2, "d@512": 4, "e": 1}, {"d@256", "d@512", "e"}, token))
    assert got[-1].finished == {"d", "e"}


@pytest.mark.parametrize("extra", [dict(sensitivity=True), dict(survive_failures=1)],
                         ids=["sensitivity", "survive-failures"])
def test_planned_searches_are_the_searches_a_run_reports(extra):
    """The ETA's whole: every auxiliary search reports its progress, and api.planned_searches
    counts them all."""
    searches = []
    result = provisioner.search(on_batch=lambda asked: searches.append(asked.search),
                                **SMALL, **extra)
    assert len(dict.fromkeys(searches)) == planned_searches(result.study) > 1


def test_the_progress_changes_no_result(tmp_path):
    """The same search with the progress shown and without: the same report."""
    options = dict(SMALL, sensitivity=True)
    quiet = provisioner.search(**options).to_dict()
    with SearchProgress(["splitwise-hh"], searches=7,
                        console=Console(file=io.StringIO(), width=120)) as progress:
        shown = provisioner.search(on_batch=progress.update, **options).to_dict()
    assert shown == quiet
