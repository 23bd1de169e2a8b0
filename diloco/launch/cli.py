"""Launchers' command lines: the --config spec and --config.KEY=VALUE overrides, the flags the
TPU scripts share, the --token_from flag of every process, and running or printing commands."""

import os
import shlex
import subprocess
import sys

from absl import app, flags
from ml_collections import config_flags

from diloco.launch import staging, tokens

DEFAULT_TOKEN = "env:DILOCO_TOKEN"


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


def define_token_flag() -> flags.FlagHolder:
  """--token_from, read with `read_token`."""
  return flags.DEFINE_string(
      "token_from",
      DEFAULT_TOKEN,
      "Where the shared token is: env:NAME, file:PATH (mode 600) or k8s:NAMESPACE/SECRET/KEY.",
  )


def read_token(holder: flags.FlagHolder) -> str:
  """The token --token_from names; a UsageError saying what is wrong."""
  try:
    return tokens.read(holder.value)
  except ValueError as err:
    raise app.UsageError(f"--token_from: {err}") from err


def define_launcher_flags(workdir: str, workdir_help: str) -> None:
  """--config, --run, --workdir, --stage_dir and --plan of the TPU scripts (defined when they
  run, not at import, so that tests can import them)."""
  config_flags.DEFINE_config_file("config", None, "Config file (get_config(arg)).")
  flags.DEFINE_bool("run", False, "Run the commands instead of printing them.")
  flags.DEFINE_string("workdir", workdir, workdir_help)
  flags.DEFINE_string("stage_dir", staging.Stage().dir, "Local directory for the pack and token.")
  define_plan_flag()


def define_plan_flag() -> None:
  """--plan: compile a learner for its slice before anything is created (launch/preflight.py)."""
  flags.DEFINE_bool(
      "plan",
      True,
      "Plan a learner on its TPU slice before creating anything; a plan that does not fit stops "
      "the launch (--noplan skips it, saying so).",
  )


def launcher_args(argv: list[str]) -> tuple[staging.Stage, str, tuple[str, ...]]:
  """The stage, --config spec and overrides of a TPU script's command line."""
  if len(argv) > 1:
    raise app.UsageError(f"unexpected arguments: {argv[1:]}")
  return (
      staging.Stage(flags.FLAGS.stage_dir),
      config_spec(sys.argv[1:]),
      config_overrides(sys.argv[1:]),
  )


def run_or_print(cmds: list[list[str]], run: bool, stage) -> None:
  """Prints every command; with `run`, first writes $DILOCO_TOKEN to the stage's mode-600 file
  (the commands read it from there, none holds it) and runs each command after printing it."""
  if run:
    token = os.environ.get("DILOCO_TOKEN", "")
    if not token:
      raise app.UsageError("set DILOCO_TOKEN to the shared secret before --run")
    print(f"# token written to {stage.write_token(token)} (mode 600)", flush=True)
  for cmd in cmds:
    print(shlex.join(cmd), flush=True)
    if run:
      subprocess.run(cmd, check=True)
  if not run:
    print("# dry run: nothing was executed (add --run)", file=sys.stderr)
