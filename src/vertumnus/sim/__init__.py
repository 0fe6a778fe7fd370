"""Trace-driven discrete-event simulator over the policy core."""
