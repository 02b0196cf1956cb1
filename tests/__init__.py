"""The test suite, importable as a package from the repository root (pytest: pyproject.toml pythonpath)."""
