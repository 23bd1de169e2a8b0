"""Absl mains: `python -m experiments.<name> --config=configs/<file>.py --workdir=DIR`."""
