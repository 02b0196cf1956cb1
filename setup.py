"""coda_ext packaging. Pure Python at install time: kernels are compiled on first use (or by
`python -m coda_ext prebuild`), the torch binding once per torch version. The C++ sources
(csrc/) ship inside the package so installed copies can compile kernels."""
import pathlib
import shutil

from setuptools import setup
from setuptools.command.build_py import build_py

ROOT = pathlib.Path(__file__).resolve().parent


class BuildPyWithSources(build_py):
    """Copies csrc/ into the built package (coda_ext/csrc) for non-editable installs."""

    def run(self):
        super().run()
        target = pathlib.Path(self.build_lib) / "coda_ext" / "csrc"
        if target.exists():
            shutil.rmtree(target)
        shutil.copytree(ROOT / "csrc", target, ignore=shutil.ignore_patterns("*.o", "*.so"))


setup(cmdclass={"build_py": BuildPyWithSources})
