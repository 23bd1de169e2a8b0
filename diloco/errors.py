"""The error of input that a command cannot use as given: every main reports it as one line
naming the input and exits 2 (`config/cli.py`), before anything is written."""


class InputError(ValueError):
  """A file, bucket, flag or checkpoint that cannot be used as given; the message names it."""


class MissingInput(InputError, FileNotFoundError):
  """An input that is not there (a file, a bucket, a checkpoint); also a FileNotFoundError."""
