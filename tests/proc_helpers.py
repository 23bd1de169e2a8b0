"""Helpers for the tests that watch learner and synchronizer processes through their files."""

import json
import os
import time


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
