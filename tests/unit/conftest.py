"""Fixtures of the CPU tests: the stub kernel library, CPU tensors standing in for a GPU's, and the
fused impl on the CPU with recorded kernel launches."""
from tests.helpers.dynamo import fresh_dynamo  # noqa: F401  (fixture)
from tests.helpers.kernel_standin import kernel_standin  # noqa: F401  (fixture)
from tests.helpers.stubs import cpu_as_gpu, stub_library  # noqa: F401  (fixtures)
