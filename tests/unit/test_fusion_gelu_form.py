"""passes.gelu_tanh_form on the graphs Dynamo captures (torch.compile with a backend that keeps them): GELU's
tanh approximation written out in Python, in each spelling a model may use, becomes one
F.gelu(x, approximate="tanh") computing the same values (fp32, random inputs), in a module that keeps
Dynamo's attributes; near misses (a wrong constant, x² for x³, an intermediate read elsewhere, two tensors,
an integer x) stay as written; through the whole backend the joint graph holds
aten.gelu_backward(approximate="tanh") and the gradients equal eager's."""
from __future__ import annotations

import copy
import math
import operator

import pytest
import torch
import torch.nn.functional as F
from torch import fx, nn

import coda_ext.fusion as cf
from coda_ext.fusion import frontend
from coda_ext.fusion.passes import gelu_tanh_form

aten = torch.ops.aten
S = math.sqrt(2.0 / math.pi)

pytestmark = pytest.mark.usefixtures("fresh_dynamo")


def hf_gelu(input):  # noqa: A002  (as transformers spells it)
    """transformers' NewGELUActivation.forward (GPT-2's "gelu_new"), as written there."""
    return 0.5 * input * (1.0 + torch.tanh(math.sqrt(2.0 / math.pi) * (input + 0.044715 * torch.pow(input, 3.0))))


def dynamo_graph(fn, *args) -> fx.GraphModule:
    """The one graph Dynamo captures of fn(*args); its inputs (the parameters it reads among them) in
    gm.example_inputs."""
    graphs = []

    def keep(gm, example_inputs):
        graphs.append((gm, list(example_inputs)))
        return gm.forward

    torch.compile(fn, backend=keep, fullgraph=True, dynamic=False)(*args)
    ((gm, example_inputs),) = graphs
    gm.example_inputs = example_inputs
    return gm


