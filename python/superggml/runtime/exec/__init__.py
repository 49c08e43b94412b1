"""The runtime's top floor: the executor, its graph plans, per-pass placement and profiles."""
