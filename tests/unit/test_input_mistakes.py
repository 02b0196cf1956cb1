"""Input mistakes on a machine without a GPU: each is named as itself, on any device.

A compiled op (a TunedOp: no kernel is built here) and the ready ops check shapes, dtypes and
strides before they say that the op needs an SM90 GPU, and their fakes run the same checks, so a
call on meta tensors, under FakeTensorMode or traced by torch.compile raises the message a CPU
call raises. The reference interpreter takes the calls the op takes (leading batch dimensions,
inputs by name, the op's dtypes), and the SwiGLU ops take W_gate and W_up as stored.
"""
from __future__ import annotations

import gc
import re

import pytest
import torch
import torch.nn.functional as F
from torch._subclasses.fake_tensor import FakeTensorMode

import coda_ext as ce
from coda_ext import graphs, ops
from coda_ext.graph.interpret import Outputs
from coda_ext.ops import layouts
from coda_ext.runtime import TunedOp
from tests.helpers import rand

BF16, FP16 = torch.bfloat16, torch.float16
M, N, K = 37, 72, 64
ON_CPU = r"A is on cpu; coda_ext kernels run on a CUDA device: move A and W with \.cuda\(\)"


def _transposed(t: torch.Tensor) -> torch.Tensor:
    """The same values with the last dimension strided (a transposed copy seen through .t())."""
    return t.t().contiguous().t()


def _meta(t):
    """t on the meta device with t's shape and strides."""
    return torch.empty_strided(t.shape, t.stride(), dtype=t.dtype, device="meta") if isinstance(t, torch.Tensor) else t


def _raises(call, args: dict, device: str, error: type, message: str) -> None:
    """call(**args) with the tensors of `args` on `device` ("cpu", "meta", "fake": FakeTensorMode, or
    "compile": the CPU tensors through torch.compile(fullgraph=True)) raises `message`."""
    if device == "compile":
        torch._dynamo.reset()
        names = list(args)
        compiled = torch.compile(lambda *a: call(**dict(zip(names, a))), fullgraph=True, backend="eager")
        with pytest.raises(Exception) as e:  # noqa: PT011  (Dynamo wraps what a fake raises in its own error)
            compiled(*args.values())
        assert re.search(message, str(e.value)), str(e.value)
        return
    if device == "fake":
        with pytest.raises(error, match=message), FakeTensorMode() as mode:
            call(**{k: mode.from_tensor(v) if isinstance(v, torch.Tensor) else v for k, v in args.items()})
    else:
        with pytest.raises(error, match=message):
            call(**{k: _meta(v) if device == "meta" else v for k, v in args.items()})


DEVICES = ["cpu", "meta", "fake", "compile"]


# --- a compiled op ------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def example_op():
    """graphs.example() (a bias row vector and a residual tile; D, a store and a row reduction) as an "auto"
    op: its kernel sources, no kernel."""
    return ce.compile(graphs.example(), "bfloat16", "auto")


def _example_call(**change):
    gen = rand.generator("mistakes", tuple(change))
    args = dict(A=rand.randn(gen, M, K, dtype=BF16), W=rand.randn(gen, N, K, dtype=BF16, scale=K ** -0.5),
                bias=rand.randn(gen, N, dtype=BF16), residual=rand.randn(gen, M, N, dtype=BF16))
    args.update({k: v(args) for k, v in change.items()})
    return args


