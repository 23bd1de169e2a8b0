"""Config files: each has get_config(arg)."""
