"""The benchmarks, run as modules from the repository root: `python -m benchmarks.bench_graphs --help`.

common.py holds what they share (timing, the environment record, results files); their inputs come
from tests.helpers.rand, the factories the tests use.
"""
