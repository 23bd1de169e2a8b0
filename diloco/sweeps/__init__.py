"""Sweeps: the points of a config's `get_sweep()`, run in processes with their results written as
rows, and the evaluation set each row was scored on."""
