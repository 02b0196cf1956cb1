"""CPU tests."""
