"""The worker: CP prefill engine (torch) and its gRPC service."""
