"""One learner as a 2-process JAX job (CPU, gloo collectives) against a synchronizer process: only
process 0 talks to the synchronizer, process 1 follows it, and both end with identical parameters,
equal to the synchronizer's global parameters after the last merge."""

import json
import os

import numpy as np
import pytest

from configs import shakespeare
from diloco import sync_checkpoint
from diloco.rpc import local, multihost, sync_main

# Synchronous DiLoCo, H=10, alpha=0: after the last merge arrives every parameter is the global one.
SPEC = "configs/shakespeare.py:mode=diloco,runlocal,learners=1,steps=20"


@pytest.fixture
def cluster(tmp_path):
    c = local.LocalCluster(SPEC, 1, str(tmp_path / "run"), devices_per_learner=2,
                           processes_per_learner=2)
    yield c
    c.stop(grace_s=2.0)


def _json(path):
    with open(path) as f:
        return json.load(f)


def test_two_process_learner_follows_process_zero(cluster):
    c = cluster
    c.start()
    codes = c.wait(240)
    logs = {n: open(os.path.join(c.workdir, "logs", f"{n}.log")).read()[-2000:] for n in c.procs}
    assert codes == {"sync": 0, "learner0": 0, "learner0.p1": 0}, (codes, logs)
    lead = _json(os.path.join(c.workdir, "learner0", "summary.json"))
    follower = _json(os.path.join(c.workdir, "learner0", "summary.process1.json"))
    # One island over both processes' devices; process 1 never connected anywhere.
    assert (lead["processes"], lead["devices"], lead["process"]) == (2, 4, 0)
    assert (follower["role"], follower["process"], follower["steps"]) == ("follower", 1, 20)
    assert lead["steps"] == 20 and lead["settled"]
    # It followed every operation of process 0: 20 steps, the initial fragment and two merged
    # updates, the two uploads (one per H=10 steps), and the end.
    assert follower["ops"] == {"noop": 0, "step": 20, "receive": 3, "upload": 2, "end": 1}
    assert lead["applied"] == 3
    sync = _json(os.path.join(c.workdir, "sync", "summary.json"))
    assert sync["merges"] == 2 and lead["versions"] == sync["versions"] == [2]

    p0 = np.load(os.path.join(c.workdir, "learner0", "params.process0.npz"))
    p1 = np.load(os.path.join(c.workdir, "learner0", "params.process1.npz"))
    assert sorted(p0.files) == sorted(p1.files) and lead["params_crc"] == follower["params_crc"]
    config = shakespeare.get_config(SPEC.split(":", 1)[1])
    made = sync_main.make_synchronizer(config)
    ckpt = sync_checkpoint.SyncCheckpointer(os.path.join(c.workdir, "sync", "checkpoints",
                                                         "synchronizer"))
    made.load_state_dict(ckpt.restore(made.state_dict()))
    ckpt.close()
    final = made.global_params()
    assert made.merges == 2 and sorted(final) == sorted(p0.files)
    start = sync_main.make_synchronizer(config).global_params()
    for k, v in final.items():
        np.testing.assert_array_equal(p0[k], p1[k])  # identical on both processes
        np.testing.assert_array_equal(p0[k], v)  # and equal to the synchronizer's broadcast
    assert any(not np.array_equal(final[k], start[k]) for k in final)  # training moved them


def test_cluster_flags_are_checked():
    with pytest.raises(ValueError, match="--num_processes >= 1 and --process_id"):
        multihost.initialize(False, "127.0.0.1:1", 2, 2)
    multihost.initialize(False)  # nothing to do for a single-process learner
