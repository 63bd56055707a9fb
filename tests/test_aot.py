"""The install-time build of the fast core (simcore/aot.py): the same results as numba's JIT,
one signature per entry point whatever the run, and never used once its sources change."""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import types
from pathlib import Path

import pytest

import simcore
from simcore import aot, fast
from simcore.fast import compiler

ROOT = Path(__file__).resolve().parent.parent

# Runs every kind of simulation (both pool kinds, baseline, chunked, failures with both
# recoveries) through numba's JIT and, given a build, through the build too; prints each entry
# point's signatures and whether every returned array matched, dtype included.
COMPARE = r"""
import importlib.util, json, sys
import numpy as np
from hardware_catalog import load_catalog
from simcore import Cluster, fast, simulate
from simcore.cluster import SimOptions
from simcore.perfmodel import default_performance_model
from simcore.workload import synthesize
binding = sys.modules["simcore.simulate"]  # the package's `simulate` is the function
entries = sys.modules["simcore.fast.setup"]  # where simulate_fast finds the entry points

assert fast.CORE == "jit", fast.CORE
built = None
if len(sys.argv) > 1:
    spec = importlib.util.spec_from_file_location("simcore._core", sys.argv[1])
    built = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(built)
jit_entries = [getattr(entries, name) for name in fast.ENTRY_POINTS]

def run_with(chosen, workload, machines, steps=None):
    for name, entry in zip(fast.ENTRY_POINTS, chosen):
        setattr(entries, name, entry)
    try:
        return fast.simulate_fast(workload, machines, steps)
    finally:
        for name, entry in zip(fast.ENTRY_POINTS, jit_entries):
            setattr(entries, name, entry)

catalog, perf = load_catalog(), default_performance_model()
runs = [("splitwise-hh", 6, 2, SimOptions()), ("splitwise-ha", 5, 3, SimOptions()),
        ("baseline-h100", 8, 0, SimOptions(memory_reserve_fraction=0.5)),
        ("sarathi-a100", 8, 0, SimOptions()),
        ("splitwise-hh", 6, 2, SimOptions(kv_admission="paged")),
        ("baseline-h100", 8, 0, SimOptions(prefill_first=True, kv_admission="paged")),
        ("splitwise-aa", 6, 3, SimOptions(mtbf_hours=0.05, repair_s=20, failure_seed=1)),
        ("baseline-h100", 8, 0, SimOptions(mtbf_hours=0.05, repair_s=20, failure_seed=3,
                                           restart="regenerate")),
        ("splitwise-hh", 6, 3, SimOptions(mtbf_hours=0.05, repair_s=20, failure_seed=2,
                                          recovery="replicate", replica_target="peer"))]
calls = []
binding.simulate_fast = lambda w, m, steps=None: (calls.append((w, m, steps))
                                                  or run_with(jit_entries, w, m, steps))
same, compared = True, 0
for design, p, t, options in runs:
    calls.clear()
    simulate(Cluster(catalog.design(design), p, t), synthesize("conversation", 12.0, 30.0, seed=1),
             catalog.model("llama2-70b"), perf, catalog.machine("dgx-a100"), options)
    for workload, machines, steps in calls:
        if built is not None:
            a = run_with(jit_entries, workload, machines, steps)
            b = run_with([getattr(built, name) for name in fast.ENTRY_POINTS], workload,
                         machines, steps)
            compared += 1
            same &= a.keys() == b.keys() and all(
                a[k].dtype == b[k].dtype and np.array_equal(a[k], b[k], equal_nan=True) for k in a)
print(json.dumps({"same": same, "compared": compared, "signatures": {
    name: [str(s) for s in entry.nopython_signatures]
    for name, entry in zip(fast.ENTRY_POINTS, jit_entries)}}))
"""


def compare(*built: Path) -> dict:
    env = {**os.environ, "PROVISION_NO_AOT": "1"}
    env.pop("PROVISION_NO_JIT", None)
    run = subprocess.run([sys.executable, "-c", COMPARE, *map(str, built)], cwd=ROOT, env=env,
                         capture_output=True, text=True, timeout=900)
    assert run.returncode == 0, run.stderr[-3000:]
    return json.loads(run.stdout.splitlines()[-1])


def test_every_kind_of_run_calls_each_entry_point_with_one_signature():
    """The build is compiled for one signature per entry point: a run that typed differently
    (an int where a float was, a read-only array) would make numba compile a second one."""
    signatures = compare()["signatures"]
    assert set(signatures) == set(fast.ENTRY_POINTS)
    assert all(len(found) == 1 for found in signatures.values()), signatures


