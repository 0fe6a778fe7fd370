"""Placement policies: Vertumnus's cost model and the baselines it is compared with.

Each policy is one small module implementing :class:`~.base.Policy`. The
simulator and the router call them the same way: ``decide(request, pool)``
returns the worker to use, and the ``observe_*`` hooks let a policy keep the
state it would have in reality (e.g. a tree built from its own decisions).
"""