OP_MISTAKES = {   # id: (change of a valid call, error, message)
    "K of W differs": (dict(W=lambda a: a["W"][:, :56].contiguous()), ValueError,
                       r"A is \(M, K\) = \(37, 64\) but W is \(72, 56\): W must be \(N, K\) with the same K"),
    "bias length": (dict(bias=lambda a: a["bias"][:64]), ValueError, r"bias must have shape \(72,\), got \(64,\)"),
    "A not contiguous": (dict(A=lambda a: _transposed(a["A"])), ValueError,
                         r"A must have a contiguous last dimension \(stride 1\), got strides \(1, 37\)"),
    "K = 100": (dict(A=lambda a: torch.ones(M, 100, dtype=BF16), W=lambda a: torch.ones(N, 100, dtype=BF16)),
                ValueError, (r"A's rows are 200 bytes apart; they must be a multiple of 16 bytes \(pad the last "
                             r"dimension to a multiple of 8\)")),
    "N not a multiple of 8": (dict(W=lambda a: a["W"][:68], bias=lambda a: a["bias"][:68],
                                   residual=lambda a: a["residual"][:, :68].contiguous()), ValueError,
                              r"N = 68 \(W.shape\[0\]\) must be a multiple of 8 for this graph: its row vector"),
    "W dtype": (dict(W=lambda a: a["W"].half()), TypeError,
                r"W has dtype torch.float16, expected torch.bfloat16; convert it with \.to\(torch.bfloat16\)"),
    "residual dtype": (dict(residual=lambda a: a["residual"].half()), TypeError,
                       r"residual has dtype torch.float16, expected torch.bfloat16"),
    "residual not contiguous": (dict(residual=lambda a: _transposed(a["residual"])), ValueError,
                                r"residual must have a contiguous last dimension"),
    "residual of another batch": (dict(residual=lambda a: a["residual"][:36]), ValueError,
                                  r"residual must have shape \(37, 72\), got \(36, 72\)"),
}


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("case", list(OP_MISTAKES))
def test_a_compiled_op_names_each_mistake_on_any_device(example_op, case, device):
    """Regression: on CPU tensors every mistake said only "move to CUDA"; on meta and fake tensors, and
    while torch.compile traced the call, none was seen."""
    change, error, message = OP_MISTAKES[case]
    _raises(lambda A, W, **inputs: example_op(A, W, **inputs), _example_call(**change), device, error, message)


def test_a_valid_call_is_refused_for_its_device_last(example_op):
    """The valid call: on the CPU the device is the one thing wrong; on meta tensors (the fake) the outputs'
    shapes and dtypes, for A with leading batch dimensions too."""
    args = _example_call()
    with pytest.raises(ValueError, match=ON_CPU):
        example_op(**args)
    out = example_op(**{k: _meta(v) for k, v in args.items()})
    assert {k: (tuple(v.shape), v.dtype) for k, v in out.items()} == {
        "out": ((M, N), BF16), "pre": ((M, N), BF16), "sqsum": ((M,), torch.float32)}
    A3, r3 = _meta(args["A"][:36].reshape(4, 9, K)), _meta(args["residual"][:36].reshape(4, 9, N))
    out = example_op(A3, _meta(args["W"]), bias=_meta(args["bias"]), residual=r3)
    assert {k: tuple(v.shape) for k, v in out.items()} == {"out": (4, 9, N), "pre": (4, 9, N), "sqsum": (4, 9)}


def test_inputs_are_passed_by_name(example_op):
    args = _example_call()
    message = (r"1 positional argument\(s\) after A and W: inputs are passed by name, op\(A, W, bias=\.\.\., "
               r"residual=\.\.\.\); the graph's inputs are \['bias', 'residual'\]")
    with pytest.raises(TypeError, match=message):
        example_op(args["A"], args["W"], args["bias"], residual=args["residual"])


# --- the ready ops --------------------------------------------------------------------------------------


def _ready_args():
    gen = rand.generator("ready mistakes")
    nh, nkv, hd = 4, 2, 64
    return dict(x=rand.randn(gen, M, K, dtype=BF16), w=rand.randn(gen, N, K, dtype=BF16, scale=K ** -0.5),
                res=rand.randn(gen, M, N, dtype=BF16), nw=rand.randn(gen, N, dtype=BF16),
                rstd=rand.positive(gen, M), w_gu=rand.randn(gen, 2 * N, K, dtype=BF16, scale=K ** -0.5),
                w_qkv=rand.randn(gen, (nh + 2 * nkv) * hd, K, dtype=BF16, scale=K ** -0.5),
                pos=torch.arange(M, dtype=torch.float32), freqs=ops.rope_frequencies(hd, nh, nkv),
                w_lm=rand.randn(gen, 1000, K, dtype=BF16), target=torch.arange(M))


