"""python -m coda_ext <tool> [args]: runs one of coda_ext's command-line tools (coda_ext.tools)."""
from __future__ import annotations

import importlib
import sys

from .tools import TOOLS


def usage() -> str:
    width = max(map(len, TOOLS))
    lines = ["usage: python -m coda_ext <tool> [--help | args ...]", "", "tools:"]
    lines += [f"  {name:<{width}}  {summary}" for name, summary in TOOLS.items()]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv or argv[0] in ("-h", "--help", "help"):
        print(usage())
        return 0
    name, rest = argv[0], argv[1:]
    if name not in TOOLS:
        print(f"coda_ext: no tool {name!r}\n\n{usage()}", file=sys.stderr)
        return 2
    return importlib.import_module(f"coda_ext.tools.{name}").main(rest) or 0


if __name__ == "__main__":
    sys.exit(main())
