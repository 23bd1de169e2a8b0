"""Fragmentation of a params tree and the fragment sync schedule."""

import collections

import numpy as np
import pytest

from diloco.outer import fragments as F

D, V, NH, DH = 8, 32, 2, 4


def _block(d: int) -> dict:
  return {
      "attn_norm": {"scale": np.zeros([d], np.float32)},
      "attn": {
          "qkv": {"kernel": np.zeros([d, 3, NH, DH], np.float32)},
          "out": {"kernel": np.zeros([NH, DH, d], np.float32)},
      },
      "mlp_norm": {"scale": np.zeros([d], np.float32)},
      "mlp": {
          "up": {"kernel": np.zeros([d, 4 * d], np.float32)},
          "down": {"kernel": np.zeros([4 * d, d], np.float32)},
      },
  }


def _reversed(tree):
  if not isinstance(tree, dict):
    return tree
  return {k: _reversed(v) for k, v in reversed(list(tree.items()))}


def make_params(num_blocks=6, tied=False, str_keys=False, reverse=False) -> dict:
  params = {
      "embed": {"embedding": np.zeros([V, D], np.float32)},
      "blocks": {(str(i) if str_keys else i): _block(D) for i in range(num_blocks)},
      "final_norm": {"scale": np.zeros([D], np.float32)},
  }
  if not tied:
    params["unembed"] = {"kernel": np.zeros([D, V], np.float32)}
  return _reversed(params) if reverse else params


BLOCK_LEAVES = 6


def test_flatten_paths_sorted_and_key_types_kept():
  a, b, c = np.zeros(1), np.ones(2), np.full(3, 2.0)
  tree = {"embed": {"embedding": a}, "blocks": {1: {"w": c}, "0": {"w": b}}}
  flat = F.flatten(tree)
  assert list(flat) == ["blocks/0/w", "blocks/1/w", "embed/embedding"]
  assert flat["blocks/1/w"] is c
  assert F.leaf_paths(tree) == list(flat)
  back = F.unflatten(flat, like=tree)
  assert back["blocks"][1]["w"] is c and back["blocks"]["0"]["w"] is b
  assert set(back["blocks"]) == {1, "0"}
  plain = F.unflatten(flat)
  assert plain == {"blocks": {"0": {"w": b}, "1": {"w": c}}, "embed": {"embedding": a}}


def test_flatten_rejects_ambiguous_and_bad_keys():
  with pytest.raises(ValueError, match="two leaves"):
    F.flatten({"blocks": {0: {"w": np.zeros(1)}, "0": {"w": np.zeros(1)}}})
  with pytest.raises(ValueError, match="contains"):
    F.flatten({"a": {"b/c": np.zeros(1)}})
  with pytest.raises(ValueError, match="str or int"):
    F.flatten({"a": {(1, 2): np.zeros(1)}})
  with pytest.raises(ValueError, match="missing"):
    F.unflatten({"a/b": np.zeros(1)}, like={"a": {"b": np.zeros(1), "c": np.zeros(1)}})


def _covers_once(frag: F.Fragmentation, params) -> None:
  counts = collections.Counter(p for group in frag.paths for p in group)
  assert sorted(counts) == F.leaf_paths(params)
  assert set(counts.values()) == {1}


def test_strided_by_hand():
  params = make_params(num_blocks=6)
  frag = F.strided(params, 3)
  _covers_once(frag, params)
  assert frag.fragment_of("embed/embedding") == 0
  assert frag.fragment_of("blocks/0/mlp/up/kernel") == 0
  assert frag.fragment_of("blocks/3/attn/qkv/kernel") == 0
  assert frag.fragment_of("blocks/4/attn/qkv/kernel") == 1
  assert frag.fragment_of("blocks/5/attn_norm/scale") == 2
  assert frag.fragment_of("final_norm/scale") == 2
  assert frag.fragment_of("unembed/kernel") == 2
  two_blocks = 2 * BLOCK_LEAVES
  assert [len(g) for g in frag.paths] == [1 + two_blocks, two_blocks, two_blocks + 2]
  block_bytes = 4 * (D + 3 * NH * DH * D + NH * DH * D + D + 8 * D * D)
  assert frag.nbytes(1, params) == 2 * block_bytes
  assert frag.nbytes(0, params) == 2 * block_bytes + 4 * V * D


def test_strided_single_fragment_and_errors():
  params = make_params(num_blocks=4, tied=True)
  frag = F.strided(params, 1)
  assert frag.paths == (tuple(F.leaf_paths(params)),)
  with pytest.raises(ValueError, match="only 4 blocks"):
    F.strided(params, 5)
  with pytest.raises(ValueError, match="pos_embed"):
    F.strided({**params, "pos_embed": {"w": np.zeros(3)}}, 2)
  assert (
      F.strided(
          {**params, "pos_embed": {"w": np.zeros(3)}}, 2, first=("embed", "pos_embed")
      ).fragment_of("pos_embed/w")
      == 0
  )
  with pytest.raises(ValueError, match="positive"):
    F.strided(params, 0)


