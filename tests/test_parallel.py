"""The merge round on several threads: the same bits as on one, and the pool's own contract."""

import threading
import zlib

import jax
import numpy as np
import pytest

from diloco.outer import integrity, merging, optimizers, parallel
from diloco.outer.codecs import blockwise, compression
from diloco.outer.sync import commit


@pytest.fixture
def threads():
  """Sets the thread count for one test and restores it (and SPAN) afterwards."""
  before, span = parallel.THREADS, parallel.SPAN
  yield parallel.set_threads
  parallel.set_threads(before)
  parallel.SPAN = span


def test_run_keeps_order_and_uses_threads(threads):
  threads(3)
  seen = set()

  def work(i):
    seen.add(threading.current_thread().name)
    return i * i

  assert parallel.run(work, range(40)) == [i * i for i in range(40)]
  assert all(name.startswith("merge") for name in seen)
  threads(1)
  seen.clear()
  assert parallel.run(work, range(5)) == [0, 1, 4, 9, 16]
  assert seen == {threading.current_thread().name}  # one thread: the caller's


def test_run_raises_the_first_error_in_item_order_after_all_ran(threads):
  threads(2)
  done = []

  def work(i):
    done.append(i)
    if i in (3, 1):
      raise ValueError(f"item {i}")
    return i

  with pytest.raises(ValueError, match="item 1"):
    parallel.run(work, range(6))
  assert sorted(done) == [0, 1, 2, 3, 4, 5]


def test_run_carries_errstate_into_the_workers(threads):
  threads(2)
  big = np.full(4, 3e38, np.float32)
  with np.errstate(over="raise"):
    with pytest.raises(FloatingPointError):
      parallel.run(lambda x: x * np.float32(2), [big, big])
  with np.errstate(over="ignore"):
    out = parallel.run(lambda x: x * np.float32(2), [big, big])
  assert np.isinf(out[1]).all()


def test_spans_are_whole_steps_from_zero(threads):
  parallel.SPAN = 10
  assert parallel.spans(25, 4) == [(0, 8), (8, 16), (16, 24), (24, 25)]
  assert parallel.spans(3, 4) == [(0, 3)]
  assert parallel.spans(0, 4) == [(0, 0)]
  with pytest.raises(ValueError):
    threads(0)


def _deltas(rng, shapes, m=3):
  return [
      {k: (rng.standard_normal(s) * 1e-3).astype(np.float32) for k, s in shapes.items()}
      for _ in range(m)
  ]


@pytest.mark.parametrize("rule", ["mean", "rda"])
def test_merge_is_the_same_bits_on_three_threads(threads, rule):
  rng = np.random.default_rng(0)
  n = 2 * merging.CHUNK + 77  # three chunks, the last short
  shapes = {"a": (n,), "b": (5, 3), "embed": (n,)}
  deltas = _deltas(rng, shapes)
  # One huge value whose chunk overflows w·Σx and is redone as Σ w·x: results depend on where
  # the chunks start, so spans must start where the whole leaf's chunks do.
  deltas[0]["a"][merging.CHUNK + 5] = 3e38
  deltas[1]["a"][merging.CHUNK + 5] = 3e38
  weights = [1.0, 1.0, 1.0]
  threads(1)
  one, bad_one = merging.merge_checked(deltas, weights, rule, is_embedding=lambda p: p == "embed")
  threads(3)
  parallel.SPAN = merging.CHUNK  # a span per chunk
  many, bad_many = merging.merge_checked(deltas, weights, rule, lambda p: p == "embed")
  assert bad_one == bad_many == []
  assert list(one) == list(many) == ["a", "b", "embed"]
  for k in one:
    assert one[k].tobytes() == many[k].tobytes(), k
  if rule == "mean":  # (3e38 + 3e38 + small)/3: Σx overflows, so the chunk is Σ x/3
    assert one["a"][merging.CHUNK + 5] == pytest.approx(2e38, rel=1e-6)


