"""A cache entry names the question and the code that computed it (issue 34): an entry read under
another key (two entries swapped, one copied or linked from another cache) is ignored with one
warning, re-simulated and overwritten, and only regular files inside the cache's folder are
read."""
from __future__ import annotations

import json
import os
from pathlib import Path

from provisioner.evaluate import code_fingerprint
from provisioner.runner import DiskCache
from provisioner.study import Outcome

GOOD = Outcome(True, True, "", (("ttft_p50", 0.5, 2.0),), 0.3, 12)
BAD = Outcome(False, True, "TTFT P50 2.5 > 2", (("ttft_p50", 2.5, 2.0),), -0.25, 12)
KEY, OTHER = "ab" + "1" * 62, "ab" + "2" * 62
CURVE = "time_s,rate_rps\n0,5\n600,10\n1200,20\n1800,8\n"
CURVE_SEARCH = ["--window", "600", "--designs", "splitwise-hh", "--jobs", "1"]


def _entry(cache: DiskCache, key: str) -> Path:
    return cache.directory / key[:2] / f"{key}.json"


def _warnings(text: str) -> list[str]:
    return [line for line in text.splitlines() if line.startswith("provision: warning:")]


def test_an_entry_records_its_key_the_code_and_the_question(tmp_path):
    cache = DiskCache(tmp_path)
    question = {"design": "splitwise-hh", "prompt_machines": 2, "token_machines": 1,
                "rate_rps": 4.0, "seed": 0}
    cache.put(KEY, GOOD, question)
    record = json.loads(_entry(cache, KEY).read_text())
    assert record["key"] == KEY and record["code"] == code_fingerprint()
    assert record["question"] == question
    assert cache.get(KEY) == GOOD


def test_swapped_entries_are_ignored_with_one_warning(tmp_path, capsys):
    cache = DiskCache(tmp_path)
    cache.put(KEY, GOOD)
    cache.put(OTHER, BAD)
    first, second = _entry(cache, KEY), _entry(cache, OTHER)
    texts = first.read_text(), second.read_text()
    first.write_text(texts[1])
    second.write_text(texts[0])
    assert cache.get(KEY) is None and cache.get(OTHER) is None
    warnings = _warnings(capsys.readouterr().err)
    assert len(warnings) == 1 and "another question" in warnings[0], warnings
    cache.put(KEY, GOOD)   # re-simulated and overwritten
    assert cache.get(KEY) == GOOD


def test_an_entry_from_other_code_is_ignored(tmp_path, capsys):
    cache = DiskCache(tmp_path)
    cache.put(KEY, GOOD)
    record = json.loads(_entry(cache, KEY).read_text())
    _entry(cache, KEY).write_text(json.dumps({**record, "code": "0" * 16}))
    assert cache.get(KEY) is None
    assert "another question" in capsys.readouterr().err


def test_a_link_to_another_cache_is_never_read(tmp_path, capsys):
    """Even one holding a valid record for the very key: only regular files inside the folder
    are read; the link is replaced by the re-simulated entry, the other cache left alone."""
    other = DiskCache(tmp_path / "other")
    other.put(KEY, BAD)
    before = _entry(other, KEY).read_text()
    cache = DiskCache(tmp_path / "cache")
    _entry(cache, KEY).parent.mkdir(parents=True)
    os.symlink(_entry(other, KEY), _entry(cache, KEY))
    assert cache.get(KEY) is None and cache.damaged == 1
    warnings = _warnings(capsys.readouterr().err)
    assert len(warnings) == 1 and "regular file inside the cache folder" in warnings[0]
    cache.put(KEY, GOOD)
    assert not _entry(cache, KEY).is_symlink() and cache.get(KEY) == GOOD
    assert _entry(other, KEY).read_text() == before


def test_a_linked_subfolder_is_never_read_nor_written(tmp_path, capsys):
    other = DiskCache(tmp_path / "other")
    other.put(KEY, BAD)
    before = sorted(p.name for p in _entry(other, KEY).parent.iterdir())
    cache = DiskCache(tmp_path / "cache")
    cache.directory.mkdir()
    os.symlink(_entry(other, KEY).parent, cache.directory / KEY[:2])
    assert cache.get(KEY) is None and cache.damaged == 1
    assert "regular file inside the cache folder" in capsys.readouterr().err
    cache.put(OTHER, GOOD)
    assert sorted(p.name for p in _entry(other, KEY).parent.iterdir()) == before
    assert other.get(KEY) == BAD


def _records(folder: Path) -> dict[Path, dict]:
    return {path: json.loads(path.read_text()) for path in sorted(folder.glob("*/*.json"))}


def _met(record: dict) -> bool:
    return record.get("outcome", record)["meets_slos"]


def test_a_search_on_swapped_entries_warns_and_keeps_its_answer(tmp_path, cli):
    """Every feasible entry of a load-curve search swapped with an infeasible one: it used to
    read them as they were and size the static cluster at 6P+3T ($342/h) instead of 6P+1T
    ($266/h), with no warning. Now it reads none of them (one warning), simulates them again
    and finds the answer it found on an empty cache."""
    (tmp_path / "curve.csv").write_text(CURVE)
    cache = tmp_path / "cache"
    search = ["search", "--load-curve", tmp_path / "curve.csv", *CURVE_SEARCH,
              "--cache-dir", cache]
    first = cli([*search, "--out", tmp_path / "first"])
    assert first.code == 0 and not _warnings(first.stderr), first.stderr
    records = _records(cache)
    met = [path for path, record in records.items() if _met(record)]
    missed = [path for path, record in records.items() if not _met(record)]
    assert met and missed, "the search simulated no point on each side of the SLOs"
    for a, b in zip(met, missed):
        text = a.read_text()
        a.write_text(b.read_text())
        b.write_text(text)
    again = cli([*search, "--out", tmp_path / "again"])
    assert again.code == 0, again.stderr
    warnings = _warnings(again.stderr)
    assert len(warnings) == 1 and "another question" in warnings[0], again.stderr
    reports = [json.loads((tmp_path / name / "report.json").read_text())
               for name in ("first", "again")]
    for section in ("designs", "load_curve"):
        assert reports[0][section] == reports[1][section], section
    for path, record in _records(cache).items():   # every entry read was overwritten
        assert record["key"] == path.stem


def test_the_default_cache_is_per_project_under_the_platform_cache(tmp_path, monkeypatch):
    """Issue 40: the evaluation cache sat in ~/.cache/provision for every project; now a
    folder per project (the nearest folder up with .git, pyproject.toml or provision.yaml)
    under the platform's user cache folder (XDG_CACHE_HOME on Linux)."""
    from provisioner.runner import default_cache_dir, project_root
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    one, two = tmp_path / "one", tmp_path / "two"
    (one / "specs" / "deep").mkdir(parents=True)
    (one / "pyproject.toml").write_text("")
    (two / ".git").mkdir(parents=True)
    assert project_root(one / "specs" / "deep") == one.resolve()
    first, second = default_cache_dir(one / "specs" / "deep"), default_cache_dir(two)
    assert first == default_cache_dir(one)          # anywhere inside the project: the same
    assert first != second
    for folder, name in ((first, "one"), (second, "two")):
        assert folder.parent == tmp_path / "xdg" / "provision" / "projects"
        assert folder.name.startswith(name + "-")