READY_MISTAKES = {   # id: (call, the changed arguments, error, message)
    "linear_swiglu K = 100": (
        lambda x, w_gu: ops.linear_swiglu(x, w_gu),
        lambda a: dict(x=torch.ones(M, 100, dtype=BF16), w_gu=torch.ones(2 * N, 100, dtype=BF16)), ValueError,
        r"linear_swiglu: x's rows are 200 bytes apart; they must be a multiple of 16 bytes"),
    "rms_linear x not contiguous": (
        lambda x, w, rstd: ops.rms_linear(x, w, rstd), lambda a: dict(x=_transposed(a["x"]), w=a["w"], rstd=a["rstd"]),
        ValueError, r"rms_linear: x must have a contiguous last dimension \(stride 1\), got strides \(1, 37\)"),
    "linear_residual_norm residual not contiguous": (
        lambda x, w, res, nw: ops.linear_residual_norm(x, w, res, nw),
        lambda a: dict(x=a["x"], w=a["w"], res=_transposed(a["res"]), nw=a["nw"]), ValueError,
        r"linear_residual_norm: residual must have a contiguous last dimension"),
    "linear_residual_norm N = 68": (
        lambda x, w, res, nw: ops.linear_residual_norm(x, w, res, nw),
        lambda a: dict(x=a["x"], w=a["w"][:68], res=a["res"][:, :68].contiguous(), nw=a["nw"][:68]), ValueError,
        (r"linear_residual_norm: N = 68 \(weight.shape\[0\]\) must be a multiple of 8 for this graph: its row "
         r"vector input\(s\) \['norm_weight'\]")),
    "linear_dx weight rows read along N": (
        lambda dz, w: ops.linear_dx(dz, w),
        lambda a: dict(dz=torch.ones(M, 72, dtype=BF16), w=torch.ones(72, 60, dtype=BF16)), ValueError,
        (r"linear_dx: weight.t\(\) \(N, K\) = \(60, 72\) is read along N: N and the stride of K must be multiples "
         r"of 8")),
    "qkv_rope custom op with head counts that do not fit": (
        lambda x, w_qkv, pos, freqs: torch.ops.coda_ext.qkv_rope(x, w_qkv, pos, freqs, None, None, None, 5, 2, 1e-6),
        lambda a: dict(x=a["x"], w_qkv=a["w_qkv"], pos=a["pos"], freqs=a["freqs"]), ValueError,
        r"qkv_rope: weight has 512 rows, not a multiple of n_heads \+ 2·n_kv_heads = 9 heads"),
    "lm_head custom op with float targets": (
        lambda x, w_lm, target: torch.ops.coda_ext.lm_head_cross_entropy(x, w_lm, target, None, -100, "mean"),
        lambda a: dict(x=a["x"], w_lm=a["w_lm"], target=a["target"].float()), TypeError,
        r"lm_head_cross_entropy: target has dtype torch.float32; use integer class indices"),
    "rms_linear custom op in fp32": (
        lambda x, w, rstd: torch.ops.coda_ext.rms_linear(x, w, rstd, ""),
        lambda a: dict(x=a["x"].float(), w=a["w"].float(), rstd=a["rstd"]), ValueError,
        r"rms_linear: GEMM operands must be torch.bfloat16 or torch.float16"),
}


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("case", list(READY_MISTAKES))
def test_a_ready_op_names_each_mistake_on_any_device(case, device):
    """Regression: as for a compiled op; the messages name the ready op and its arguments (x, weight)."""
    call, args, error, message = READY_MISTAKES[case]
    _raises(call, args(_ready_args()), device, error, message)


def test_a_valid_ready_op_call_is_refused_for_its_device_last():
    a = _ready_args()
    with pytest.raises(ValueError, match=ON_CPU):
        ops.linear_residual_norm(a["x"], a["w"], a["res"], a["nw"])
    out, h, rstd = ops.linear_residual_norm(*(_meta(a[k]) for k in ("x", "w", "res", "nw")))
    assert [(tuple(t.shape), t.dtype) for t in (out, h, rstd)] == [((M, N), BF16), ((M, N), BF16),
                                                                   ((M,), torch.float32)]


@pytest.mark.parametrize("heads,table", [((2, 3), (64, 4, 2)), ((4, 2), (64, 2, 3)), ((4, 2), (128, 2, 1))],
                         ids=["counts", "table counts", "table head_dim"])
