"""The graph builder: the Python API users write epilogues with.

    g = Graph()
    acc = g.accumulator()
    y = silu(acc + g.row_vector("bias")) * g.tile("residual")
    g.output(y)
    g.row_reduce("sqsum", y, "sumsq")

Builder calls check their arguments at once (wrong kinds, names, dtypes); `build()`
checks the whole graph (verify.py) and returns the canonical, immutable IR.
"""
from __future__ import annotations

import keyword
import math
import struct
from typing import Any, Union

from ..errors import GraphError
from . import ir

Operand = Union["Value", int, float]


def dtype_name(dtype: Any, allow_int: bool = False, allow_byte: bool = False) -> str:
    """'bfloat16' for torch.bfloat16 or 'bfloat16'; raises for unsupported dtypes.
    allow_int: also int32/int64 (row and column vectors only); allow_byte: also uint8 (tiles and stores only)."""
    name = str(dtype).replace("torch.", "")
    aliases = {"bf16": "bfloat16", "fp16": "float16", "half": "float16", "fp32": "float32", "float": "float32",
               "int": "int32", "long": "int64"}
    name = aliases.get(name, name)
    allowed = ir.DTYPES + (ir.INT_DTYPES if allow_int else ()) + (ir.BYTE_DTYPES if allow_byte else ())
    if name not in allowed:
        if name in ir.INT_DTYPES:
            raise GraphError(f"unsupported dtype {dtype!r} here: integer dtypes are only allowed for row and column "
                             "vectors (targets, positions); "
                             "tiles, stores and casts take torch.bfloat16, torch.float16 or torch.float32")
        if name in ir.BYTE_DTYPES:
            raise GraphError(f"unsupported dtype {dtype!r} here: uint8 is only allowed for tiles and stores "
                             "(integers 0..255, as lo8 makes and join24 reads)")
        names = ", ".join(f"torch.{d}" for d in allowed)
        raise GraphError(f"unsupported dtype {dtype!r}: use one of {names}")
    return name


class Value:
    """A tile-shaped value of the epilogue (M x N, or M x N/2 after a pair op)."""

    __slots__ = ("_graph", "_index")

    def __init__(self, graph: Graph, index: int):
        self._graph = graph
        self._index = index

    @property
    def kind(self) -> str:
        return self._graph._nodes[self._index].kind

    def __repr__(self) -> str:
        return f"<coda_ext Value %{self._index} {self.kind}>"

    def __bool__(self) -> bool:
        raise TypeError("an epilogue value has no truth value; use coda_ext.maximum/minimum for comparisons")

    def __add__(self, o: Operand) -> Value: return _op("add", self, o)
    def __radd__(self, o: Operand) -> Value: return _op("add", o, self)
    def __sub__(self, o: Operand) -> Value: return _op("sub", self, o)
    def __rsub__(self, o: Operand) -> Value: return _op("sub", o, self)
    def __mul__(self, o: Operand) -> Value: return _op("mul", self, o)
    def __rmul__(self, o: Operand) -> Value: return _op("mul", o, self)
    def __truediv__(self, o: Operand) -> Value: return _op("div", self, o)
    def __rtruediv__(self, o: Operand) -> Value: return _op("div", o, self)
    def __neg__(self) -> Value: return _op("neg", self)
    def __abs__(self) -> Value: return _op("abs", self)


def _check_name(name: Any, what: str) -> str:
    if not isinstance(name, str) or not name.isidentifier() or keyword.iskeyword(name):
        raise GraphError(f"{what} name {name!r} must be a Python identifier (it becomes a keyword argument)")
    if name in ("A", "W", "out_tensors"):
        raise GraphError(f"{what} name {name!r} is reserved; choose another name")
    return name


