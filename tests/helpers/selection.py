"""What the session's selected tests need: a module fixture that builds kernels for its tests builds only those
the tests that run will launch (`pytest -k gelu_bwd_kn` builds one graph's kernels, not every graph's)."""
from __future__ import annotations

from collections.abc import Iterable
from typing import Any


def selected(request: Any, param: str, every: Iterable[Any]) -> list[Any]:
    """The values of the parametrized argument `param` taken by the session's selected tests (after -k, -m and node
    ids) of the module requesting the fixture, in `every`'s order; all of `every` where one of those tests does not
    take `param` (it may need any of them)."""
    every = list(every)
    taken: set[Any] = set()
    for item in request.session.items:
        if getattr(item, "module", None) is not request.module:
            continue
        params = getattr(getattr(item, "callspec", None), "params", {})
        if param not in params:
            return every
        taken.add(params[param])
    return [v for v in every if v in taken]
