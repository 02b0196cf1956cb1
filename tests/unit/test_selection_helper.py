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


MODULE = '''
import json, os
import pytest
from tests.helpers.selection import selected

ALL = ("a", "b", "c")


@pytest.fixture(scope="module")
def built(request):
    with open(os.environ["SELECTED_OUT"], "w") as f:
        json.dump(selected(request, "name", ALL), f)


@pytest.fixture
def doubled(request):
    return request.param * 2


@pytest.mark.parametrize("name", ALL, ids=["first", "second", "third"])
def test_direct(built, name):
    pass


@pytest.mark.parametrize("name", ["b"])
@pytest.mark.parametrize("doubled", [1], indirect=True)
def test_indirect(built, name, doubled):
    pass


def test_unparametrized(built):
    pass
'''


def _run(tmp_path, *args):
    import json
    import os
    import pathlib
    import subprocess
    import sys

    (tmp_path / "test_sel.py").write_text(MODULE)
    out = tmp_path / "selected.json"
    root = pathlib.Path(__file__).resolve().parents[2]
    env = {**os.environ, "SELECTED_OUT": str(out), "PYTHONPATH": os.pathsep.join([str(root), str(root / "python")])}
    cmd = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", str(tmp_path / "test_sel.py"), *args]
    proc = subprocess.run(cmd, capture_output=True, text=True, env=env, cwd=tmp_path)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return json.loads(out.read_text())


def test_selected_under_pytest_after_deselection(tmp_path):
    """Under pytest itself: the items are those left after -k (matched on an id here), indirect parameters are kept
    apart from `name`, and a selected test without `name` makes the fixture take every value."""
    assert _run(tmp_path, "-k", "third") == ["c"]
    assert _run(tmp_path, "-k", "second or indirect") == ["b"]
    assert _run(tmp_path, "-k", "first or unparametrized") == ["a", "b", "c"]
