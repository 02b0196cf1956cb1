"""python -m coda_ext.analysis: the IO model of a Llama layer, forward + backward (block.py).

    python -m coda_ext.analysis                              # the 8B and 1B-like layers on an H100
    python -m coda_ext.analysis --layers 8b --gpu H200 --tokens 16384
    python -m coda_ext.analysis --chart layer.png --json layer.json
    python -m coda_ext.analysis --chart docs/llama_layer_model.png \\
        --measured benchmarks/results/llama_training_h100.json
"""
from __future__ import annotations

import argparse
import json
import sys

from . import block
from .roofline import GPUS


def measured_times(data: dict, models: list[block.LayerModel]) -> tuple[dict[str, dict[str, float]], str]:
    """({layer name: {variant: ms}}, legend label) from a bench_llama_training.py results file: the
    measured non-attention time of each modelled layer at the same token count."""
    shapes = {f"layer-{key}": layer for key, layer in block.LAYERS.items()}
    tokens = {m.layer.name: m.layer.tokens for m in models}
    out: dict[str, dict[str, float]] = {}
    for row in data.get("rows", []):
        layer = shapes.get(row.get("case"))
        if layer is None or tokens.get(layer.name) != row.get("tokens"):
            continue
        out[layer.name] = {block.MEASURED_VARIANTS[v]: r["non_attention_ms"]
                           for v, r in row.get("variants", {}).items() if v in block.MEASURED_VARIANTS}
    gpu = data.get("env", {}).get("gpu", "a GPU")
    return out, f"measured on {gpu}, non-attention part"


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m coda_ext.analysis", description=__doc__.splitlines()[0])
    p.add_argument("--layers", nargs="+", choices=sorted(block.LAYERS), default=["8b", "1b"])
    p.add_argument("--gpu", choices=list(GPUS), default="H100 SXM")
    p.add_argument("--dtype", default="bfloat16", choices=("bfloat16", "float16"))
    p.add_argument("--tokens", type=int, default=None, help="tokens per step (M); default: the layer's")
    p.add_argument("--chart", metavar="PNG", help="write a stacked bar chart (needs matplotlib)")
    p.add_argument("--json", metavar="FILE", help="write the model as JSON")
    p.add_argument("--measured", metavar="FILE", help="with --chart: mark the measured times of a "
                   "benchmarks/bench_llama_training.py results file (JSON) beside the modelled bars")
    args = p.parse_args(argv)
    models = [block.layer_model(name, args.dtype, args.gpu, args.tokens) for name in args.layers]
    print("\n\n".join(m.table() for m in models))
    if args.json:
        with open(args.json, "w") as f:
            json.dump([m.to_dict() for m in models], f, indent=1)
        print(f"\nwrote {args.json}")
    if args.chart:
        measured, label = {}, "measured"
        if args.measured:
            with open(args.measured) as f:
                measured, label = measured_times(json.load(f), models)
        try:
            block.chart(models, args.chart, measured, label)
        except ImportError as e:
            print(f"error: {e}", file=sys.stderr)
            return 2
        print(f"wrote {args.chart}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
