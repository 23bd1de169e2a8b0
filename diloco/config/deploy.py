"""The `deploy` config section: how the threads and gRPC runtimes are run and secured.

Call `add_deploy_section(c)` in a config's get_config before `c.lock()`.
"""

import ml_collections

from diloco.config import keys

PLATFORMS = ("", "cpu", "gpu", "tpu")


def add_deploy_section(c: ml_collections.ConfigDict) -> ml_collections.ConfigDict:
  """Adds c.deploy with the defaults below (loopback, no TLS, token from $DILOCO_TOKEN)."""
  c.deploy = keys.section(
      "deploy",
      bind=("127.0.0.1", "the synchronizer binds loopback unless told otherwise"),
      port=(0, "the synchronizer's gRPC port (0: a free port, written to WORKDIR/port)"),
      status_port=(
          -1,
          "the status page, /status, /metrics (0: a free port, in "
          "WORKDIR/status_port; -1: off); bound like the gRPC port, the same token",
      ),
      cert=("", "TLS certificate (PEM) of the synchronizer; TLS when set"),
      key=("", "TLS private key (PEM), with cert"),
      ca_cert=(
          "",
          "CA certificate the learners verify the synchronizer with "
          "(scripts/make_certs.py makes a local pair)",
      ),
      absent_after_s=(
          5.0,
          "a learner silent this long (no heartbeat, poll or upload; heartbeats every quarter of "
          "it) is left out of quorums until it rejoins",
      ),
      call_timeout_s=(
          10.0,
          "gRPC: a Join's or heartbeat's deadline, and the floor of an upload's or poll's; a call "
          "unanswered this long is given up and the learner rejoins (trains on meanwhile)",
      ),
      link_floor_mbit_s=(
          8.0,
          "gRPC: an upload's (a poll's) deadline adds its bytes at this rate, so a link slower "
          "than planned makes it late instead of cutting it off; set it below your slowest link",
      ),
      keepalive_s=(
          10.0,
          "gRPC: both sides ping a connection silent this long and drop it when a ping goes "
          "unanswered as long again (a half-open connection is found within twice this)",
      ),
      poll_wait_s=(1.0, "gRPC: the synchronizer holds a learner's long poll at most this long"),
      deliver_timeout_s=(
          300.0,
          "gRPC learners done training wait this long for the run to settle; progress whose "
          "upload is still unanswered then (the synchronizer away) is saved, named, exit 75",
      ),
      chaos_time_scale=(1.0, "threads and gRPC: wall seconds per second of the chaos schedule"),
      straggle_busy=(False, "gRPC learners: a straggling step spins on a core instead of sleeping"),
      devices_per_learner=(0, "threads runtime: local devices per learner; 0 = split evenly"),
      expect_platform=(
          "",
          "learners refuse to train unless JAX's backend is this (tpu, gpu, "
          "cpu; empty: any); the TPU launchers set tpu",
      ),
      max_restarts=(20, "launchers' supervisors: restarts of a process before giving up"),
      restart_backoff_s=(5.0, "first delay before a restart; doubles, at most 300 s"),
      max_learners=(64, "the synchronizer refuses learner ids at or above this"),
      chunk_bytes=(1 << 20, "gRPC: bytes per chunk of a streamed message"),
      max_message_bytes=(4 << 20, "gRPC: the largest message either side accepts"),
  )
  # scripts/tpu/commands.py, experiments.launch_ray --tpu, scripts/tpu/xpk.py
  c.deploy.tpu = keys.section(
      "deploy.tpu",
      project=("", "Google Cloud project"),
      zone=("us-central2-b", "zone of the TPU slices"),
      accelerator_type=("v4-8", "one learner per slice of this type"),
      topology=("", "e.g. 2x2x1 (Ray's slice placement needs it; chips must agree)"),
      slices=("", "comma-separated slice names, one per learner (empty: PREFIX-learnerM)"),
      runtime_version=("tpu-ubuntu2204-base", "TPU VM software version"),
      name_prefix=("diloco", "prefix of the names of created slices and VMs"),
      sync_host=("", "the synchronizer's internal address"),
      sync_vm=(
          "",
          "a CPU VM for the synchronizer (created with sync_host as its address); "
          "empty: the machine that runs the launcher",
      ),
      sync_machine_type=("n2-standard-8", "machine type of sync_vm"),
      repo_dir=("~/diloco", "where the code is staged on every host"),
  )
  # scripts/tpu/xpk.py: one workload per learner slice, one for the synchronizer
  c.deploy.xpk = keys.section(
      "deploy.xpk",
      cluster=("", "the GKE cluster xpk creates workloads on"),
      base_image=("python:3.11", "xpk builds the image from it and the staged code"),
      namespace=("default", "Kubernetes namespace"),
      token_secret=("diloco-token", "a Kubernetes secret holding the token as `token`"),
      sync_device_type=("n2-standard-32-1", "the synchronizer's CPU node type"),
      sync_address=("", "the synchronizer's address; default: its pod's JobSet DNS name"),
      priority=("medium", "workload priority"),
  )
  return c


