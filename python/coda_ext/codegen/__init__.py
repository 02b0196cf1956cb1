"""Graph -> C++: the visitor plan (plan.py) and the source emitter (emit.py)."""
from .emit import emit
from .plan import Plan, plan

__all__ = ["Plan", "emit", "plan"]
