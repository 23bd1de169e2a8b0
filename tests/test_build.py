"""The one builder: every runtime's synchronizer and learners come from config/build.py alike."""

import jax
import numpy as np
import pytest

from configs import shakespeare
from diloco.config import build
from diloco.outer import optimizers, policies
from diloco.rpc import multihost


def _config(arg: str, **outer):
  c = shakespeare.get_config(arg)
  with c.unlocked():
    c.outer.update(outer)
  return c


@pytest.mark.parametrize(
    "arg,outer,kind",
    [
        ("mode=diloco", {}, policies.AllMembers()),  # quorum 0, not elastic: merges wait
        ("mode=diloco", {"elastic": True}, policies.AllLive()),
        ("mode=decoupled", {}, policies.MinQuorum(1)),
        ("mode=decoupled", {"quorum": 3}, policies.MinQuorum(3)),
    ],
)
def test_the_quorum_kind_comes_from_the_config(arg, outer, kind):
  policy = policies.from_config(_config(arg, **outer))
  assert policy.quorum == kind
  assert policy.quorum.of_members == (kind == policies.AllMembers())


def test_decoupled_policy_objects_and_synchronous_ones():
  dec = policies.from_config(_config("mode=decoupled"))
  assert (dec.weights, dec.merge, dec.grace) == (
      policies.TokenWeights(),
      policies.RDA(),
      policies.AdaptiveGrace(0.8, 2),
  )
  syn = policies.from_config(_config("mode=diloco"))
  assert (syn.weights, syn.merge, syn.grace) == (
      policies.EqualWeights(),
      policies.Mean(),
      policies.NoGrace(),
  )
  # Two learners, 10 tokens in 1 step and 10 tokens in 2: tokens²/steps = 100 and 50.
  np.testing.assert_allclose(dec.weights([10, 10], [1, 2]), [100, 50])
  np.testing.assert_allclose(syn.weights([10, 10], [1, 2]), [0.5, 0.5])  # equal, summing to 1


@pytest.mark.parametrize(
    "key,value,named",
    [
        ("optimizer", "adam", "unknown outer optimizer 'adam'"),
        ("weighting", "size", "unknown outer.weighting 'size'"),
        ("merge", "median", "unknown outer.merge 'median'"),
        ("quorum", -1, "outer.quorum must be >= 0"),
    ],
)
def test_a_bad_outer_setting_is_named(key, value, named):
  config = _config("mode=decoupled,runlocal", **{key: value})
  parts = build.synchronizer_only(config)
  with pytest.raises(ValueError, match=named):
    parts.make_sync()


def test_outer_optimizers_come_from_the_registry():
  o = _config("mode=diloco").outer
  tx = build.outer_optimizer(o)
  assert isinstance(tx, optimizers.SGD) and (tx.lr, tx.momentum) == (o.lr, o.momentum)
  with o.unlocked():
    o.optimizer = "sgd"
  assert build.outer_optimizer(o).momentum == 0


def test_every_runtime_builds_the_same_synchronizer():
  """The virtual/threads parts and the gRPC synchronizer process: same start, policy, cut."""
  config = _config("mode=diloco,runlocal")
  local = build.local_learners(config)
  remote = build.synchronizer_only(config)
  a, b = local.make_sync(), remote.make_sync(min_checkpoint_every=1)
  assert sorted(a.global_params()) == sorted(b.global_params())
  for k, v in a.global_params().items():
    np.testing.assert_array_equal(v, b.global_params()[k])
  assert a.policy == b.policy and a.frag.paths == b.frag.paths
  assert (a.checkpoint_every, b.checkpoint_every) == (0, 1)
  assert local.syncs == [a] and remote.syncs == [b]


def test_a_learner_process_builds_its_own_learner_holding_nothing():
  config = _config("mode=decoupled,runlocal")
  parts = build.one_learner(
      config, 1, jax.devices()[:2], multihost.SpmdLearner, multihost.host_value
  )
  learner = parts.make_learner(1)
  assert isinstance(learner, multihost.SpmdLearner) and learner.index == 1
  assert learner.versions == [-1] * config.outer.fragments
  assert learner.tokens_per_step == config.batch_size * config.seq_len
  with pytest.raises(ValueError, match="learner_id=2 is outside 0..1"):
    build.one_learner(config, 2, jax.devices()[:2], multihost.SpmdLearner, multihost.host_value)


def test_batch_sizes_per_learner():
  config = _config("mode=decoupled,runlocal")
  assert build.batch_sizes(config) == [8, 8]
  with config.unlocked():
    config.sim.batch_sizes = "8,4"
  assert build.batch_sizes(config) == [8, 4]
  for bad, named in [("8", "has 1 entries for 2 learners"), ("8,0", "must be positive")]:
    with config.unlocked():
      config.sim.batch_sizes = bad
    with pytest.raises(ValueError, match=named):
      build.batch_sizes(config)


def test_a_virtual_runs_learner_is_built_holding_the_start_at_version_0():
  config = _config("mode=decoupled,runlocal")
  parts = build.local_learners(config)
  learner = parts.make_learner(1, holds_start=True)
  assert learner.versions == [0] * config.outer.fragments
  held = {k: v for g in learner.global_copy for k, v in g.items()}
  assert sorted(held) == sorted(parts.params0)
  for k, v in learner.host_params().items():  # it trains from the start it holds
    np.testing.assert_array_equal(v, parts.params0[k])
    np.testing.assert_array_equal(held[k], parts.params0[k])
  assert parts.make_learner(1).versions == [-1] * config.outer.fragments
