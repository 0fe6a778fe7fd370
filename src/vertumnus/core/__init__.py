"""Pure policy core: no I/O, no clocks, no module state."""
