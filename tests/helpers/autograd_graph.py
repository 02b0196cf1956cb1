"""Where autograd sums gradients: the backward graph's inputs that receive more than one gradient.

A tensor used twice in the forward has two edges into the backward node (or AccumulateGrad) that
produced it; the autograd engine adds the two gradients before that node runs, an element-wise pass
of its own. summed_gradients(loss.grad_fn) names every such input slot."""
from __future__ import annotations

import collections


def summed_gradients(root) -> list[str]:
    """'NodeName[slot]' (sorted) of every backward-node input that two or more edges of the graph under
    root feed: the places where autograd sums gradients. [] when every input gets one gradient."""
    edges, seen, todo = collections.Counter(), set(), [root]
    while todo:
        fn = todo.pop()
        if fn in seen:
            continue
        seen.add(fn)
        for nxt, slot in fn.next_functions:
            if nxt is not None:
                edges[nxt, slot] += 1
                todo.append(nxt)
    return sorted(f"{fn.name()}[{slot}]" for (fn, slot), n in edges.items() if n > 1)
