"""Config helpers: variant parsing, mode presets, the deploy section, and build.py (a run's parts from a config)."""
