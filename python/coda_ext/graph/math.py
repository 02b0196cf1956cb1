"""Element-wise and pairwise functions on epilogue values (coda_ext.silu, coda_ext.exp, ...)."""
from __future__ import annotations

from ..errors import GraphError
from . import ir
from .builder import Operand, Value, _op, dtype_name


def _unary(kind: str):
    def fn(x: Value) -> Value:
        return _op(kind, x)

    fn.__name__ = kind
    fn.__doc__ = f"Element-wise {kind}."
    return fn


neg = _unary("neg")
abs = _unary("abs")  # noqa: A001  (mirrors torch.abs)
exp = _unary("exp")
log = _unary("log")
sqrt = _unary("sqrt")
rsqrt = _unary("rsqrt")
square = _unary("square")
tanh = _unary("tanh")
sigmoid = _unary("sigmoid")
silu = _unary("silu")
relu = _unary("relu")


def gelu(x: Value, approximate: str = "none") -> Value:
    """GELU, exact (erf, approximate='none') or with the tanh approximation (approximate='tanh')."""
    if approximate not in ("none", "tanh"):
        raise GraphError(f"gelu: approximate must be 'none' or 'tanh', got {approximate!r}")
    return _op("gelu_erf" if approximate == "none" else "gelu_tanh", x)


def gelu_grad(x: Value, approximate: str = "none") -> Value:
    """The derivative of GELU as one node: of the exact form, Φ(x) + x·φ(x) (Φ, φ: the standard normal CDF and
    density), or of the tanh form (approximate='tanh'); gelu's backward is gelu_grad(x) * dy."""
    if approximate not in ("none", "tanh"):
        raise GraphError(f"gelu_grad: approximate must be 'none' or 'tanh', got {approximate!r}")
    return _op("gelu_erf_grad" if approximate == "none" else "gelu_tanh_grad", x)


def add(a: Operand, b: Operand) -> Value: return _op("add", a, b)
def sub(a: Operand, b: Operand) -> Value: return _op("sub", a, b)
def mul(a: Operand, b: Operand) -> Value: return _op("mul", a, b)
def div(a: Operand, b: Operand) -> Value: return _op("div", a, b)


def maximum(a: Operand, b: Operand) -> Value:
    """Element-wise maximum (NaN-propagating, like torch.maximum)."""
    return _op("max", a, b)


def minimum(a: Operand, b: Operand) -> Value:
    """Element-wise minimum (NaN-propagating, like torch.minimum)."""
    return _op("min", a, b)


def fma(a: Operand, b: Operand, c: Operand) -> Value:
    """Multiply-add a * b + c (one rounding)."""
    return _op("fma", a, b, c)


def cast(x: Value, dtype) -> Value:
    """Rounds x to `dtype` (bf16/fp16/fp32); the math after it continues in fp32."""
    return _op("cast", x, dtype=dtype_name(dtype))


def pair_gate(x: Value, activation: str = "silu") -> Value:
    """out[:, i] = act(x[:, 2i]) * x[:, 2i+1]: a half-width value (M x N/2), which can only be stored.
    With activation='silu' this is the SwiGLU of an interleaved gate/up projection."""
    if activation not in ir.PAIR_ACTIVATIONS:
        raise GraphError(f"pair_gate: unsupported activation {activation!r}; use one of {ir.PAIR_ACTIVATIONS}")
    return _op("pair_gate", x, act=activation)


def swiglu_pairs(x: Value) -> Value:
    """SwiGLU on interleaved gate/up columns: silu(x[:, 2i]) * x[:, 2i+1], half width."""
    return pair_gate(x, "silu")


# --- comparisons and selection -------------------------------------------------------------

def _compare(kind: str, doc: str):
    def fn(a: Operand, b: Operand) -> Value:
        return _op(kind, a, b)

    fn.__name__ = kind
    fn.__doc__ = f"1.0 where a {doc} b, else 0.0 (a NaN operand compares false, except for ne)."
    return fn


eq = _compare("eq", "==")
ne = _compare("ne", "!=")
lt = _compare("lt", "<")
le = _compare("le", "<=")
gt = _compare("gt", ">")
ge = _compare("ge", ">=")


