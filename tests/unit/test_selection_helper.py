"""tests/helpers/selection.py: a module fixture builds the kernels of the selected tests only."""
from __future__ import annotations

from types import SimpleNamespace

from tests.helpers.selection import selected


def _request(module, *items):
    return SimpleNamespace(module=module, session=SimpleNamespace(items=list(items)))


def _item(module, **params):
    return SimpleNamespace(module=module, callspec=SimpleNamespace(params=params))


def test_selected_values_in_the_declared_order():
    here, other = object(), object()
    req = _request(here, _item(here, name="c", tile=1), _item(here, name="a"), _item(other, name="b"))
    assert selected(req, "name", ["a", "b", "c"]) == ["a", "c"]   # another module's tests do not count


def test_a_selected_test_without_the_parameter_takes_every_value():
    here = object()
    unparametrized = SimpleNamespace(module=here)
    assert selected(_request(here, _item(here, name="a"), unparametrized), "name", "abc") == ["a", "b", "c"]
    assert selected(_request(here, _item(here, tile=2)), "name", "ab") == ["a", "b"]
    assert selected(_request(here), "name", "ab") == []
