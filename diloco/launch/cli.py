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


def run_or_print(cmds: list[list[str]], run: bool, stage) -> None:
  """Prints every command; with `run`, first writes $DILOCO_TOKEN to the stage's mode-600 file
  (the commands read it from there, none holds it) and runs each command after printing it."""
  import os  # pylint: disable=import-outside-toplevel
  import shlex  # pylint: disable=import-outside-toplevel
  import subprocess  # pylint: disable=import-outside-toplevel
  import sys  # pylint: disable=import-outside-toplevel

  if run:
    token = os.environ.get("DILOCO_TOKEN", "")
    if not token:
      raise ValueError("set DILOCO_TOKEN to the shared secret before --run")
    print(f"# token written to {stage.write_token(token)} (mode 600)", flush=True)
  for cmd in cmds:
    print(shlex.join(cmd), flush=True)
    if run:
      subprocess.run(cmd, check=True)
  if not run:
    print("# dry run: nothing was executed (add --run)", file=sys.stderr)
