"""The worker: Vertumnus's own CP prefill engine (torch) and its gRPC service.

Start at :mod:`vertumnus.worker.engine` (workers of an epoch over a pool of
rank processes, named by pool-level ids), :mod:`vertumnus.worker.step` (one
zigzag-CP prefill step on a rank), :mod:`vertumnus.worker.events` (the
worker-level cache events a router indexes) and
:mod:`vertumnus.worker.service` (the ``Worker`` gRPC endpoints, stubs in
:mod:`vertumnus._proto`); docs/worker.md explains the design. Importing
this package imports nothing heavy: torch and grpc load with the modules that
need them.
"""
