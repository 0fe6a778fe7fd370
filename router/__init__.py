"""The gRPC router of a Vertumnus prefill pool (imported as ``vertumnus.router``)."""
