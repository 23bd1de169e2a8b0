"""Sweep files: get_config(arg) and get_sweep(arg)."""
