"""python -m coda_ext.analysis: the IO model of a Llama layer, forward + backward (block.py).

    python -m coda_ext.analysis                              # the 8B and 1B-like layers on an H100
    python -m coda_ext.analysis --layers 8b --gpu H200 --tokens 16384
    python -m coda_ext.analysis --chart layer.png --json layer.json
"""
from __future__ import annotations

import argparse
import json
import sys

from . import block
from .roofline import GPUS


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m coda_ext.analysis", description=__doc__.splitlines()[0])
    p.add_argument("--layers", nargs="+", choices=sorted(block.LAYERS), default=["8b", "1b"])
    p.add_argument("--gpu", choices=list(GPUS), default="H100 SXM")
    p.add_argument("--dtype", default="bfloat16", choices=("bfloat16", "float16"))
    p.add_argument("--tokens", type=int, default=None, help="tokens per step (M); default: the layer's")
    p.add_argument("--chart", metavar="PNG", help="write a stacked bar chart (needs matplotlib)")
    p.add_argument("--json", metavar="FILE", help="write the model as JSON")
    args = p.parse_args(argv)
    models = [block.layer_model(name, args.dtype, args.gpu, args.tokens) for name in args.layers]
    print("\n\n".join(m.table() for m in models))
    if args.json:
        with open(args.json, "w") as f:
            json.dump([m.to_dict() for m in models], f, indent=1)
        print(f"\nwrote {args.json}")
    if args.chart:
        try:
            block.chart(models, args.chart)
        except ImportError as e:
            print(f"error: {e}", file=sys.stderr)
            return 2
        print(f"wrote {args.chart}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
