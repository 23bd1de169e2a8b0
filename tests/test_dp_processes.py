"""Data-parallel training with FSDP across two processes (`jax.distributed` on the loopback, 2 CPU
devices each): a save that fails in one process ends both. (That such a run finishes with a
summary whose parameter hash is the saved model's: tests/test_corpus_processes.py, whose island
is the same two processes.)"""

import os
import socket
import subprocess

from diloco.rpc import local
from proc_helpers import REPO, train_command


def _free_port() -> int:
  with socket.socket() as s:
    s.bind(("127.0.0.1", 0))
    return s.getsockname()[1]


FAILING_SAVE = """
import runpy, sys
from diloco.inner import checkpoint
real = checkpoint.Checkpointer._save_once
def failing(self, step, items, force):
  if step >= 10:
    raise OSError("the disk went away (this test)")
  return real(self, step, items, force)
checkpoint.Checkpointer._save_once = failing
sys.argv[0] = "experiments.train"
runpy.run_module("experiments.train", run_name="__main__", alter_sys=True)
"""


def test_a_save_that_fails_in_one_process_ends_both(tmp_path):
  """Before: process 1's save failed and it trained on into a collective while process 0 waited
  in orbax's barrier; both hung with no CPU use until SIGKILL. Now process 1 stops at once with
  one line (exit 74) and process 0 stops when the coordination service misses process 1's
  heartbeat (--heartbeat_timeout_s=5): both end, the bound being the communicate timeout."""
  workdir, port = str(tmp_path / "run"), _free_port()
  env = {**os.environ, "XLA_FLAGS": local.xla_flags(2)}
  env["JAX_PLATFORMS"] = "cpu"
  flags = ("--config.mesh.fsdp=4", "--config.mesh.data=1", "--config.steps=30")
  flags += ("--config.checkpoint_every=10", f"--coordinator=127.0.0.1:{port}")
  flags += ("--num_processes=2", "--heartbeat_timeout_s=5")
  procs = []
  for i in (0, 1):
    command = train_command(workdir, *flags, f"--process_id={i}", variants="runlocal,mode=dp")
    if i == 1:
      command = [command[0], "-c", FAILING_SAVE, *command[3:]]
    procs.append(
        subprocess.Popen(command, cwd=REPO, env=env, stdout=subprocess.PIPE,
                         stderr=subprocess.PIPE, text=True)  # fmt: skip
    )
  outs = [p.communicate(timeout=180) for p in procs]
  assert procs[1].returncode == 74, outs[1][1][-3000:]
  errors = [l for l in outs[1][1].splitlines() if l.startswith("error: ")]
  assert errors == [
      f"error: checkpoint save of step 10 in {workdir}/checkpoints failed in process 1 of 2 "
      "(OSError: the disk went away (this test)); the job stops (its last saved checkpoint "
      "resumes it)"
  ]
  assert procs[0].returncode != 0  # it learnt of process 1's end and stopped too
