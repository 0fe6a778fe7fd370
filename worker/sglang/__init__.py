"""SGLang as a Vertumnus engine: the pieces that do not need a GPU.

On GPU clusters a Vertumnus worker can be an SGLang 0.5.23 server (one per CP
worker of a domain pod) behind the same worker protocol as the torch engine
(docs/worker.md). This package holds what can be built and tested on CPU:

- :mod:`.command`: the exact ``python -m sglang.launch_server`` command line
  and environment of a degree-C worker on given GPUs of a domain pod (and the
  ports each server of a pod uses);
- :mod:`.events`: SGLang's KV-cache events as its ZMQ publisher sends them,
  decoded (both encodings) into our worker-level cache changes, rekeyed with
  :mod:`vertumnus.core.keys` so the router's index matches, with sequence-gap
  detection and SGLang's replay protocol;
- :mod:`.subscriber`: a thin pyzmq subscriber around the decoder (pyzmq is
  imported only there, lazily);
- the **adapter**, which starts and supervises one server per worker of a pod's
  grouping and serves our gRPC ``Worker`` protocol on top of them, regrouping by a
  drained restart of the changed servers: :mod:`.adapter` (the pod's workers and
  epochs, the engine surface :mod:`vertumnus.worker.service` serves), :mod:`.runner`
  (one worker: admission, drain, failure), :mod:`.server` (one server process),
  :mod:`.client` (``/generate``, ``/flush_cache``), :mod:`.pump` (events into the
  worker's ``EventLog``), :mod:`.serve` (the endpoints and signals);
- :mod:`.cli`: ``vertumnus worker --engine sglang`` (``--print-command`` prints the
  servers' command lines; without it the adapter runs).

Nothing in this package imports SGLang; pyzmq is imported only where a subscriber is
made. The adapter reuses the torch engine's result types (``vertumnus.worker.engine``),
so it imports torch, which SGLang installs anyway. See docs/sglang.md.
"""