def where(cond: Operand, a: Operand, b: Operand) -> Value:
    """a where cond != 0, else b (element-wise; with a comparison as cond, a select)."""
    return _op("where", cond, a, b)


# --- an fp32 value in three bytes (a bfloat16 and a uint8) ---------------------------------------

def hi16(x: Value) -> Value:
    """x rounded to 24 bits (8 exponent and 15 mantissa bits, to nearest, ties to even) with its low 16 bits
    cleared: a value bfloat16 holds exactly, so g.store(name, hi16(x), "bfloat16") writes it without rounding."""
    return _op("hi16", x)


def lo8(x: Value) -> Value:
    """The 8 bits below hi16(x) of x rounded to 24 bits, as an integer 0..255 (exact in a uint8 store)."""
    return _op("lo8", x)


def join24(hi: Operand, lo: Operand) -> Value:
    """The fp32 value whose top 16 bits are hi's and the next 8 lo: join24(hi16(x), lo8(x)) is x rounded to 24
    bits. With a bfloat16 tile and a uint8 tile, an fp32 accumulator kept across launches in 3 bytes an element
    (graphs.weight_grad_split): hi read from a 16-bit tile, lo from a uint8 tile."""
    return _op("join24", hi, lo)


# --- pairs and rotations (RoPE) --------------------------------------------------------------

def pair_swap(x: Value) -> Value:
    """Full width: y[:, 2i] = x[:, 2i+1] and y[:, 2i+1] = x[:, 2i] — the partner of each column in
    its adjacent pair. With it any pairwise transform is element-wise math, e.g. the RoPE rotation
    x * cos(θ) + pair_swap(x) * sin(θ) with θ negated on even columns. Needs an even N."""
    return _op("pair_swap", x)


def rotate_pairs(x: Value, t: Operand) -> Value:
    """Full width: each adjacent pair (a, b) = (x[:, 2i], x[:, 2i+1]) rotated by θ = 2π·t[:, 2i]:
    out[:, 2i] = a·cos θ − b·sin θ, out[:, 2i+1] = b·cos θ + a·sin θ (the RoPE rotation, t in turns,
    e.g. from turns()). One sine and cosine per pair, in registers. Needs an even N."""
    return _op("rotate_pairs", x, t)


def turns(position: Operand, freq_hi: Operand, freq_lo: Operand) -> Value:
    """frac(position · (freq_hi + freq_lo)) in [-0.5, 0.5]: the fractional turn of an angle given in
    turns, reduced exactly (position · freq_hi's rounding error is recovered with an FMA), so the
    angle stays accurate at positions ~1e5 where position · frequency in radians loses every digit
    in fp32. freq_hi + freq_lo is a frequency in turns per position held as a float pair."""
    return _op("turns", position, freq_hi, freq_lo)


def cos_turns(t: Operand) -> Value:
    """cos(2π t) (t in turns, e.g. from turns())."""
    return _op("cos_turns", t)


def sin_turns(t: Operand) -> Value:
    """sin(2π t) (t in turns, e.g. from turns())."""
    return _op("sin_turns", t)


# --- segmented row reductions ---------------------------------------------------------------

SEGMENT_OPS = ("sum", "max", "sumsq")


def segment_reduce(x: Value, size: int, op: str = "sum") -> Value:
    """Per row, reduces each run of `size` consecutive columns (a head) with op 'sum', 'max' or
    'sumsq' and gives every element its segment's result (full width): e.g. the per-head RMS of
    QK-norm, x * rsqrt(segment_reduce(x, 128, 'sumsq') / 128 + eps). A segment must be one
    epilogue subtile: the kernel config's epilogue tile is (EPI_M, size)."""
    if op not in SEGMENT_OPS:
        raise GraphError(f"segment_reduce: op must be one of {SEGMENT_OPS}, got {op!r}")
    if isinstance(size, bool) or not isinstance(size, int) or size not in (32, 64, 128):
        raise GraphError(f"segment_reduce: size must be 32, 64 or 128 columns (a head), got {size!r}")
    return _op("segment_reduce", x, size=size, op=op)