def test_qkv_rope_refuses_a_table_of_other_heads(heads, table):
    """Regression: a rope_frequencies table built for other head counts or another head_dim has the shape
    (2, N) of the right one, and the op rotated the wrong columns (on the CPU: "move to CUDA"). Its values
    are read on real tensors only."""
    a = _ready_args()
    freqs = ops.rope_frequencies(*table)
    message = (rf"qkv_rope: freqs is not the table of rope_frequencies\(head_dim=64, n_heads={heads[0]}, "
               rf"n_kv_heads={heads[1]}\)")
    with pytest.raises(ValueError, match=message):
        ops.qkv_rope(a["x"], a["w_qkv"], a["pos"], freqs, *heads)
    with pytest.raises(ValueError, match=ON_CPU):   # the right table: only the device is wrong
        ops.qkv_rope(a["x"], a["w_qkv"], a["pos"], ops.rope_frequencies(64, *heads), *heads)


def test_split_qkv_names_head_counts_that_do_not_fit():
    with pytest.raises(ValueError, match=r"split_qkv: the last dimension 512 is not n_heads \+ 2·n_kv_heads = 9 heads"):
        ops.split_qkv(torch.zeros(3, 512), 5, 2)
    q, k, v = ops.split_qkv(torch.arange(512.0).expand(3, 512), 4, 2)
    assert q.shape == (3, 4, 64) and k.shape == v.shape == (3, 2, 64) and v[0, 1, 63].item() == 511.0


# --- the reference interpreter takes the calls the op takes ----------------------------------------------


def test_interpret_takes_leading_batch_dimensions_as_the_op_does(example_op):
    """Regression: a 3-D A (B, S, K) was refused. Per-token inputs and outputs carry the batch dimensions,
    with the values of the flattened call, and the shapes the op's fake gives."""
    a = _example_call()
    A3, r3 = a["A"][:36].reshape(4, 9, K), a["residual"][:36].reshape(4, 9, N)
    got = ce.interpret(graphs.example(), A3, a["W"], bias=a["bias"], residual=r3)
    flat = ce.interpret(graphs.example(), A3.reshape(36, K), a["W"], bias=a["bias"], residual=r3.reshape(36, N))
    assert set(got) == {"out", "pre", "sqsum"}
    for k in got:
        assert torch.equal(got[k], flat[k].reshape(got[k].shape)), k
    fake = example_op(_meta(A3), _meta(a["W"]), bias=_meta(a["bias"]), residual=_meta(r3))
    assert {k: tuple(v.shape) for k, v in got.items()} == {k: tuple(v.shape) for k, v in fake.items()}
    assert got["sqsum"].shape == (4, 9)


def test_interpret_refuses_the_dtypes_the_op_refuses(example_op):
    """Regression: an fp16 tile in a bf16 call was taken. With bf16/fp16 operands the interpreter refuses
    what the op refuses, with the op's message; fp32/fp64 operands (a reference) take any dtype."""
    a = _example_call(residual=lambda a: a["residual"].half())
    with pytest.raises(TypeError) as from_op:
        example_op(_meta(a["A"]), _meta(a["W"]), bias=_meta(a["bias"]), residual=_meta(a["residual"]))
    with pytest.raises(TypeError) as from_interpret:
        ce.interpret(graphs.example(), a["A"], a["W"], bias=a["bias"], residual=a["residual"])
    assert str(from_interpret.value) == str(from_op.value) == \
        "residual has dtype torch.float16, expected torch.bfloat16; convert it with .to(torch.bfloat16)"
    with pytest.raises(TypeError, match=r"W has dtype torch.float16, expected torch.bfloat16"):
        ce.interpret(graphs.example(), a["A"], a["W"].half(), bias=a["bias"], residual=a["residual"].bfloat16())
    ref = ce.interpret(graphs.example(), a["A"].double(), a["W"].double(), bias=a["bias"], residual=a["residual"])
    acc = a["A"].double() @ a["W"].double().t()
    torch.testing.assert_close(ref["pre"], (acc + a["bias"].double()).float())