def test_balanced_by_hand():
  # bytes: a 40, b 28, c 20, d 16, e 12. a->0, b->1, c->1 (28<40), d->0 (40<48), e->1 (48<56).
  params = {k: np.zeros(n, np.float32) for k, n in zip("edcba", [3, 4, 5, 7, 10])}
  frag = F.balanced(params, 2)
  assert frag.paths == (("a", "d"), ("b", "c", "e"))
  assert (frag.nbytes(0, params), frag.nbytes(1, params)) == (56, 60)
  # Equal sizes: ties by path, then the lightest bin with the lowest index.
  tie = F.balanced({"y": np.zeros(2), "x": np.zeros(2), "z": np.zeros(2)}, 2)
  assert tie.paths == (("x", "z"), ("y",))


@pytest.mark.parametrize("num_fragments", [2, 5, 7, 24])
def test_balanced_covers_and_balances(num_fragments):
  params = make_params(num_blocks=6)
  frag = F.balanced(params, num_fragments)
  _covers_once(frag, params)
  loads = [frag.nbytes(p, params) for p in range(num_fragments)]
  largest = max(F.leaf_nbytes(x) for x in F.flatten(params).values())
  assert max(loads) - min(loads) <= largest


def test_balanced_errors_and_zero_size_leaves():
  with pytest.raises(ValueError, match="only 2 leaves"):
    F.balanced({"a": np.zeros(1), "b": np.zeros(1)}, 3)
  frag = F.balanced({"a": np.zeros(0), "b": np.zeros(0), "c": np.zeros(0)}, 3)
  assert frag.paths == (("a",), ("b",), ("c",))


@pytest.mark.parametrize("kind", F.KINDS)
def test_independent_of_insertion_order_and_key_type(kind):
  ref = F.make(kind, make_params(), 3)
  assert F.make(kind, make_params(reverse=True), 3) == ref
  assert F.make(kind, make_params(str_keys=True, reverse=True), 3) == ref
  assert F.make(kind, F.flatten(make_params(reverse=True)), 3) == ref


def test_fragmentation_validates():
  with pytest.raises(ValueError, match="empty"):
    F.Fragmentation(2, (("a",), ()), "x")
  with pytest.raises(ValueError, match="fragments 0 and 1"):
    F.Fragmentation(2, (("a",), ("a",)), "x")
  with pytest.raises(ValueError, match="no fragment"):
    F.Fragmentation(1, (("a",),), "x").fragment_of("b")
  with pytest.raises(ValueError, match="unknown fragmentation"):
    F.make("random", make_params(), 2)
  frag = F.strided(make_params(), 2)
  frag.check(make_params(reverse=True))
  with pytest.raises(ValueError, match="missing"):
    frag.check(make_params(tied=True))


@pytest.mark.parametrize("flat", [False, True])
def test_extract_insert(flat):
  params = make_params(num_blocks=4)
  if flat:
    params = F.flatten(params)
  frag = F.strided(params, 2)
  part = F.extract(params, frag, 1)
  assert sorted(part) == list(frag.paths[1])
  same = F.insert(params, frag, 1, part)
  assert F.flatten(same).keys() == F.flatten(params).keys()
  assert all(a is b for a, b in zip(F.flatten(same).values(), F.flatten(params).values()))

  ones = {k: np.ones_like(v) for k, v in part.items()}
  new = F.insert(params, frag, 1, ones)
  new_flat, old_flat = F.flatten(new), F.flatten(params)
  for path, x in new_flat.items():
    assert (x == (1.0 if frag.fragment_of(path) == 1 else 0.0)).all()
    assert (old_flat[path] == 0).all()  # the input is untouched
  if not flat:
    assert set(new["blocks"]) == {0, 1, 2, 3}  # int keys kept
    assert new["blocks"][0] is params["blocks"][0]  # fragment 0 subtree shared
    assert new["blocks"][1] is not params["blocks"][1]


def test_insert_errors():
  params = make_params(num_blocks=2)
  frag = F.strided(params, 2)
  part = dict(F.extract(params, frag, 0))
  with pytest.raises(ValueError, match="missing"):
    F.insert(params, frag, 0, {k: v for k, v in part.items() if k != "embed/embedding"})
  with pytest.raises(ValueError, match="extra"):
    F.insert(params, frag, 0, {**part, "unembed/kernel": np.zeros([D, V], np.float32)})
  with pytest.raises(ValueError, match="shape"):
    F.insert(params, frag, 0, {**part, "embed/embedding": np.zeros([V, D + 1], np.float32)})
  with pytest.raises(ValueError, match="dtype"):
    F.insert(params, frag, 0, {**part, "embed/embedding": np.zeros([V, D], np.float64)})
  with pytest.raises(ValueError, match="out of range"):
    F.extract(params, frag, 2)
  with pytest.raises(ValueError, match="lack"):
    F.extract(make_params(num_blocks=1), frag, 1)


