"""The kopf operator of Vertumnus (imported as ``vertumnus.operator``).

It runs ``CPPool`` custom resources (``crds/cppool.yaml``): one pod per NVLink domain,
the domains scheduled as one gang, and split/merge of CP workers as epoch transitions
through the router's Admin API, each phase recorded in the CPPool status before it is
acted on. Start at :mod:`vertumnus.operator.pool` (one pool's loop) and
:mod:`vertumnus.operator.transitions` (a transition's phases); ``operator/README.md``
lists every module, ``docs/operator.md`` explains the design.
"""