@pytest.mark.skipif(not (shutil.which("cc") or shutil.which("gcc")), reason="no C compiler")
def test_the_install_time_build_gives_the_jit_results(tmp_path):
    output = tmp_path / aot.default_output().name
    env = {**os.environ}
    env.pop("PROVISION_NO_JIT", None)
    build = subprocess.run([sys.executable, "-m", "simcore.aot", "--output", str(output)],
                           cwd=ROOT, env=env, capture_output=True, text=True, timeout=900)
    assert build.returncode == 0, build.stderr[-3000:]
    assert output.is_file()
    result = compare(output)
    assert result["compared"] >= 6 and result["same"] is True


def install(monkeypatch, build):
    monkeypatch.setitem(sys.modules, "simcore._core", build)
    monkeypatch.setattr(simcore, "_core", build, raising=False)


def test_a_build_of_other_sources_is_ignored(monkeypatch):
    stale = types.SimpleNamespace(source_digest=lambda: fast.source_digest() ^ 1)
    install(monkeypatch, stale)
    monkeypatch.delenv("PROVISION_NO_AOT", raising=False)
    monkeypatch.delenv("PROVISION_NO_JIT", raising=False)
    assert compiler._ahead_of_time_build() is None
    current = types.SimpleNamespace(source_digest=fast.source_digest)
    install(monkeypatch, current)
    assert compiler._ahead_of_time_build() is current
    monkeypatch.setenv("PROVISION_NO_AOT", "1")
    assert compiler._ahead_of_time_build() is None


def test_the_digest_covers_every_source_the_core_is_compiled_from():
    """Every module of simcore.fast, and cluster.py (itl_bin and constants compiled in): a new
    module must be added to compiler.PACKAGE_SOURCES, or edits to it would not be seen."""
    package = sorted(p.name for p in (ROOT / "simcore" / "fast").glob("*.py"))
    assert sorted(compiler.PACKAGE_SOURCES) == package
    assert fast.CORE_SOURCES == tuple(f"fast/{name}" for name in compiler.PACKAGE_SOURCES) + (
        "cluster.py",)
    assert [p.resolve() for p in compiler.source_paths()] == [
        (ROOT / "simcore" / source).resolve() for source in fast.CORE_SOURCES]
    assert 0 < fast.source_digest() < 2 ** 60


def test_output_must_be_named_as_python_imports_it(tmp_path, capsys):
    with pytest.raises(SystemExit) as stop:
        aot.main(["--output", str(tmp_path / "core.so")])
    assert stop.value.code == 2
    assert aot.default_output().name in capsys.readouterr().err


def test_an_install_without_a_compiler_still_succeeds(monkeypatch, capsys, tmp_path):
    """setup.py warns and goes on when the build fails: numba then compiles on first use."""
    import runpy

    import setuptools
    from setuptools.dist import Distribution
    declared = {}
    monkeypatch.setattr(setuptools, "setup", lambda **kw: declared.update(kw))
    runpy.run_path(str(ROOT / "setup.py"))
    (extension,) = declared["ext_modules"]
    assert extension.name == "simcore._core"
    command = declared["cmdclass"]["build_ext"](Distribution({"ext_modules": [extension]}))
    command.initialize_options()
    command.build_lib, command.inplace = str(tmp_path), False
    failed = subprocess.CompletedProcess([], 1, "", "error: command 'gcc' failed: No such file")
    monkeypatch.setattr(subprocess, "run", lambda *a, **kw: failed)
    command.build_extension(extension)
    err = capsys.readouterr().err
    assert "not compiled at install; numba will compile it on first use" in err
    assert "command 'gcc' failed" in err
    assert not list(tmp_path.rglob("_core*"))


def test_python_in_the_checkout_uses_the_installed_build():
    """Python started in the checkout imports the checkout's sources, which hold no build of
    their own after `pip install .`: the installed build serves them (same sources, same
    digest), so nothing compiles. Skips unless provision is installed with a build outside this
    checkout (an editable install builds in place, where it is found anyway)."""
    if not fast.installed_builds():
        # CI installs with `pip install ".[test]"` and runs here: there, this must not skip
        assert not os.environ.get("CI"), "no install-time build found outside the checkout"
        pytest.skip("no install-time build outside this checkout")
    if list((ROOT / "simcore").glob("_core.*")):
        pytest.skip("this checkout has a build of its own")
    env = {k: v for k, v in os.environ.items() if k not in ("PROVISION_NO_AOT", "PROVISION_NO_JIT")}
    out = subprocess.run([sys.executable, "-c", "from simcore import fastsim; "
                          "print(fastsim.CORE, fastsim.__file__)"], cwd=ROOT, env=env,
                         capture_output=True, text=True, check=True).stdout.split()
    assert Path(out[1]).resolve().parent == ROOT / "simcore"  # the checkout's sources ...
    assert out[0] == "aot"                                     # ... with the installed build
