"""Helpers for the tests that watch learner and synchronizer processes through their files."""

import json
import os
import subprocess
import sys
import time

from diloco.rpc import forked


def read_jsonl(path: str) -> list[dict]:
  """The records of a JSON-lines file ([] while it does not exist yet)."""
  if not os.path.exists(path):
    return []
  with open(path) as f:
    return [json.loads(line) for line in f if line.strip()]


def wait_for(pred, timeout_s: float, what: str, poll_s: float = 0.05) -> None:
  """Polls `pred` until it holds; TimeoutError(what) after `timeout_s`."""
  deadline = time.monotonic() + timeout_s
  while not pred():
    if time.monotonic() > deadline:
      raise TimeoutError(what)
    time.sleep(poll_s)


REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def train_command(workdir, *flags: str, variants: str = "runlocal") -> list[str]:
  """`python -m experiments.train` on configs/shakespeare.py:`variants` in `workdir`."""
  return [
      sys.executable,
      "-m",
      "experiments.train",
      f"--config=configs/shakespeare.py:{variants}",
      f"--workdir={workdir}",
      *flags,
  ]


def train(workdir, *flags: str, env=None, timeout: float = 300) -> subprocess.CompletedProcess:
  """Runs `train_command` from the repository's root to its end (a fork of the preloaded
  server where it can be, diloco/rpc/forked.py); its output captured."""
  return forked.run(train_command(workdir, *flags)[1:], env or dict(os.environ), REPO, timeout)


def only_at_sync_points(summary: dict) -> None:
  """Every cross-process call a learner process made outside its train step (its summary's
  `collectives`: broadcasts, gathers, checkpoint saves, by step) was at a sync point."""
  k, steps = summary["sync_interval"], summary["steps"]
  made = {int(step) for step in summary["collectives"]}
  assert made and all(step % k == 0 or step == steps for step in made), (k, made)
