"""The restart window (outer.restart_window_s) of asynchronous Local-SGD as its authors' toy runs
it: a merge's contributors wait, then restart together from the newest model. At equal learner
speeds, Delayed Nesterov with period N = M learners then takes the steps of synchronous DiLoCo."""

import numpy as np
import pytest

from configs import shakespeare
from diloco.config import checks
from diloco.outer import optimizers, policies, protocol
from test_decoupled import _run


def _config(**overrides):
  c = shakespeare.get_config("runlocal,mode=diloco,model=tiny")
  flat = {"steps": 12, "outer.inner_steps": 4, "outer.fragments": 1, "outer.codec": "fp32"}
  flat |= {"outer.lr": 0.7, "outer.momentum": 0.9, "sim.step_jitter": 0.0, "data.iid": True}
  c.update_from_flattened_dict(flat | overrides)
  return c


def test_delayed_nesterov_over_a_restart_window_is_synchronous_diloco_at_equal_speeds(tmp_path):
  sync, sync_params, sync_merges = _run(_config(), str(tmp_path / "sync"))
  dn = _config(**{
      "outer.quorum": 1, "outer.broadcast": "contributors", "outer.restart_window_s": 0.5,
      "outer.optimizer": "delayed_nesterov", "outer.delayed_period": 2, "outer.delayed_c": 0.0,
  })  # fmt: skip
  got, params, merges = _run(dn, str(tmp_path / "dn"))
  # 3 rounds of H = 4: synchronous DiLoCo merges both learners at once, 3 times; Delayed
  # Nesterov each learner's outer gradient alone (2 x 3), its parameter step at every second.
  assert (len(sync_merges), len(merges)) == (3, 6)
  assert [len(m["learners"]) for m in merges] == [1] * 6
  # After each pair, the same parameters: m <- 0.9 m + (g1 + g2) / 2 and
  # θ <- θ - ε (0.9 m + (g1 + g2) / 2), in two subtractions instead of one (float rounding).
  for k in sync_params:
    np.testing.assert_allclose(params[k], sync_params[k], rtol=1e-5, atol=1e-6)
  assert got["eval_loss"] == pytest.approx(sync["eval_loss"], abs=1e-5)
  # Without the window each learner restarts from the model its own merge made: not the same.
  no_window = _config(**{
      "outer.quorum": 1, "outer.broadcast": "contributors",
      "outer.optimizer": "delayed_nesterov", "outer.delayed_period": 2, "outer.delayed_c": 0.0,
  })  # fmt: skip
  _, apart, _ = _run(no_window, str(tmp_path / "apart"))
  assert max(float(np.abs(apart[k] - sync_params[k]).max()) for k in sync_params) > 1e-3


def test_a_restart_window_needs_contributors_and_blocking_learners():
  c = _config(**{"outer.restart_window_s": 0.5})
  with pytest.raises(ValueError, match="needs outer.broadcast='contributors' and blocking"):
    checks.outer_rules(c.outer)


def test_the_window_holds_contributors_until_it_ends_then_sends_the_newest_version():
  from test_synchronizer import E, EQUAL_MEAN, W0, _f, _merges, _of, _sync, _up

  policy = policies.Policy(
      policies.MinQuorum(1), policies.NoGrace(), **EQUAL_MEAN, broadcast="contributors",
      restart_window_s=0.5,
  )  # fmt: skip
  sync = _sync(policy, optimizers.sgd(1.0), learners=3)
  delta = {E: _f([1.0, 1.0], [1.0, 1.0]), W0: _f([0.0, 0.5], [0.0, 0.0])}
  # Learner 0's upload merges at t = 1.0: nothing is sent, the window closes at 1.5.
  first = sync.handle(_up(0, 0, delta, base=0, time=1.0))
  assert len(_merges(first)) == 1 and not _of(first, protocol.Send)
  assert _of(first, protocol.SetTimer) == [protocol.SetTimer(1.5)]
  # Learner 1's, at 1.25, merges too (version 2), and waits with learner 0; 2 trains on.
  second = sync.handle(_up(1, 0, delta, base=0, time=1.25))
  assert len(_merges(second)) == 1 and not _of(second, protocol.Send)
  assert not _of(sync.handle(protocol.Tick(1.4)), protocol.Send)
  sends = _of(sync.handle(protocol.Tick(1.5)), protocol.Send)
  # Both restart from version 2, both merges in it, each told its own upload is in it.
  assert [(s.learner, s.version, s.own) for s in sends] == [(0, 2, (0, 0, 1)), (1, 2, (0, 0, 1))]
  np.testing.assert_array_equal(sends[0].values[E], sync.globals[0][E])
  # A window in which every live learner ends up waiting closes at once.
  third = sync.handle(_up(2, 0, delta, base=0, time=2.0))
  assert not _of(third, protocol.Send)
  fourth = sync.handle(_up(0, 0, delta, base=2, time=2.1))
  assert not _of(fourth, protocol.Send)
  fifth = sync.handle(_up(1, 0, delta, base=2, time=2.2))
  assert [s.learner for s in _of(fifth, protocol.Send)] == [0, 1, 2]


