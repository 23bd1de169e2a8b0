"""Reading a launcher's command line: the --config spec and the --config.KEY=VALUE overrides."""


def config_spec(argv: list[str]) -> str:
  """The value of --config (file[:args]) on a command line."""
  for i, a in enumerate(argv):
    if a.startswith("--config="):
      return a.split("=", 1)[1]
    if a == "--config" and i + 1 < len(argv):
      return argv[i + 1]
  raise ValueError("--config is required")


def config_overrides(argv: list[str]) -> tuple[str, ...]:
  """The --config.KEY=VALUE flags of a command line (a value in the next argument is joined)."""
  out, i = [], 0
  while i < len(argv):
    a = argv[i]
    if a.startswith("--config."):
      if "=" not in a and i + 1 < len(argv):
        a, i = f"{a}={argv[i + 1]}", i + 1
      out.append(a)
    i += 1
  return tuple(out)
