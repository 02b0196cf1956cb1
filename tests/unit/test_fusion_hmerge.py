"""passes.hmerge: GEMMs of one input merged into one GEMM of their concatenated weights, with their dX GEMMs (one
sum of adds) and weight gradients, on FX graphs made by hand as AOTAutograd writes a joint graph; and the
backend on the tiny Llama-like model, whose q, k and v projections it merges (loss and gradients equal eager's)."""
from __future__ import annotations

import copy

import pytest
import torch
from torch import fx
from torch.fx.experimental.proxy_tensor import make_fx

from coda_ext.fusion import fx_util
from coda_ext.fusion.passes import GEMM, hmerge, layout, merge_gemms

aten = torch.ops.aten
M, K, WIDTHS = 6, 8, (4, 2, 2)


def trace(fn, *args) -> fx.GraphModule:
    return layout(make_fx(fn, tracing_mode="fake")(*args))


def gemms(gm: fx.GraphModule) -> list[fx.Node]:
    return [n for n in gm.graph.nodes if n.op == "call_function" and n.target is GEMM]


def inputs(seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    r = lambda *s: torch.randn(s, generator=g, dtype=torch.float64)   # noqa: E731
    x = r(M, K)
    ws = [r(n, K) for n in WIDTHS]
    dzs = [r(M, n) for n in WIDTHS]
    return x, ws, dzs, r(M, K)


def attention_projections(x, wq, wk, wv, dq, dk, dv, residual):
    """A layer's q, k, v projections of one input, as the joint graph has them: the forward GEMMs, the dX GEMMs
    summed (with the residual stream's gradient), the weight gradients."""
    q, k, v = x @ wq.t(), x @ wk.t(), x @ wv.t()
    dx = dq @ wq + dk @ wk + dv @ wv + residual
    return q * 2.0, k, v, dx, dq.t() @ x, dk.t() @ x, dv.t() @ x


def check_same(gm, out, args):
    for a, b in zip(gm(*args), out(*args), strict=True):
        torch.testing.assert_close(b, a, rtol=1e-12, atol=1e-12)


def test_projections_of_one_input_become_one_gemm_each_way():
    x, ws, dzs, res = inputs()
    args = (x, *ws, *dzs, res)
    gm = trace(attention_projections, *args)
    assert len(gemms(gm)) == 9
    out = merge_gemms(gm)
    merged = gemms(out)
    assert sorted(n.args[2] for n in merged) == ["kk", "kn", "mn"]
    by_major = {n.args[2]: n for n in merged}
    assert tuple(by_major["kk"].meta["val"].shape) == (M, sum(WIDTHS))    # x @ cat(W)ᵀ
    assert tuple(by_major["kn"].meta["val"].shape) == (M, K)              # cat(dz) @ cat(W): K = ΣN
    assert tuple(by_major["kn"].args[0].meta["val"].shape) == (M, sum(WIDTHS))
    assert tuple(by_major["mn"].meta["val"].shape) == (sum(WIDTHS), K)    # cat(dz)ᵀ @ x
    # the partial sums are gone: one add left, the residual's
    assert sum(n.target is aten.add.Tensor for n in out.graph.nodes) == 1
    assert by_major["kn"].args[1] is by_major["kk"].args[1]               # the forward's concatenated weights
    check_same(gm, out, args)
    assert len(gemms(gm)) == 9                                            # a pure function
    # each merged GEMM's identity (a measured veto names GEMMs by it) joins its parts', as layout named them
    ids = {n.args[2]: sorted(fx_util.gemm_id(g) for g in gemms(gm) if g.args[2] == n.args[2]) for n in merged}
    for major, n in by_major.items():
        assert sorted(fx_util.gemm_id(n).split("+")) == ids[major] and len(ids[major]) == 3
    assert all(fx_util.gemm_id(g) == g.name for g in gemms(gm))             # layout's own


def test_allowed_limits_the_merge_and_a_lone_gemm_stays():
    x, ws, dzs, res = inputs(1)
    args = (x, *ws, *dzs, res)
    gm = trace(attention_projections, *args)
    forward = [n.name for n in gemms(gm) if n.args[2] == "kk"]
    out = merge_gemms(gm, allowed=forward[:2])                             # q and k only
    majors = sorted(n.args[2] for n in gemms(out))
    assert majors.count("kk") == 2 and majors.count("mn") == 2            # (q, k) merged; v alone
    # v's dX GEMM is a term of the sum the merged dX GEMM joins: the sum keeps it as another term
    assert majors.count("kn") == 2
    check_same(gm, out, args)
    assert len(gemms(merge_gemms(gm, allowed=forward[:1]))) == 9               # one GEMM: nothing to merge


def test_gemms_of_other_inputs_or_computed_weights_are_not_merged():
    x, ws, _dzs, res = inputs(2)

    def two_inputs(x, wq, wk, y):
        return x @ wq.t(), y @ wk.t()

    gm = trace(two_inputs, x, ws[0], ws[1], res)
    assert hmerge.groups(gm) == []

    def computed_weight(x, wq, wk):
        return x @ wq.t(), x @ (wk * 2.0).t()                            # a weight that is not a parameter

    gm = trace(computed_weight, x, ws[0], ws[1])
    assert hmerge.groups(gm) == []
    assert merge_gemms(gm).code == gm.code


def test_dx_gemms_not_summed_keep_their_own_gemms():
    """The forward and the weight gradients merge; dX GEMMs whose results are read apart stay as they are."""
    x, ws, dzs, _res = inputs(3)

    def apart(x, wq, wk, dq, dk):
        return x @ wq.t(), x @ wk.t(), dq @ wq, dk @ wk, dq.t() @ x, dk.t() @ x

    args = (x, ws[0], ws[1], dzs[0], dzs[1])
    gm = trace(apart, *args)
    out = merge_gemms(gm)
    assert sorted(n.args[2] for n in gemms(out)) == ["kk", "kn", "kn", "mn"]
    check_same(gm, out, args)


def test_the_sum_may_run_through_views_and_in_any_order():
    x, ws, dzs, res = inputs(4)

    def viewed(x, wq, wk, wv, dq, dk, dv, residual):
        q, k, v = x @ wq.t(), x @ wk.t(), x @ wv.t()
        parts = [(d @ w).view(2, 3, K) for d, w in ((dq, wq), (dk, wk), (dv, wv))]
        dx = parts[2] + (residual.view(2, 3, K) + parts[0]) + parts[1]
        return q, k, v, dx

    args = (x, *ws, *dzs, res)
    gm = trace(viewed, *args)
    out = merge_gemms(gm)
    assert sorted(n.args[2] for n in gemms(out)) == ["kk", "kn"]
    check_same(gm, out, args)


@pytest.mark.usefixtures("fresh_dynamo")
def test_the_tiny_llama_merges_q_k_v_and_matches_eager():
    """Through the backend (eager fallback, the interpreter running each kernel): the q, k and v projections of
    every layer become one GEMM each way (6 GEMMs fewer a layer), and the loss and gradients stay eager's."""
    pytest.importorskip("transformers")
    import coda_ext.fusion as cf
    from benchmarks.bench_autofusion import MODELS, build_model, make_batch

    spec = MODELS["llama-1b"]
    torch.manual_seed(0)
    model = build_model(spec, tiny=True)
    layers = model.config.num_hidden_layers
    batch = make_batch(spec, model, spec.tiny_batch, torch.Generator().manual_seed(3), torch.float32)

    def run(m, **options):
        backend = cf.CodaBackend(fallback="eager", **options)
        compiled = torch.compile(m, backend=backend, fullgraph=True, dynamic=False)
        compiled.zero_grad(set_to_none=True)
        loss = compiled(**batch).loss
        loss.backward()
        (graph,) = backend.report.graphs
        return loss.detach(), {n: p.grad.clone() for n, p in m.named_parameters()}, graph

    loss, grads, graph = run(copy.deepcopy(model))
    loss_u, _grads_u, graph_u = run(copy.deepcopy(model), merge=False)
    eager = copy.deepcopy(model)
    eager(**batch).loss.backward()
    assert graph.gemms == graph_u.gemms - 6 * layers
    # the report names each merge: the three projections of each layer's normalised input
    assert len(graph.merged) == layers and graph_u.merged == ()
    assert all(x.endswith(f"N {q} + {kv} + {kv}") for x in graph.merged
               for q, kv in [(model.config.num_attention_heads * model.config.head_dim,
                              model.config.num_key_value_heads * model.config.head_dim)])
    assert "merged into one GEMM of their concatenated weights" in str(graph)
    torch.testing.assert_close(loss, loss_u, rtol=1e-6, atol=1e-6)
    for n, p in eager.named_parameters():
        torch.testing.assert_close(grads[n], p.grad, rtol=1e-5, atol=1e-6, msg=lambda m, n=n: f"{n}: {m}")
