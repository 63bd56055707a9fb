"""Compile the fast core ahead of time: `python -m simcore.aot [--output FILE]`.

`pip install` runs this (setup.py) to build `simcore/_core*.so` from `simcore.fast` with
numba's AOT compiler, so a fresh install starts simulating at once: no numba import and no
25 s of compiling on the first run. The build holds the digest of the sources it came from;
`simcore.fast` uses it only while they match, and otherwise compiles with numba as before.
Each entry point is compiled for the one signature simulate_fast gives it, read from a tiny
simulation run through numba first (`_run(state, until)`: the State named tuple, with its
nested named tuples and record arrays, is exported as it is). Without a C compiler the build
fails and the package works as before (numba compiles on first use). Developers editing the
core rebuild in place with `python -m simcore.aot`.
"""
from __future__ import annotations

import argparse
import importlib
import os
import sys
import sysconfig
from contextlib import contextmanager
from pathlib import Path

import numpy as np

CORE_MODULE = "_core"


def default_output() -> Path:
    return Path(__file__).parent / (CORE_MODULE + sysconfig.get_config_var("EXT_SUFFIX"))


def _tiny_run():
    """Two machines (one prompt, one token) and three requests: enough for numba to type every
    entry point as simulate_fast calls it."""
    from simcore.cluster import ROLE_PROMPT, ROLE_TOKEN, MachineArrays
    from simcore.latency import LatencyCurves
    from simcore.workload import Workload
    curves = LatencyCurves(np.array([1.0, 4096.0]), np.array([0.01, 0.5]), np.array([1.0, 64.0]),
                           np.array([0.02, 0.05]), 1e-7)
    machines = MachineArrays(
        role=np.array([ROLE_PROMPT, ROLE_TOKEN]), kind=np.zeros(2, np.int64),
        kv_capacity=np.full(2, 10_000, np.int64), link_bytes_per_s=np.full(2, 1e11),
        layerwise_visible_s=np.zeros(2), curves=(curves,), kv_bytes_per_token=1000, layers=10,
        mixed_pool=True, prompt_token_limit=2048, queue_threshold=8,
        layerwise_min_prompt_tokens=512)
    workload = Workload("tiny", np.array([0.0, 0.1, 0.2]), np.array([100, 200, 300]),
                        np.array([5, 6, 7]))
    return workload, machines


def build(output: Path) -> None:
    """Compile the entry points into the extension module `output` (its name must be
    `_core` plus this interpreter's extension suffix)."""
    if os.environ.get("PROVISION_NO_JIT"):
        sys.exit("simcore.aot: unset PROVISION_NO_JIT; the build compiles with numba")
    os.environ["PROVISION_NO_AOT"] = "1"  # type the entry points with numba, not an old build
    from numba.pycc import CC

    fast = importlib.import_module("simcore.fast")
    if fast.CORE != "jit":  # imported (by simcore's __init__) with a previous build in use
        for name in [n for n in sys.modules if n == "simcore.fast" or n.startswith("simcore.fast.")]:
            del sys.modules[name]
        fast = importlib.import_module("simcore.fast")
    fast.simulate_fast(*_tiny_run())
    compiler = CC(CORE_MODULE)
    compiler.output_dir, compiler.output_file = str(output.parent), output.name
    compiler.use_nrt = False  # as the JIT core: no reference counting on every call
    entries = importlib.import_module("simcore.fast.setup")  # the module Python calls them from
    for name in fast.ENTRY_POINTS:
        dispatcher = getattr(entries, name)
        (signature,) = dispatcher.nopython_signatures
        compiler.export(name, signature)(dispatcher.py_func)
    digest = fast.source_digest()

    def source_digest():
        return digest
    compiler.export("source_digest", "int64()")(source_digest)
    output.parent.mkdir(parents=True, exist_ok=True)
    with _wrappers_releasing_the_gil():
        compiler.compile()


@contextmanager
def _wrappers_releasing_the_gil():
    """The exported functions release the GIL while the core runs, as the JIT core's
    nogil=True does, so that simulations run in parallel on threads. numba's AOT compiler has
    no option for it: its compile flags are given release_gil for the build."""
    from numba.pycc import compiler as pycc_compiler
    plain = pycc_compiler.Flags

    class ReleasingFlags(plain):
        def __init__(self, *args, **kwargs):
            super().__init__(*args, **kwargs)
            self.release_gil = True
    pycc_compiler.Flags = ReleasingFlags
    try:
        yield
    finally:
        pycc_compiler.Flags = plain


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m simcore.aot", description=__doc__.splitlines()[0])
    parser.add_argument("--output", type=Path, default=default_output(),
                        help="extension module to write (default: in simcore/, beside fast/)")
    args = parser.parse_args(argv)
    if not args.output.name.startswith(CORE_MODULE + "."):
        parser.error(f"--output must be named {CORE_MODULE}<extension suffix>, "
                     f"e.g. {default_output().name}")
    build(args.output)
    print(f"simcore.aot: compiled the simulator core into {args.output}")


if __name__ == "__main__":
    main()