def _passes(tx, merged, state, old, residual, codec):
  """commit.outer_step's three passes, one after the other."""
  raw, state = optimizers.host_step(tx, merged, state, old, residual, in_place=False)
  encoded = compression.encode_tree(raw, codec)
  new = {k: compression.add_decoded(old[k], encoded[k], raw[k]) for k in old}
  return new, state, raw, encoded


@pytest.mark.parametrize("codec", ["fp4", "int8"])
@pytest.mark.parametrize("momentum", [0.9, 0.0])
@pytest.mark.parametrize("count", [1, 3])
def test_fused_commit_is_the_same_bits_as_the_passes(threads, codec, momentum, count):
  rng = np.random.default_rng(1)
  n = 2 * blockwise.CHUNK + 301  # odd: fp4's pad nibble; a short last block and chunk
  shapes = {"w": (n,), "b": (7,), "m": (3, 129)}
  old = {k: rng.standard_normal(s).astype(np.float32) for k, s in shapes.items()}
  merged = _deltas(rng, shapes, 1)[0]
  residual = {k: (rng.standard_normal(s) * 1e-5).astype(np.float32) for k, s in shapes.items()}
  tx = optimizers.nesterov(0.7, momentum)
  state = tx.init(old)
  if momentum:
    state = optimizers.host_step(tx, merged, state, old, residual, in_place=False)[1]
  threads(count)
  parallel.SPAN = blockwise.CHUNK
  inputs = {k: v.copy() for k, v in old.items()}
  assert commit._fused(tx, merged, state, old, residual, codec) is not None  # not the passes
  fused = commit.outer_step(tx, merged, state, old, residual, codec)
  threads(1)
  expected = _passes(tx, merged, state, old, residual, codec)
  assert all(inputs[k].tobytes() == old[k].tobytes() for k in old)  # nothing passed in changed
  new, state_f, raw, encoded = fused
  new_p, state_p, raw_p, encoded_p = expected
  assert list(new) == list(old) and list(raw) == list(encoded) == sorted(shapes)
  assert encoded == encoded_p  # the same wire bytes
  for k in old:
    assert new[k].tobytes() == new_p[k].tobytes(), k
    assert raw[k].tobytes() == raw_p[k].tobytes(), k  # the residual
  leaves_f, leaves_p = jax.tree.leaves(state_f), jax.tree.leaves(state_p)
  assert len(leaves_f) == len(leaves_p) == (3 if momentum else 0)
  for a, b in zip(leaves_f, leaves_p):
    assert np.asarray(a).tobytes() == np.asarray(b).tobytes()


def test_fused_commit_refuses_what_the_passes_refuse(threads):
  threads(2)
  old = {"w": np.ones(600, np.float32)}
  merged = {"w": np.full(600, 1e-3, np.float32)}
  merged["w"][300] = np.inf
  tx = optimizers.nesterov(0.7, 0.9)
  why = commit.outer_step(tx, merged, tx.init(old), old, {"w": np.zeros(600, np.float32)}, "fp4")
  assert why == "the merge failed: cannot encode non-finite values: 1 of 600 are NaN or Inf " + (
      "(after the cast to float32)"
  )


def test_tree_crc_in_pieces_is_crc32_of_the_whole(threads):
  threads(3)
  integrity_piece = integrity.PIECE
  integrity.PIECE = 1000  # pieces of 1000 bytes: a payload splits in many
  try:
    a = np.arange(2501, dtype=np.float32)
    e = compression.encode(np.linspace(-1, 1, 999, dtype=np.float32), "fp4")
    whole = (
        b"a"
        + f"{a.dtype.str}{a.shape}".encode()
        + a.tobytes()
        + b"e"
        + f"fp4{e.shape}{e.block}".encode()
        + e.payload
    )
    assert integrity.tree_crc({"e": e, "a": a}) == zlib.crc32(whole)
    threads(1)
    assert integrity.tree_crc({"e": e, "a": a}) == zlib.crc32(whole)
  finally:
    integrity.PIECE = integrity_piece
