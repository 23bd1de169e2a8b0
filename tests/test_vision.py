"""The vision task: the ViT, scikit-learn's digits (hash-checked), .npz images, shards by class,
and a decoupled run on digits."""

import gzip
import json

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from configs import digits
from diloco import train
from diloco.config import checks
from diloco.data import images
from diloco.models import vit


def _vit(**kw) -> vit.VitConfig:
  fields = digits.get_config("model=vit_tiny").model.to_dict()
  return vit.VitConfig(**{k: v for k, v in {**fields, **kw}.items() if k != "size"})


def test_patches_are_taken_row_by_row():
  x = jnp.arange(16.0).reshape(1, 4, 4, 1)  # pixel value = 4 * row + column
  p = np.asarray(vit.patches(x, 2))
  assert p.shape == (1, 4, 4)
  np.testing.assert_array_equal(p[0, 0], [0, 1, 4, 5])  # top-left patch, row-major
  np.testing.assert_array_equal(p[0, 1], [2, 3, 6, 7])  # top-right
  np.testing.assert_array_equal(p[0, 2], [8, 9, 12, 13])  # bottom-left


@pytest.mark.parametrize("pool", ["cls", "mean"])
def test_vit_shapes_and_bidirectional_attention(pool):
  cfg = _vit(pool=pool)
  model = vit.ViT(cfg, nnx.Rngs(0))
  x = jax.random.uniform(jax.random.key(0), (3, 8, 8, 1))
  logits, aux = model.forward(x)
  assert logits.shape == (3, 10) and aux == {}
  params = nnx.to_pure_dict(nnx.state(model))
  assert params["patch"]["kernel"].shape == (4, 32) and params["head"]["kernel"].shape == (32, 10)
  assert ("cls" in params) == (pool == "cls")
  # Every patch sees every other: changing the last patch changes what pooling reads first.
  changed = x.at[:, 6:, 6:, :].add(1.0)
  assert not np.allclose(np.asarray(model(changed)), np.asarray(logits))


def test_a_patch_that_does_not_divide_the_image_fails_at_config_time():
  with pytest.raises(
      ValueError, match=r"model.image_size=8 is not divisible by model.patch_size=3"
  ):
    checks.prepare(digits.get_config("patch=3"))
  with pytest.raises(ValueError, match="model.size='vit_huge': unknown model size"):
    checks.prepare(digits.get_config("model=vit_huge"))


def test_digits_split_and_shards_by_class(tmp_path):
  s = images.load_digits()
  assert (len(s.train), len(s.val), s.image_shape, s.num_classes) == (1438, 359, (8, 8, 1), 10)
  assert float(s.train.images_NxHxWxC.max()) == 1.0 and float(s.train.images_NxHxWxC.min()) == 0.0
  for m in range(4):  # non-i.i.d.: learner m of 4 holds the classes c with c % 4 == m
    mine = images.shard(s.train, m, 4, iid=False)
    assert set(np.unique(mine.labels_N)) == {c for c in range(10) if c % 4 == m}
  assert len(images.shard(s.train, 1, 4, iid=True)) == 1438


def test_a_corrupted_digits_file_is_refused(tmp_path, monkeypatch):
  monkeypatch.setattr(images, "_installed_digits", lambda: None)
  good = images.digits_file()  # the verified file (from an installed copy or the cache)
  bad = tmp_path / "digits" / "digits.csv.gz"
  bad.parent.mkdir()
  data = bytearray(good.read_bytes())
  data[100] ^= 0xFF
  bad.write_bytes(bytes(data))
  with pytest.raises(ValueError, match="sha256 mismatch for the digits file.*refusing to train"):
    images.load_digits(str(tmp_path))
  bad.write_bytes(gzip.compress(b"not,digits\n"))
  with pytest.raises(ValueError, match="sha256 mismatch"):
    images.load_digits(str(tmp_path))


def test_npz_images_with_a_held_out_file(tmp_path):
  rng = np.random.default_rng(0)
  for i in range(3):
    x = rng.integers(0, 256, (5, 4, 4), dtype=np.uint8)
    np.savez(tmp_path / f"part{i}.npz", images=x, labels=np.arange(5) % 3)
  s = images.load_npz(str(tmp_path / "*.npz"))
  assert (len(s.train), len(s.val), s.image_shape, s.num_classes) == (10, 5, (4, 4, 1), 3)
  assert 0.0 <= s.train.images_NxHxWxC.min() and s.train.images_NxHxWxC.max() <= 1.0
  np.savez(tmp_path / "bad.npz", images=np.zeros((2, 4, 4)), labels=np.zeros(3, np.int32))
  with pytest.raises(ValueError, match="do not match"):
    images.load_npz(str(tmp_path / "*.npz"))
  with pytest.raises(ValueError, match="matches no file"):
    images.load_npz(str(tmp_path / "none*.npz"))


def test_digits_decoupled_runlocal_writes_accuracy(tmp_path):
  # A mixture-of-experts ViT (vit_moe's experts on vit_tiny's width): both new models at once.
  c = digits.get_config("mode=decoupled,runlocal,steps=16")
  with c.unlocked():
    c.model.update(dict(num_experts=4, expert_d_ff=32))
    c.progress_bar, c.timeline = False, False
  s = train.train_and_evaluate(c, str(tmp_path))
  assert {"eval_loss", "eval_accuracy", "merges", "bytes_per_token", "learners"} <= set(s)
  assert "eval_bpb" not in s and 0.0 <= s["eval_accuracy"] <= 1.0
  assert s["tokens"] == 2 * 16 * 16  # a token is an image: 2 learners x 16 steps x 16
  rows = [json.loads(line) for line in open(tmp_path / "metrics.jsonl")]
  assert any("eval_accuracy" in r for r in rows)
  assert any(k.endswith("moe_load_balance") for r in rows for k in r)
