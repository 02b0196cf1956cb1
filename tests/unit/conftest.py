"""Fixtures of the CPU tests: the stub kernel library and CPU tensors standing in for a GPU's."""
from tests.helpers.stubs import cpu_as_gpu, stub_library  # noqa: F401  (fixtures)
