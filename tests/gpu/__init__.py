"""Tests that need an SM90 GPU (H100/H200); they skip elsewhere."""