class Graph:
    """Builds an epilogue graph. Every method that adds a node returns a Value (or None for sinks)."""

    def __init__(self) -> None:
        self._nodes: list[ir.Node] = []
        self._dedup: dict[ir.Node, int] = {}
        self._names: dict[str, str] = {}

    # --- node creation --------------------------------------------------------------------

    def _add(self, node: ir.Node, dedup: bool = True) -> int:
        if dedup and node in self._dedup:
            return self._dedup[node]
        self._nodes.append(node)
        self._dedup[node] = len(self._nodes) - 1
        return len(self._nodes) - 1

    def _claim(self, name: str, what: str) -> str:
        _check_name(name, what)
        if name in self._names:
            raise GraphError(f"name {name!r} is already used by a {self._names[name]}; names must be unique")
        self._names[name] = what
        return name

    def _value(self, x: Operand, what: str) -> int:
        if isinstance(x, Value):
            if x._graph is not self:
                raise GraphError(f"{what} belongs to another Graph; build each epilogue from one Graph object")
            return x._index
        if isinstance(x, bool) or not isinstance(x, (int, float)):
            raise GraphError(f"{what} must be a coda_ext Value or a Python number, got {type(x).__name__}")
        if not math.isfinite(float(x)):
            raise GraphError(f"{what} is {x!r}: constants must be finite")
        try:  # epilogue math is fp32: constants are fp32 values
            value = struct.unpack("f", struct.pack("f", float(x)))[0]
        except OverflowError:
            value = math.inf
        if not math.isfinite(value):  # some Pythons round beyond the range to inf instead of raising
            raise GraphError(f"{what} is {x!r}, outside the fp32 range of epilogue math")
        return self._add(ir.Node("scalar", (), ir.make_attrs(mode="constant", value=value)))

    # --- leaves ---------------------------------------------------------------------------

    def accumulator(self) -> Value:
        """The fp32 GEMM accumulator A @ W^T (M x N)."""
        return Value(self, self._add(ir.Node("accumulator")))

    def scalar(self, name: str | None = None, value: float | None = None, *, pointer: bool = False) -> Value:
        """A scalar: `scalar(value=2.0)` fixed in the kernel; `scalar("alpha")` a runtime float
        argument; `scalar("scale", pointer=True)` a one-element fp32 device tensor argument."""
        if name is None:
            if value is None:
                raise GraphError("scalar() needs a value (a constant) or a name (a runtime argument)")
            return Value(self, self._value(value, "scalar value"))
        if value is not None:
            raise GraphError(f"scalar {name!r}: give either a name (runtime) or a value (constant), not both")
        mode = "pointer" if pointer else "value"
        self._claim(name, "scalar")
        return Value(self, self._add(ir.Node("scalar", (), ir.make_attrs(mode=mode, name=name)), dedup=False))

    def col_index(self) -> Value:
        """The global column index n of each element (as fp32, exact below 2**24): with a comparison
        and where(), selects per-row columns such as x[m, target[m]]."""
        return Value(self, self._add(ir.Node("col_index")))

    def _input(self, kind: str, name: str, dtype: Any) -> Value:
        is_vector = kind in ("row_vector", "col_vector")
        resolved = None if dtype is None else _named_dtype(dtype, f"{kind.replace('_', ' ')} {name!r}", is_vector,
                                                           allow_byte=kind == "tile")
        self._claim(name, kind.replace("_", " "))
        attrs = ir.make_attrs(name=name, dtype=resolved)
        return Value(self, self._add(ir.Node(kind, (), attrs), dedup=False))

    def row_vector(self, name: str, dtype: Any = None) -> Value:
        """A length-N vector broadcast over rows (a bias, a norm weight). dtype: the op's by default;
        float32, or int32/int64 (converted to fp32 in the epilogue, exact below 2**24)."""
        return self._input("row_vector", name, dtype)

    def col_vector(self, name: str, dtype: Any = None) -> Value:
        """A length-M vector broadcast over columns (a per-token scale such as rstd, a position, an
        int32/int64 target index). dtype as for row_vector."""
        return self._input("col_vector", name, dtype)

    def tile(self, name: str, dtype: Any = None) -> Value:
        """A full M x N tensor input (a residual), row-major, TMA-loaded. dtype: the op's by default; a float
        dtype, or uint8 (integers 0..255, exact in fp32)."""
        return self._input("tile", name, dtype)

    def pair_tile(self, name: str, dtype: Any = None) -> tuple[Value, Value]:
        """An (M, 2N) input whose columns come in pairs (2i, 2i+1) — interleaved gate/up, say — read at the
        GEMM's width N: returns (even, odd), the values of columns 2i and 2i+1 at column i. 16-bit
        dtypes only (each pair is loaded as one 32-bit element)."""
        resolved = None if dtype is None else _named_dtype(dtype, f"pair tile {name!r}")
        if resolved == "float32":
            raise GraphError(f"pair tile {name!r}: pairs are 16-bit elements; use torch.bfloat16 or torch.float16")
        self._claim(name, "pair tile")
        t = self._add(ir.Node("pair_tile", (), ir.make_attrs(name=name, dtype=resolved)), dedup=False)
        return tuple(Value(self, self._add(ir.Node("unpack", (t,), ir.make_attrs(half=h)))) for h in (0, 1))

    # --- sinks ----------------------------------------------------------------------------

    def output(self, value: Value, name: str = "out") -> None:
        """The main output D (M x N, the op's dtype). At most one per graph; a graph without one
        writes only its stores and reductions (no M x N tensor D)."""
        if any(n.kind == "output" for n in self._nodes):
            raise GraphError("the graph already has an output(); add further results with store(name, value)")
        src = self._value(value, "output value")
        self._claim(name, "output")
        self._add(ir.Node("output", (src,), ir.make_attrs(name=name)), dedup=False)

    def store(self, name: str, value: Value, dtype: Any = None) -> None:
        """An extra output holding `value` (M x N, or M x N/2 for a pair op). dtype: the op's by default; a float
        dtype, or uint8 (rounded to the nearest integer, saturating at 0 and 255)."""
        src = self._value(value, f"store {name!r} value")
        resolved = None if dtype is None else _named_dtype(dtype, f"store {name!r}", allow_byte=True)
        self._claim(name, "store")
        attrs = ir.make_attrs(name=name, dtype=resolved)
        self._add(ir.Node("store", (src,), attrs), dedup=False)

    def store_pairs(self, name: str, even: Operand, odd: Operand, dtype: Any = None) -> None:
        """An extra (M, 2N) output whose columns interleave two M x N values: out[:, 2i] = even[:, i],
        out[:, 2i+1] = odd[:, i] (the inverse of pair_tile). dtype: the op's by default, 16-bit only."""
        resolved = None if dtype is None else _named_dtype(dtype, f"store_pairs {name!r}")
        if resolved == "float32":
            raise GraphError(f"store_pairs {name!r}: pairs are 16-bit elements; use torch.bfloat16 or torch.float16")
        a = self._value(even, f"store_pairs {name!r} even value")
        b = self._value(odd, f"store_pairs {name!r} odd value")
        for i in (a, b):
            if self._nodes[i].kind in ir.PAIR_KINDS + ir.PACKED_KINDS:
                raise GraphError(f"store_pairs {name!r}: its values must be full-width element-wise values, not the "
                                 f"result of {self._nodes[i].kind}")
        self._claim(name, "pair store")
        packed = self._add(ir.Node("pack", (a, b), ir.make_attrs(dtype=resolved)), dedup=False)
        self._add(ir.Node("pair_store", (packed,), ir.make_attrs(name=name, dtype=resolved)), dedup=False)

    def _reduce(self, kind: str, name: str, value: Value, op: str) -> None:
        if op not in ir.REDUCE_OPS:
            raise GraphError(f"{kind} {name!r}: unsupported reduction op {op!r}; use one of {ir.REDUCE_OPS}")
        if op in ir.ROW_ONLY_REDUCE_OPS and kind != "row_reduce":
            raise GraphError(f"{kind} {name!r}: op {op!r} is only supported by row_reduce (per row, over N)")
        src = self._value(value, f"{kind} {name!r} value")
        self._claim(name, kind.replace("_", " "))
        self._add(ir.Node(kind, (src,), ir.make_attrs(name=name, op=op)), dedup=False)

    def row_reduce(self, name: str, value: Value, op: str = "sum") -> None:
        """A per-row statistic over N (length M, fp32): op is 'sum', 'max', 'sumsq' or 'logsumexp'
        (log Σ_n exp(x[m, n]), online: a running max and rescaled sum per tile, combined in a fixed order)."""
        self._reduce("row_reduce", name, value, op)

    def col_reduce(self, name: str, value: Value, op: str = "sum") -> None:
        """A per-column statistic over M (length N, fp32): op is 'sum', 'max' or 'sumsq'."""
        self._reduce("col_reduce", name, value, op)

    # --- result ---------------------------------------------------------------------------

    def raw(self) -> ir.GraphIR:
        """The graph as built, before verification and canonicalisation."""
        return ir.GraphIR(tuple(self._nodes))

    def build(self) -> ir.GraphIR:
        """Verifies the graph and returns its canonical immutable IR."""
        from .canonical import canonicalize
        from .verify import verify

        return canonicalize(verify(self.raw()))