def test_interpret_says_inputs_are_passed_by_name():
    """Regression: positional inputs gave Python's bare "takes 3 positional arguments"."""
    a = _example_call()
    message = (r"2 positional argument\(s\) after A and W: inputs are passed by name, interpret\(graph, A, W, "
               r"bias=\.\.\., residual=\.\.\.\); the graph's inputs are \['bias', 'residual'\]")
    with pytest.raises(TypeError, match=message):
        ce.interpret(graphs.example(), a["A"], a["W"], a["bias"], a["residual"])


# --- SwiGLU on W_gate and W_up as stored ------------------------------------------------------------------


@pytest.fixture
def interpreted(monkeypatch):
    """Every kernel launch of a ready op (TunedOp.launch, after the checks) is the interpreter in fp64, rounded
    as the kernel writes."""
    def launch(self, A, W, inputs, out, M, N):
        got = ce.interpret(self.graph, A, W, compute_dtype=torch.float64, **inputs)
        return Outputs({k: v.to(self.output_spec(k, M, N)[1]) for k, v in got.items()})

    monkeypatch.setattr(TunedOp, "launch", launch)


def _gate_up(key, F_=72):
    gen = rand.generator("gate-up", key)
    return (rand.randn(gen, 2, 5, K, dtype=BF16), rand.randn(gen, F_, K, dtype=BF16, scale=K ** -0.5),
            rand.randn(gen, F_, K, dtype=BF16, scale=K ** -0.5), rand.positive(gen, 2, 5))


def test_swiglu_takes_gate_and_up_as_stored(interpreted):
    """linear_swiglu(x, (W_gate, W_up)) is silu(x W_gateᵀ) · (x W_upᵀ) (torch.cat([W_gate, W_up]), the
    mistake the pair API rules out, is not), and equals the call on the interleaved weight."""
    x, wg, wu, rstd = _gate_up("values")
    y = ops.linear_swiglu(x, (wg, wu), rstd)
    want = F.silu(rstd.double()[..., None] * (x.double() @ wg.double().t())) * \
        (rstd.double()[..., None] * (x.double() @ wu.double().t()))
    torch.testing.assert_close(y.double(), want, rtol=1e-2, atol=1e-2)
    assert torch.equal(y, ops.linear_swiglu(x, ops.interleave_gate_up(wg, wu), rstd))
    assert not torch.allclose(ops.linear_swiglu(x, torch.cat([wg, wu]), rstd).double(), want, rtol=1e-2, atol=1e-2)
    y2, z = ops.linear_swiglu_train(x, [wg, wu], rstd)
    assert torch.equal(y2, y) and z.shape == (2, 5, 2 * 72)


def test_gate_up_is_interleaved_once_per_weight_version():
    _, wg, wu, _ = _gate_up("cache")
    first = layouts.gate_up_weight((wg, wu))
    assert torch.equal(first, ops.interleave_gate_up(wg, wu))
    assert layouts.gate_up_weight((wg, wu)) is first                  # kept
    wg.mul_(2)                                                        # an in-place update (an optimizer step)
    second = layouts.gate_up_weight((wg, wu))
    assert second is not first and torch.equal(second, ops.interleave_gate_up(wg, wu))
    wu.data = wu.data.float().to(BF16) + 1                            # .data replaced
    assert torch.equal(layouts.gate_up_weight((wg, wu)), ops.interleave_gate_up(wg, wu))
    key = (id(wg), id(wu))
    assert key in layouts._INTERLEAVED
    del wg
    gc.collect()
    assert key not in layouts._INTERLEAVED                            # the copy goes with its weights


def test_gate_up_gradients_reach_both_weights(interpreted):
    """Through the kept copy, over two steps with the weights updated in between: the gradients of
    W_gate and W_up are those of the same call on the (differentiable) interleave_gate_up."""
    x, wg0, wu0, rstd = _gate_up("grads")
    for step in range(2):
        wg, wu = wg0.clone().requires_grad_(), wu0.clone().requires_grad_()
        y, z = ops.linear_swiglu_train(x, (wg, wu), rstd)
        (y.float().sum() + z.float().square().sum()).backward()
        wg2, wu2 = wg0.clone().requires_grad_(), wu0.clone().requires_grad_()
        y2, z2 = ops.linear_swiglu_train(x, ops.interleave_gate_up(wg2, wu2), rstd)
        (y2.float().sum() + z2.float().square().sum()).backward()
        assert torch.equal(wg.grad, wg2.grad) and torch.equal(wu.grad, wu2.grad), step
        assert wg.grad.abs().sum() > 0 and wu.grad.abs().sum() > 0
        wg0.add_(0.25)


