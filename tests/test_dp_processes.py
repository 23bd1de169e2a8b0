"""Data-parallel training with FSDP across two processes (`jax.distributed` on the loopback, 2 CPU
devices each): the run finishes with a summary whose parameter hash is the saved model's."""

import json
import os
import socket
import subprocess

import jax
import numpy as np

from configs import shakespeare
from diloco import metrics
from diloco.inner import checkpoint, island as island_lib
from diloco.outer import fragments
from proc_helpers import REPO, train_command


def _free_port() -> int:
  with socket.socket() as s:
    s.bind(("127.0.0.1", 0))
    return s.getsockname()[1]


def test_fsdp_over_two_processes_finishes_with_the_saved_models_hash(tmp_path):
  workdir, port = str(tmp_path / "run"), _free_port()
  env = {**os.environ, "XLA_FLAGS": "--xla_force_host_platform_device_count=2"}
  env["JAX_PLATFORMS"] = "cpu"
  flags = ("--config.distributed=True", "--config.mesh.fsdp=4", "--config.mesh.data=1")
  procs = [
      subprocess.Popen(
          train_command(
              workdir,
              *flags,
              f"--coordinator=127.0.0.1:{port}",
              "--num_processes=2",
              f"--process_id={i}",
              variants="runlocal,mode=dp",
          ),
          cwd=REPO,
          env=env,
          stdout=subprocess.PIPE,
          stderr=subprocess.STDOUT,
          text=True,
      )
      for i in (0, 1)
  ]
  outs = [p.communicate(timeout=300)[0] for p in procs]
  assert [p.returncode for p in procs] == [0, 0], [o[-3000:] for o in outs]
  with open(os.path.join(workdir, "summary.json")) as f:
    summary = json.load(f)
  config = shakespeare.get_config("runlocal,mode=dp")
  assert summary["finished"] and summary["steps"] == config.steps
  # the hash covers the whole model, gathered from both processes: it is the final checkpoint's
  isl = island_lib.build_island(config, jax.devices()[:1])
  ckpt = checkpoint.Checkpointer(os.path.join(workdir, "checkpoints"), every=1, set_aside=False)
  step, state = ckpt.restore(isl.abstract_state())
  ckpt.close()
  saved = {k: np.asarray(v) for k, v in fragments.flatten(jax.device_get(state.params)).items()}
  assert step == config.steps
  assert summary["params_sha256"] == metrics.params_sha256(saved)