def _named_dtype(dtype: Any, what: str, allow_int: bool = False, allow_byte: bool = False) -> str:
    """dtype_name(), with the node it is for in the message."""
    try:
        return dtype_name(dtype, allow_int, allow_byte)
    except GraphError as e:
        raise GraphError(f"{what}: {e}") from None


def _graph_of(kind: str, *xs: Any) -> Graph:
    for x in xs:
        if isinstance(x, Value):
            return x._graph
    raise GraphError(f"{kind}: at least one operand must be a coda_ext Value (from Graph.accumulator(), tile(), "
                     "...); for plain numbers use Python's math")


def _op(kind: str, *operands: Operand, **attrs: Any) -> Value:
    g = _graph_of(kind, *operands)
    idx = tuple(g._value(x, f"operand {i} of {kind}") for i, x in enumerate(operands))
    for i in idx:
        if g._nodes[i].kind in ir.PACKED_KINDS:
            raise GraphError(f"{kind}: its operand is a packed pair value ({g._nodes[i].kind}); use the two values "
                             "pair_tile returns, and store_pairs to write pairs")
        if g._nodes[i].kind in ir.PAIR_KINDS and kind != "store":
            raise GraphError(
                f"{kind}: its operand is the half-width result of {g._nodes[i].kind}; such a value can only be "
                "stored (g.store(name, value)). Apply element-wise math before the pair op")
    return Value(g, g._add(ir.Node(kind, idx, ir.make_attrs(**attrs))))