def test_a_restarted_inner_optimizer_is_fresh_and_its_schedule_where_it_is_told():
  from diloco.inner import step as step_lib
  import jax.numpy as jnp
  import optax

  tx = step_lib.make_optimizer(step_lib.OptimizerConfig(lr=0.1, warmup_steps=2, decay_steps=8))
  params = {"w": jnp.ones((2, 2)), "b": jnp.ones(2)}
  state = tx.init(params)
  for _ in range(3):
    _, state = tx.update({"w": jnp.ones((2, 2)), "b": jnp.ones(2)}, state, params)
  adam, sched = state[1][0], state[1][2]
  assert int(adam.count) == 3 and int(sched.count) == 3 and float(adam.mu["w"][0, 0]) > 0
  fresh = step_lib.restarted(state, 7, fresh=True)
  assert int(fresh[1][0].count) == 0 and float(jnp.abs(fresh[1][0].nu["w"]).max()) == 0.0
  assert int(fresh[1][2].count) == 7 and isinstance(fresh[1][2], optax.ScaleByScheduleState)
  kept = step_lib.restarted(state, 5, fresh=False)  # the moments stay, the schedule moves
  assert int(kept[1][0].count) == 3 and float(kept[1][0].mu["w"][0, 0]) == float(adam.mu["w"][0, 0])
  assert int(kept[1][2].count) == 5
  assert int(step_lib.schedule_count(kept, jnp.int32(3))) == 5  # what the logged lr reads


def test_sends_carry_the_steps_merged_so_far_for_a_global_schedule():
  from test_synchronizer import E, EQUAL_MEAN, W0, _f, _of, _sync, _up

  policy = policies.Policy(
      policies.MinQuorum(1), policies.NoGrace(), **EQUAL_MEAN, broadcast="contributors",
      send_progress=True,
  )  # fmt: skip
  sync = _sync(policy, optimizers.sgd(1.0), learners=2)
  delta = {E: _f([1.0, 1.0], [1.0, 1.0]), W0: _f([0.0, 0.5], [0.0, 0.0])}
  (a,) = _of(sync.handle(_up(0, 0, delta, base=0, time=1.0, steps=5)), protocol.Send)
  (b,) = _of(sync.handle(_up(1, 0, delta, base=0, time=1.5, steps=3)), protocol.Send)
  assert (a.progress, b.progress) == (5, 8) and a.checksum_ok() and b.checksum_ok()
  assert protocol.send_checksum(0, 2, 0, 0, 1, 0, None, 8) != protocol.send_checksum(0, 2, 0, 0, 1)


def test_fresh_inner_optimizers_keep_the_reduction_and_change_the_run(tmp_path):
  fresh = {"outer.fresh_inner_optimizer": True, "outer.schedule_by": "global"}
  _, sync_params, _ = _run(_config(**fresh), str(tmp_path / "sync"))
  dn = _config(**fresh, **{
      "outer.quorum": 1, "outer.broadcast": "contributors", "outer.restart_window_s": 0.5,
      "outer.optimizer": "delayed_nesterov", "outer.delayed_period": 2, "outer.delayed_c": 0.0,
  })  # fmt: skip
  _, params, _ = _run(dn, str(tmp_path / "dn"))
  # A fresh Adam's first step is about lr x sign(g): a gradient component near 0 turns the two
  # paths' float rounding into larger differences (up to 3e-5 of a tensor's norm over two runs
  # measured), so the tensors are compared by the norm of their difference, against the 0.3
  # that keeping the moments makes.
  rel = lambda a, b: max(float(np.linalg.norm(a[k] - b[k]) / np.linalg.norm(b[k])) for k in b)
  assert rel(params, sync_params) < 1e-3
  _, kept, _ = _run(_config(), str(tmp_path / "kept"))  # moments kept across rounds: not the same
  assert rel(kept, sync_params) > 0.1
  c = _config(**fresh, **{"outer.fragments": 2})
  with pytest.raises(ValueError, match="need outer.fragments=1, got 2"):
    checks.outer_rules(c.outer)


def test_the_async_tables_toy_variant_runs_every_baseline_the_authors_way():
  from configs.sweeps import async_regime as ar

  for method in ("sync", "async", "dn", "dn_dylu"):
    o = ar.get_config(f"toy=1,method={method},hetero=very").outer
    assert (o.fresh_inner_optimizer, o.schedule_by, o.fragments) == (True, "global", 1)
    # the toy's 0.5 s window against its fastest step of 0.58 s, in our 1 s steps
    assert o.restart_window_s == (0.0 if method == "sync" else 0.862)
    checks.outer_rules(o)
  preset = ar.get_config("toy=1,method=decoupled").outer  # the project's own: as it is
  assert (preset.fresh_inner_optimizer, preset.restart_window_s) == (False, 0.0)
