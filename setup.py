"""Everything is declared in pyproject.toml; this file only adds the install-time build of the
simulator core (simcore/aot.py). If that build fails (no C compiler, say), the install goes on
and numba compiles the core on first use instead."""
import glob
import os
import subprocess
import sys
import tempfile

from setuptools import Extension, setup
from setuptools.command.build_ext import build_ext

HERE = os.path.dirname(os.path.abspath(__file__))


class BuildCompiledCore(build_ext):
    def build_extension(self, ext):
        target = os.path.abspath(self.get_ext_fullpath(ext.name))
        print("provision: compiling the simulator core (about a minute, once per install)",
              file=sys.stderr)
        with tempfile.TemporaryDirectory() as cache:
            env = {**os.environ, "NUMBA_CACHE_DIR": cache, "PROVISION_NO_AOT": "1"}
            env.pop("PROVISION_NO_JIT", None)
            run = subprocess.run([sys.executable, "-m", "simcore.aot", "--output", target],
                                 cwd=HERE, env=env, capture_output=True, text=True)
        if run.returncode != 0:
            tail = "\n".join((run.stderr or run.stdout).strip().splitlines()[-5:])
            print(f"provision: warning: the simulator core was not compiled at install; numba "
                  f"will compile it on first use instead.\n{tail}", file=sys.stderr)


# the sources the build is compiled from (simcore.fast.CORE_SOURCES): build_ext rebuilds when
# any of them is newer than the build
CORE_SOURCES = sorted(glob.glob("simcore/fast/*.py", root_dir=HERE)) + ["simcore/cluster.py"]

setup(ext_modules=[Extension("simcore._core", sources=CORE_SOURCES, optional=True)],
      cmdclass={"build_ext": BuildCompiledCore})