def test_gate_up_pair_traces_without_a_graph_break(interpreted):
    x, wg, wu, rstd = _gate_up("compile")
    torch._dynamo.reset()
    compiled = torch.compile(lambda *a: ops.linear_swiglu(a[0], (a[1], a[2]), a[3]), fullgraph=True,
                             backend="eager")
    assert torch.equal(compiled(x, wg, wu, rstd), ops.linear_swiglu(x, (wg, wu), rstd))


@pytest.mark.parametrize("weight,error,message", [
    (lambda wg, wu: (wg, wu, wu), TypeError, (r"weight must be the interleaved \(2F, d\) tensor .* or a \(W_gate, "
                                              r"W_up\) pair of \(F, d\) tensors, got tuple")),
    (lambda wg, wu: (wg, wu[:64]), ValueError, r"W_gate \(72, 64\) .* and W_up \(64, 64\) .* must have one shape"),
    (lambda wg, wu: (wg, wu.half()), ValueError, r"W_gate .* and W_up .* must have one shape, dtype and device"),
])
def test_gate_up_pair_mistakes(weight, error, message):
    x, wg, wu, _ = _gate_up("mistakes")
    with pytest.raises(error, match=rf"linear_swiglu: {message}"):
        ops.linear_swiglu(x, weight(wg, wu))


def test_a_layout_checked_before_still_has_its_pointers_checked(example_op):
    """run() remembers argument layouts check_call passed and then repeats only the data-pointer check: a
    misaligned tensor of a remembered layout, a new shape and given outputs are still refused by name."""
    args = _example_call()
    A, W = args.pop("A"), args.pop("W")
    with pytest.raises(ValueError, match=ON_CPU):   # every check passes; the launch refuses the CPU
        example_op.run(A, W, args, {})
    assert len(example_op._checked) == 1
    shifted = torch.empty(M * N + 1, dtype=BF16)[1:].view(M, N)   # the residual's layout, 2 bytes off
    with pytest.raises(ValueError, match="residual's data pointer is not 16-byte aligned"):
        example_op.run(A, W, {**args, "residual": shifted}, {})
    with pytest.raises(ValueError, match="residual"):
        example_op.run(A, W, {**args, "residual": args["residual"][:, :8]}, {})
    out = {"out": torch.empty(M, N + 8, dtype=BF16)}
    with pytest.raises(ValueError, match=r"out\['out'\]"):
        example_op.run(A, W, args, out)
    assert len(example_op._checked) == 1


def test_ready_ops_remember_checked_layouts_and_still_check_pointers(monkeypatch):
    """A ready op's checks (common.check_gemm, before every launch and in the fakes) are remembered per argument
    layout as run()'s are: the second call of a layout runs no full check, a misaligned tensor of that layout
    is still refused by name, and the names in messages stay the ready op's."""
    from coda_ext.ops import common, linear_grad
    from coda_ext.runtime import interface

    gen = rand.generator("remembered layouts")
    x, w = rand.randn(gen, M, K, dtype=BF16), rand.randn(gen, N, K, dtype=BF16)
    residual = rand.randn(gen, M, N, dtype=BF16)
    full = []
    real = interface.GraphOp.check_call
    monkeypatch.setattr(interface.GraphOp, "check_call", lambda self, *a, **k: full.append(1) or real(self, *a, **k))
    build = linear_grad._gemm("linear_residual", x, w, residual)
    op = common.check_gemm(**build)
    op._checked.clear()
    full.clear()
    for _ in range(3):
        common.check_gemm(**build)
    assert len(full) == 1 and len(op._checked) == 1
    shifted = torch.empty(M * N + 1, dtype=BF16)[1:].view(M, N)
    with pytest.raises(ValueError, match="linear_residual: residual's data pointer is not 16-byte aligned"):
        common.check_gemm(**{**build, "inputs": {"residual": shifted}})
    with pytest.raises(ValueError, match=r"linear_residual: .*x"):
        common.check_gemm(**{**build, "A": x[:, :56]})
    assert len(op._checked) == 1