def test_embedding_paths():
  params = make_params(num_blocks=2)
  assert F.embedding_paths(params) == ["embed/embedding"]
  assert F.is_embedding("embed/embedding") and not F.is_embedding("unembed/kernel")


def test_schedule_by_hand():
  s = F.Schedule(num_fragments=3, inner_steps=12)
  assert [s.offset(p) for p in range(3)] == [0, 4, 8]
  assert s.syncs_at(0) == [] and s.syncs_at(1) == []
  assert s.syncs_at(4) == [1] and s.syncs_at(8) == [2] and s.syncs_at(12) == [0]
  assert s.syncs_at(16) == [1]
  assert [s.next_sync(p, t) for p, t in [(1, 0), (1, 3), (1, 4), (0, 0)]] == [4, 4, 16, 12]
  crowded = F.Schedule(num_fragments=5, inner_steps=3)  # offsets 0, 0, 1, 1, 2
  assert crowded.syncs_at(3) == [0, 1] and crowded.syncs_at(4) == [2, 3]


def test_single_fragment_syncs_every_h():
  s = F.Schedule(1, 5)
  assert [t for t in range(1, 21) if s.syncs_at(t)] == [5, 10, 15, 20]
  assert all(s.syncs_at(t) == [0] for t in (5, 10, 15, 20))


@pytest.mark.parametrize("num_fragments,inner_steps", [(3, 12), (24, 24), (4, 10), (5, 3), (2, 1)])
def test_each_fragment_once_per_window(num_fragments, inner_steps):
  s = F.Schedule(num_fragments, inner_steps)
  for start in range(1, 3 * inner_steps):
    window = [p for t in range(start, start + inner_steps) for p in s.syncs_at(t)]
    assert sorted(window) == list(range(num_fragments))
  for p in range(num_fragments):
    for t in range(3 * inner_steps):
      nxt = s.next_sync(p, t)
      assert p in s.syncs_at(nxt)
      assert not any(p in s.syncs_at(u) for u in range(t + 1, nxt))


def test_every_parameter_synced_once_per_h_steps():
  params = make_params(num_blocks=6)
  frag, sched = F.strided(params, 3), F.Schedule(3, 9)
  for start in (1, 5, 10):
    synced = [
        path for t in range(start, start + 9) for p in sched.syncs_at(t) for path in frag.paths[p]
    ]
    assert sorted(synced) == F.leaf_paths(params)


def test_schedule_errors():
  with pytest.raises(ValueError, match="inner_steps"):
    F.Schedule(2, 0)
  with pytest.raises(ValueError, match="num_fragments"):
    F.Schedule(0, 5)
  with pytest.raises(ValueError, match=">= 0"):
    F.Schedule(2, 5).syncs_at(-1)


def test_stacked_blocks_are_seen_block_by_block_and_written_back_in_place():
  # a scanned model's tree: 3 layers of w [2] stacked to [3, 2], and the embedding
  w = np.arange(6.0).reshape(3, 2)
  stacked = {
      "embed": {"embedding": np.zeros(4)},
      "layers": {"w": w},
      "final_norm": {"s": np.ones(1)},
  }
  flat = F.flatten(stacked)
  assert list(flat) == ["blocks/0/w", "blocks/1/w", "blocks/2/w", "embed/embedding", "final_norm/s"]
  np.testing.assert_array_equal(flat["blocks/1/w"], [2.0, 3.0])
  assert list(F.flatten(stacked, view=False)) == ["embed/embedding", "final_norm/s", "layers/w"]
  # strided over the views: block i -> fragment i mod 2, the embedding first, final_norm last
  frag = F.make("strided", stacked, 2)
  assert frag.paths == (
      ("blocks/0/w", "blocks/2/w", "embed/embedding"),
      ("blocks/1/w", "final_norm/s"),
  )
  new = F.insert(
      stacked,
      frag,
      0,
      {
          "blocks/0/w": np.full(2, -1.0),
          "blocks/2/w": np.full(2, -2.0),
          "embed/embedding": np.ones(4),
      },
  )
  np.testing.assert_array_equal(new["layers"]["w"], [[-1, -1], [2, 3], [-2, -2]])
  assert new["final_norm"] is stacked["final_norm"] and w[0, 0] == 0  # untouched, inputs intact
  assert F.leaves(new, ["blocks/2/w"])["blocks/2/w"].tolist() == [-2.0, -2.0]
  back = F.unflatten(F.flatten(new), like=stacked)
  np.testing.assert_array_equal(back["layers"]["w"], new["layers"]["w"])
  with pytest.raises(KeyError, match="neither a leaf nor a view"):
    F.leaves(stacked, ["blocks/0/v"])
