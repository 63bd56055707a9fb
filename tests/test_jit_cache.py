"""numba's on-disk cache of the fast core cannot go stale: it is keyed by the digest of every
source the core compiles (simcore.fast.CORE_SOURCES), not only by the file a function is
written in."""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

from simcore import fast

ROOT = Path(__file__).resolve().parent.parent

# The ITL histogram's occupied bins from the JIT core and from the reference simulator, on the
# tiny run the install-time build is typed on (its gaps are 20-50 ms).
PROBE = r"""
import json
import numpy as np
from simcore import fast as core
from simcore.aot import _tiny_run
from simcore.refsim import simulate_reference
workload, machines = _tiny_run()
fast, ref = core.simulate_fast(workload, machines), simulate_reference(workload, machines)
print(json.dumps({"core": core.CORE, "digest": f"{core.source_digest():015x}",
                  "fast": np.flatnonzero(fast["itl_histogram"]).tolist(),
                  "ref": np.flatnonzero(ref["itl_histogram"]).tolist()}))
"""


def probe(copy: Path) -> dict:
    env = {k: v for k, v in os.environ.items()
           if k not in ("PROVISION_NO_JIT", "NUMBA_CACHE_DIR", "NUMBA_CACHE_LOCATOR_CLASSES")}
    env["PROVISION_NO_AOT"] = "1"  # (the copy's digest matches an installed build at first)
    env["PYTHONPATH"] = str(ROOT)  # the copy's simcore comes first (the current folder)
    run = subprocess.run([sys.executable, "-c", PROBE], cwd=copy, env=env, capture_output=True,
                         text=True, timeout=900)
    assert run.returncode == 0, run.stderr[-3000:]
    return json.loads(run.stdout.splitlines()[-1])


def test_an_edit_to_a_file_the_core_compiles_in_is_seen(tmp_path):
    """cluster.py's itl_bin and its constants are compiled into the core's functions, which
    numba caches with a stamp of their own file only: edited, the old machine code ran on (the
    reference then disagreed with the core). Here the copy's cluster.py changes the ITL floor
    from 1 us to 1 ms after a first run has filled the cache, and the second run bins as the
    reference does, from a cache folder of its own."""
    shutil.copytree(ROOT / "simcore", tmp_path / "simcore",
                    ignore=shutil.ignore_patterns("__pycache__", "_core.*"))
    first = probe(tmp_path)
    assert first["core"] == "jit" and first["fast"] == first["ref"] and first["fast"]
    cluster = tmp_path / "simcore" / "cluster.py"
    source = cluster.read_text()
    assert source.count("\nITL_FLOOR_S = 1e-6\n") == 1
    cluster.write_text(source.replace("\nITL_FLOOR_S = 1e-6\n", "\nITL_FLOOR_S = 1e-3\n"))
    second = probe(tmp_path)
    assert second["ref"] != first["ref"]           # the edit moves every gap's bin ...
    assert second["fast"] == second["ref"]         # ... in the compiled core too
    assert second["digest"] != first["digest"]
    cache = tmp_path / "simcore" / "fast" / "__pycache__"
    for run in (first, second):                    # each in a folder named after its digest
        assert list((cache / f"core-{run['digest']}").glob("loop._run-*.nbi"))


def test_the_cache_key_covers_every_source_the_core_is_compiled_from():
    assert set(fast.CORE_SOURCES) >= {"fast/loop.py", "cluster.py"}
    if fast.CORE == "jit":
        from numba.core import caching
        impl = getattr(caching, "CacheImpl", None) or caching._CacheImpl
        assert getattr(impl._locator_classes[0], "provision_core", False)
