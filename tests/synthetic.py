"""A deterministic in-memory batch iterator for trainer tests (no tf.data)."""

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np

from st5_jax import partitioning
from st5_jax.features import LABELS
from st5_jax.features import LEFT, RIGHT, RIGHT_NEG, negative_features


class SyntheticPairs:
  """Batch i is a pure function of (seed, i): positives share most tokens with their query.

  Each process builds only its rows of the global batch, like the real pipeline.
  `negatives`: hard negatives per example, K (True: 1, False: 0), under the names of
  st5_jax.features.negative_features(K); the first is the same for every K.
  """

  def __init__(self, mesh, global_batch_size, seed, *, length=12, negatives=True, vocab=300, cycle=None):
    self.mesh, self.B, self.seed, self.L, self.vocab = mesh, global_batch_size, seed, length, vocab
    self.negatives = int(negatives)
    self.cycle = cycle  # repeat the first `cycle` batches (to watch a loss fall on fixed data)
    self.index = 0
    self.sharding = partitioning.batch_sharding(mesh)

  def _global_batch(self, i):
    rng = np.random.default_rng([self.seed, i])
    n = rng.integers(4, self.L - 1, size=self.B)
    left = rng.integers(3, self.vocab, size=(self.B, self.L)).astype(np.int32)
    right = left.copy()
    flip = rng.random((self.B, self.L)) < 0.3
    right[flip] = rng.integers(3, self.vocab, size=flip.sum())
    neg = rng.integers(3, self.vocab, size=(self.B, self.L)).astype(np.int32)
    # Negatives 1..K-1 drawn after the first: K = 1 batches stay what they were.
    more = [rng.integers(3, self.vocab, size=(self.B, self.L)).astype(np.int32) for _ in range(self.negatives - 1)]
    for arr in (left, right, neg, *more):
      for r in range(self.B):
        arr[r, n[r]] = 1
        arr[r, n[r] + 1:] = 0
    out = {LEFT: left, RIGHT: right}
    if self.negatives:
      out.update(zip((model_key for _, model_key in negative_features(self.negatives)), (neg, *more)))
    return out

  def __iter__(self):
    return self

  def __next__(self):
    batch = self._global_batch(self.index % self.cycle if self.cycle else self.index)
    self.index += 1
    per = self.B // jax.process_count()
    lo = jax.process_index() * per
    return {k: jax.make_array_from_process_local_data(self.sharding, v[lo:lo + per], v.shape)
            for k, v in batch.items()}

  def get_state(self):
    return {"index": self.index}

  def set_state(self, state):
    self.index = int(state["index"])


def eos_padded_tokens(B, L, seed, vocab=384):
  """[B, L] int32 token ids from 3..vocab-1, each row ended by EOS (1) at a random length and padded with 0."""
  rng = np.random.default_rng(seed)
  t = rng.integers(3, vocab, size=(B, L)).astype(np.int32)
  for i, n in enumerate(rng.integers(2, L + 1, size=B)):
    t[i, n - 1], t[i, n:] = 1, 0
  return t


def factory(**kw):
  return lambda mesh, batch_size, seed: SyntheticPairs(mesh, batch_size, seed, **kw)


class SyntheticSentences(SyntheticPairs):
  """ConSERT's unsupervised batches: single sentences under LEFT."""

  def _global_batch(self, i):
    return {LEFT: super()._global_batch(i)[LEFT]}


class SyntheticNliPairs(SyntheticPairs):
  """ConSERT's NLI batches: premise LEFT, hypothesis RIGHT, int32 class LABELS [B].

  The label is a function of the pair (0: unrelated hypothesis, 1: near copy, 2: copy
  with its second half replaced), so a classifier can learn it.
  """

  def _global_batch(self, i):
    rng = np.random.default_rng([self.seed, i, 7])
    b = super()._global_batch(i)
    premise, near = b[LEFT], b[RIGHT]
    labels = rng.integers(0, 3, size=self.B).astype(np.int32)
    hyp = np.where(labels[:, None] == 0, b[RIGHT_NEG], near)
    half = premise.copy()
    for r in range(self.B):
      n = int((premise[r] > 0).sum())
      half[r, n // 2:n - 1] = rng.integers(3, self.vocab, size=max(n - 1 - n // 2, 0))
    hyp = np.where(labels[:, None] == 2, half, hyp)
    return {LEFT: premise, RIGHT: hyp.astype(np.int32), LABELS: labels}


def sentences_factory(**kw):
  return lambda mesh, batch_size, seed: SyntheticSentences(mesh, batch_size, seed, **kw)


def nli_factory(**kw):
  return lambda mesh, batch_size, seed: SyntheticNliPairs(mesh, batch_size, seed, **kw)


def tiny_run_gin(data: str, *, steps: int, extra: str = "") -> str:
  """A gin file of a tiny `st5 train` run on `@data()` (a name registered with gin.external_configurable(factory)):
  t5_tiny, batch 16, a checkpoint every 2 steps, no evaluation."""
  return f"""
run.model = @st5_model()
st5_model.size = 't5_tiny'
st5_model.embedding_dim = 16
st5_model.dropout_rate = 0.0
st5_model.vocab_size = 384
run.train_config = @TrainConfig()
TrainConfig.num_train_steps = {steps}
TrainConfig.global_batch_size = 16
TrainConfig.checkpoint_every = 2
TrainConfig.log_every = 1
TrainConfig.eval_every = -1
run.data = @{data}()
run.mesh = @MeshConfig()
MeshConfig.data = -1
{extra}"""


class HashTeacher:
  """A distillation teacher for tests (st5_jax.objectives.distill.teacher.Teacher): each text's vector is a
  fixed function of its words (a sum of per-word random vectors, normalised), so texts sharing words are close."""

  def __init__(self, dim: int, *, seed: int = 0):
    self.dim, self.seed = dim, seed
    self.encoded: list[str] = []  # every text encoded, in order (the resume tests count them)

  def _word(self, word: str) -> np.ndarray:
    key = int.from_bytes(word.encode("utf-8")[:16].ljust(16, b"\0"), "little")
    return np.random.default_rng([self.seed, key, len(word)]).normal(size=self.dim)

  def encode(self, texts):
    self.encoded.extend(texts)
    out = np.zeros((len(texts), self.dim))
    for i, text in enumerate(texts):
      for word in text.lower().split() or [""]:
        out[i] += self._word(word)
    return (out / np.maximum(np.linalg.norm(out, axis=1, keepdims=True), 1e-9)).astype(np.float32)

  def describe(self):
    return {"backend": "hash", "path": f"hash-teacher-{self.seed}", "dim": self.dim, "fingerprint": f"seed{self.seed}"}


class TinyTower(nn.Module):
  """A bag of token embeddings and a projection: a stand-in for the T5 tower where a test checks an objective's
  wiring (what its step feeds the loss, GradCache's chunks) and not the tower; it compiles in a second."""

  vocab: int = 384
  dim: int = 16

  @nn.compact
  def __call__(self, tokens_BxL, deterministic: bool = True):
    del deterministic  # no dropout
    mask_BxLx1 = (tokens_BxL > 0)[..., None]
    x_BxLxH = nn.Embed(self.vocab, 32)(tokens_BxL)
    pooled_BxH = (x_BxLxH * mask_BxLx1).sum(1) / jnp.maximum(mask_BxLx1.sum(1), 1)
    return nn.Dense(self.dim, use_bias=False)(jnp.tanh(pooled_BxH))