def check(deploy: ml_collections.ConfigDict) -> None:
  """ValueError naming the first bad setting."""
  if bool(deploy.cert) != bool(deploy.key):
    raise ValueError("deploy.cert and deploy.key go together")
  if not 0 <= deploy.port < 65536:
    raise ValueError(f"deploy.port out of range: {deploy.port}")
  if not -1 <= deploy.status_port < 65536:
    raise ValueError(
        f"deploy.status_port must be -1 (off), 0 (a free port) or a port, got "
        f"{deploy.status_port}"
    )
  if deploy.status_port > 0 and deploy.status_port == deploy.port:
    raise ValueError(f"deploy.status_port and deploy.port are both {deploy.port}")
  if not deploy.bind:
    raise ValueError("deploy.bind is empty (127.0.0.1 for loopback, or an address to listen on)")
  if deploy.absent_after_s <= 0:
    raise ValueError(f"deploy.absent_after_s must be > 0, got {deploy.absent_after_s}")
  for key in ("deliver_timeout_s", "call_timeout_s", "link_floor_mbit_s", "keepalive_s"):
    if deploy[key] <= 0:
      raise ValueError(f"deploy.{key} must be > 0, got {deploy[key]}")
  if deploy.keepalive_s < 1:
    raise ValueError(f"deploy.keepalive_s must be >= 1 (the server's least ping interval), got "
                     f"{deploy.keepalive_s}")  # fmt: skip
  if deploy.poll_wait_s <= 0:
    raise ValueError(f"deploy.poll_wait_s must be > 0, got {deploy.poll_wait_s}")
  if deploy.devices_per_learner < 0:
    raise ValueError(f"deploy.devices_per_learner must be >= 0, got {deploy.devices_per_learner}")
  if deploy.chaos_time_scale <= 0:
    raise ValueError(f"deploy.chaos_time_scale must be > 0, got {deploy.chaos_time_scale}")
  if deploy.expect_platform not in PLATFORMS:
    raise ValueError(
        f"deploy.expect_platform must be one of {PLATFORMS}, got {deploy.expect_platform!r}"
    )
  if deploy.max_restarts < -1:
    raise ValueError(f"deploy.max_restarts must be >= -1 (-1: no limit), got {deploy.max_restarts}")
  if deploy.restart_backoff_s < 0:
    raise ValueError(f"deploy.restart_backoff_s must be >= 0, got {deploy.restart_backoff_s}")
  for name in ("max_learners", "chunk_bytes", "max_message_bytes"):
    if deploy[name] < 1:
      raise ValueError(f"deploy.{name} must be >= 1, got {deploy[name]}")
  if deploy.chunk_bytes + 1024 > deploy.max_message_bytes:
    raise ValueError(
        f"deploy.chunk_bytes={deploy.chunk_bytes} leaves no room for the chunk header "
        f"under deploy.max_message_bytes={deploy.max_message_bytes}"
    )


def check_platform(deploy: ml_collections.ConfigDict, backend: str) -> None:
  """RuntimeError when deploy.expect_platform is set and JAX's backend is another one."""
  want = deploy.expect_platform
  if want and backend != want:
    hint = " (install the tpu extra: pip install -e '.[tpu]')" if want == "tpu" else ""
    raise RuntimeError(f"deploy.expect_platform={want} but JAX runs on {backend}{hint}")
