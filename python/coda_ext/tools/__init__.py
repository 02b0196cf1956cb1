"""Command-line tools (not library code): each runs as `python -m coda_ext <tool>` (or
`python -m coda_ext.tools.<tool>`); `python -m coda_ext --help` lists them."""

#: tool name -> its one-line summary (the first line of the module's docstring is the longer one).
TOOLS = {
    "demo": "build an epilogue graph, show its C++, compile it and run it on an SM90 GPU (or interpret it)",
    "prebuild": "build kernels ahead of time, in parallel, on any machine with nvcc (no GPU needed)",
    "train_demo": "train a small Llama on synthetic data, coda_ext against eager",
    "libgen": "(re)write libcoda's generated kernel sources under csrc/kernels/ops",
}

__all__ = ["TOOLS"]
