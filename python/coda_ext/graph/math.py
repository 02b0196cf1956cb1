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
abs = _unary("abs")  # noqa: A001 - mirrors torch.abs
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