def inputs(*shapes, seed: int = 0) -> list[torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    return [3 * torch.randn(s, generator=g) for s in shapes]


def calls(gm: fx.GraphModule, name: str) -> list[fx.Node]:
    """The call_function / call_method nodes whose target is named `name` (tanh: torch.tanh or Tensor.tanh)."""
    return [n for n in gm.graph.nodes if n.op in ("call_function", "call_method")
            and (n.target if isinstance(n.target, str) else getattr(n.target, "__name__", "")) == name]


def gelu_calls(gm: fx.GraphModule) -> list[fx.Node]:
    out = [n for n in gm.graph.nodes if n.op == "call_function" and n.target is F.gelu]
    assert all(n.kwargs == {"approximate": "tanh"} and len(n.args) == 1 for n in out)
    return out


def same(a: fx.GraphModule, b: fx.GraphModule, *args) -> None:
    for x, y in zip(a(*args), b(*args), strict=True):
        torch.testing.assert_close(x, y, rtol=1e-6, atol=1e-6)


def rewritten(fn, *args, gelus: int = 1) -> fx.GraphModule:
    """fn's Dynamo graph through the pass: `gelus` gelu calls and no tanh left, the same values as the graph
    before, which the pass leaves unchanged."""
    gm = dynamo_graph(fn, *args)
    before = gm.code
    out = gelu_tanh_form(gm)
    assert out is not gm and gm.code == before and calls(gm, "tanh")
    assert len(gelu_calls(out)) == gelus and not calls(out, "tanh")
    same(gm, out, *args)
    return out


def unchanged(fn, *args) -> None:
    """fn's Dynamo graph through the pass: the same nodes, no gelu call, the same values."""
    gm = dynamo_graph(fn, *args)
    out = gelu_tanh_form(gm)
    assert not gelu_calls(out) and len(calls(out, "tanh")) == len(calls(gm, "tanh")) >= 1
    assert [n.target for n in out.graph.nodes] == [n.target for n in gm.graph.nodes]
    same(gm, out, *args)


SPELLINGS = {
    "hf": hf_gelu,
    "x_times_half": lambda x: x * 0.5 * (torch.tanh((x + 0.044715 * x ** 3) * S) + 1.0),
    "half_outside": lambda x: 0.5 * (x * (1 + torch.tanh(S * (x + 0.044715 * x ** 3)))),
    "x_x_x": lambda x: x * 0.5 * (torch.tanh((x + x * x * x * 0.044715) * S) + 1),
    "methods": lambda x: x.mul(0.5).mul(x.pow(3).mul(0.044715).add(x).mul(S).tanh().add(1.0)),
    "torch_functions": lambda x: torch.mul(torch.mul(x, 0.5), torch.add(
        torch.tanh(torch.mul(torch.add(x, torch.mul(torch.pow(x, 3), 0.044715)), S)), 1.0)),
    "fast_gelu": lambda x: 0.5 * x * (1.0 + torch.tanh(x * 0.7978845608 * (1.0 + 0.044715 * x * x))),
    "halved": lambda x: x * (1 + torch.tanh(S * (x + 0.044715 * x ** 3))) / 2,
}


@pytest.mark.parametrize("name", list(SPELLINGS))
def test_each_spelling_becomes_one_gelu_of_the_same_values(name):
    (x,) = inputs((5, 37))
    out = rewritten(SPELLINGS[name], x)
    (g,) = gelu_calls(out)
    assert g.args[0].op == "placeholder"
    torch.testing.assert_close(out(x)[0], F.gelu(x, approximate="tanh"), rtol=0, atol=0)


def test_the_dynamo_graph_of_the_hf_formula_holds_what_the_matcher_reads():
    """torch 2.13's capture: operator.mul / add with the number first, torch.pow(x, 3.0), torch.tanh."""
    (x,) = inputs((5, 37))
    gm = dynamo_graph(hf_gelu, x)
    ops = [n.target for n in gm.graph.nodes if n.op == "call_function"]
    assert ops == [operator.mul, torch.pow, operator.mul, operator.add, operator.mul, torch.tanh, operator.add,
                   operator.mul]


def test_the_gelu_takes_the_outputs_fake_value_and_keeps_dynamos_attributes():
    lin = nn.Linear(37, 37)
    (x,) = inputs((5, 37))
    gm = dynamo_graph(lambda x: hf_gelu(lin(x)) + 1.0, x)
    out = gelu_tanh_form(gm)
    (g,) = gelu_calls(out)
    v = g.meta["example_value"]
    assert isinstance(v, torch.Tensor) and v.shape == (5, 37) and v.dtype == torch.float32
    assert g.args[0].target is torch._C._nn.linear and g.next.target is operator.add
    # AOTAutograd reads these to tell the parameters from the other inputs (static inputs of a CUDA graph)
    assert out._param_name_to_source == gm._param_name_to_source and out.meta == gm.meta
    places = [(a._dynamo_source, b._dynamo_source) for a, b in zip(gm.graph.nodes, out.graph.nodes)
              if a.op == "placeholder"]
    assert len(places) == 3 and all(a == b for a, b in places)
    same(gm, out, *gm.example_inputs)


def test_two_gelus_in_one_graph_are_both_rewritten():
    x, y = inputs((5, 37), (5, 37), seed=1)
    out = rewritten(lambda x, y: hf_gelu(x) * SPELLINGS["methods"](y + 1.0), x, y, gelus=2)
    torch.testing.assert_close(out(x, y)[0], F.gelu(x, approximate="tanh") * F.gelu(y + 1.0, approximate="tanh"),
                               rtol=1e-6, atol=1e-6)


def test_a_gelu_of_a_gelu():
    (x,) = inputs((5, 37), seed=2)
    rewritten(lambda x: hf_gelu(hf_gelu(x)), x, gelus=2)


def test_a_wrong_constant_stays_as_written():
    (x,) = inputs((5, 37))
    unchanged(lambda x: 0.5 * x * (1.0 + torch.tanh(S * (x + 0.04 * torch.pow(x, 3.0)))), x)
    unchanged(lambda x: 0.5 * x * (1.0 + torch.tanh(0.79 * (x + 0.044715 * torch.pow(x, 3.0)))), x)
    unchanged(lambda x: 0.49 * x * (1.0 + torch.tanh(S * (x + 0.044715 * torch.pow(x, 3.0)))), x)


def test_x_squared_for_x_cubed_stays_as_written():
    (x,) = inputs((5, 37))
    unchanged(lambda x: 0.5 * x * (1.0 + torch.tanh(S * (x + 0.044715 * x ** 2))), x)


def test_an_intermediate_read_elsewhere_stays_as_written():
    (x,) = inputs((5, 37))

    def tanh_returned(x):
        t = torch.tanh(S * (x + 0.044715 * torch.pow(x, 3.0)))
        return 0.5 * x * (1.0 + t), t

    def cube_reused(x):
        c = torch.pow(x, 3.0)
        return 0.5 * x * (1.0 + torch.tanh(S * (x + 0.044715 * c))) + c

    unchanged(tanh_returned, x)
    unchanged(cube_reused, x)


def test_two_tensors_in_the_formula_stay_as_written():
    x, y = inputs((5, 37), (5, 37), seed=3)
    unchanged(lambda x, y: 0.5 * x * (1.0 + torch.tanh(S * (y + 0.044715 * torch.pow(y, 3.0)))), x, y)


def test_an_integer_x_stays_as_written():
    x = torch.randint(-4, 5, (5, 37), generator=torch.Generator().manual_seed(5))
    unchanged(hf_gelu, x)


class MLP(nn.Module):
    def __init__(self, d: int = 16, hidden: int = 32):
        super().__init__()
        self.fc1, self.fc2 = nn.Linear(d, hidden), nn.Linear(hidden, d)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc2(hf_gelu(self.fc1(x)))


def test_through_the_backend_the_joint_graph_holds_gelu_backward_and_gradients_equal_eagers(monkeypatch):
    joints = []
    fuse_graph = frontend.fuse_graph

    def spy(gm, *args, **kwargs):
        joints.append(gm)
        return fuse_graph(gm, *args, **kwargs)

    monkeypatch.setattr(frontend, "fuse_graph", spy)
    torch.manual_seed(0)
    model = MLP()
    eager = copy.deepcopy(model)
    (x,) = inputs((4, 8, 16), seed=4)
    grads = []
    for m in (torch.compile(model, backend=cf.CodaBackend(fallback="eager"), fullgraph=True), eager):
        loss = (m(x) ** 2).mean()
        loss.backward()
        grads.append((loss.detach(), [p.grad for p in m.parameters()]))
    (loss, got), (loss_e, want) = grads
    torch.testing.assert_close(loss, loss_e, rtol=1e-5, atol=1e-6)
    assert len(got) == len(want) == 4
    for a, b in zip(got, want, strict=True):
        torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-6)
    (joint,) = joints
    ops = [n for n in joint.graph.nodes if n.op == "call_function"]
    (backward,) = [n for n in ops if n.target is aten.gelu_backward.default]
    assert backward.kwargs.get("approximate", backward.args[2] if len(backward.args) > 2 else None) == "tanh"
    (forward,) = [n for n in ops if n.target is aten.gelu.default]
    assert forward.kwargs.get("approximate") == "tanh"
    assert not [n for n in ops if n.target in (aten.tanh.default, aten.tanh_backward.default)]
