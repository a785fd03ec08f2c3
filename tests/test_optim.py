"""Adafactor: t5x semantics per layer of a scanned stack, state shardings, scan equivalence.

References: a NumPy (float64) re-derivation of t5x's Adafactor applied to each layer as
a separate parameter, transformers' PyTorch `Adafactor`, and the same tiny model
trained unrolled.
"""

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import PartitionSpec as P

import synthetic
from st5_jax import configs, features, optim, partitioning, train
from st5_jax.checkpoints import tree
from st5_jax.model.st5 import SentenceT5

# ------------------------------------------------------------------ NumPy t5x reference


class NumpyAdafactor:
  """t5x `Adafactor.apply_param_gradient` for one 2-D or 1-D parameter, in float64.

  `factored`: (row, col) dims, or None for the full second moment. The learning-rate
  schedule is the paper's, written out here: constant for `constant_steps`, then linear
  to 0 at `num_steps`.
  """

  def __init__(self, shape, *, factored, lr, num_steps, constant_steps, decay_rate=0.8, clip=1.0,
               momentum=None, eps1=1e-30, eps2=1e-3):
    self.factored, self.lr, self.num_steps, self.constant_steps = factored, lr, num_steps, constant_steps
    self.decay_rate, self.clip, self.momentum, self.eps1, self.eps2 = decay_rate, clip, momentum, eps1, eps2
    if factored:
      row, col = factored
      self.v_row = np.zeros(shape[row])
      self.v_col = np.zeros(shape[col])
    else:
      self.v = np.zeros(shape)
    self.m = np.zeros(shape)
    self.step = 0
    self.clipped = []  # the clipping denominator of each step

  def update(self, g, w):
    g, w = g.astype(np.float64), w.astype(np.float64)
    t = self.step + 1.0
    decay = 1.0 - t ** -self.decay_rate
    if self.step < self.constant_steps:
      lr = self.lr
    else:
      lr = self.lr * (self.num_steps - self.step) / (self.num_steps - self.constant_steps)
    g2 = g * g + self.eps1
    if self.factored:
      row, col = self.factored
      self.v_row = decay * self.v_row + (1 - decay) * g2.mean(axis=col)
      self.v_col = decay * self.v_col + (1 - decay) * g2.mean(axis=row)
      v_hat = np.multiply.outer(self.v_row, self.v_col) / self.v_row.mean()
      if row > col:
        v_hat = v_hat.T
      y = g / np.sqrt(v_hat)
    else:
      self.v = decay * self.v + (1 - decay) * g2
      y = g / np.sqrt(self.v)
    denom = max(1.0, np.sqrt(np.mean(y * y)) / self.clip) if self.clip else 1.0
    self.clipped.append(denom)
    u = lr * max(np.sqrt(np.mean(w * w)), self.eps2) * (y / denom)
    if self.momentum is not None:
      self.m = self.momentum * self.m + (1 - self.momentum) * u
      u = self.m
    self.step += 1
    return -u


LAYER_SCALES = (1.0, 1e-2, 1e-5)  # the last is below epsilon2: its parameter scale is floored


def _stacked_problem(seed=0, steps=5):
  """Parameters with stacked layers of very different scale, and per-step gradients.

  The gradient of layer 0 grows 30x at step 4, so its update is clipped there while the
  other layers' are not: clipping computed over the whole stack would clip them all.
  """
  rng = np.random.default_rng(seed)
  L = len(LAYER_SCALES)
  s = np.asarray(LAYER_SCALES)
  params = {"stack": (rng.normal(size=(L, 128, 256)) * s[:, None, None]).astype(np.float32),
            "stack_T": (rng.normal(size=(L, 256, 128)) * s[:, None, None]).astype(np.float32),
            "ln": (1.0 + rng.normal(size=(L, 64)) * s[:, None]).astype(np.float32),
            "emb": rng.normal(size=(200, 128)).astype(np.float32),
            "small": rng.normal(size=(64, 512)).astype(np.float32),
            "vec": (0.3 * rng.normal(size=(96,))).astype(np.float32)}
  axes = {"stack": ("layers", "embed", "mlp"), "stack_T": ("layers", "mlp", "embed"), "ln": ("layers", "embed"),
          "emb": ("vocab", "embed"), "small": ("embed", "mlp"), "vec": ("embed",)}
  grads = []
  for t in range(steps):
    g = {}
    for k, p in params.items():
      gk = rng.normal(size=p.shape) * (0.5 + rng.random(p.shape))  # uneven rows/columns
      if k in ("stack", "stack_T", "ln"):
        layer_scale = np.asarray([1.0, 1e-3, 50.0])[:, None] * (30.0 if t == 3 else 1.0) ** np.asarray([1, 0, 0])[:, None]
        gk = gk * layer_scale.reshape((L,) + (1,) * (p.ndim - 1))
      g[k] = gk.astype(np.float32)
    grads.append(g)
  return params, axes, grads


def _reference(params, grads, *, cfg, num_steps, constant_steps):
  """Per-step updates from per-layer (unrolled) NumPy Adafactors; and their clipping record."""
  def opt(shape):
    factored = None
    if len(shape) == 2 and min(shape) >= cfg.min_dim_size_to_factor:
      factored = (0, 1) if shape[0] <= shape[1] else (1, 0)
    return NumpyAdafactor(shape, factored=factored, lr=cfg.learning_rate, num_steps=num_steps,
                          constant_steps=constant_steps, decay_rate=cfg.decay_rate, clip=cfg.clipping_threshold,
                          momentum=cfg.momentum, eps1=cfg.epsilon1)

  stacked = ("stack", "stack_T", "ln")
  opts = {k: ([opt(p.shape[1:]) for _ in range(p.shape[0])] if k in stacked else opt(p.shape))
          for k, p in params.items()}
  w = {k: v.astype(np.float64) for k, v in params.items()}
  all_updates = []
  for g in grads:
    upd = {}
    for k in w:
      if k in stacked:
        upd[k] = np.stack([o.update(g[k][i], w[k][i]) for i, o in enumerate(opts[k])])
      else:
        upd[k] = opts[k].update(g[k], w[k])
    w = {k: w[k] + upd[k] for k in w}
    all_updates.append(upd)
  return all_updates, opts


def _run_jax(params, axes, grads, cfg, num_steps):
  tx, _ = optim.make_optimizer(cfg, num_train_steps=num_steps, param_axes=axes)
  state = tx.init(params)
  update = jax.jit(tx.update)
  w = jax.tree.map(jnp.asarray, params)
  out = []
  for g in grads:
    u, state = update(g, state, w)
    w = jax.tree.map(lambda a, b: a + b, w, u)
    out.append(jax.tree.map(np.asarray, u))
  return out, state


def _assert_updates_close(got, want, rtol, where):
  """Each layer's update within rtol of that layer's largest reference update."""
  for k in want:
    w, g = want[k], got[k]
    layers = range(w.shape[0]) if k in ("stack", "stack_T", "ln") else [None]
    for i in layers:
      wi, gi = (w, g) if i is None else (w[i], g[i])
      err = np.abs(gi - wi).max() / np.abs(wi).max()
      assert err <= rtol, f"{where} {k} layer {i}: max error {err:.2e} of the layer's largest update"


# epsilon1 1e-4 is above the squared gradients of the 1e-3-scaled layer: it must be added.
@pytest.mark.parametrize("momentum,epsilon1", [(None, 1e-30), (0.9, 1e-4)])
def test_adafactor_matches_numpy_t5x_reference_per_layer_over_steps(momentum, epsilon1):
  """5 steps, schedule decaying after 2; every layer of a stack as its own t5x parameter."""
  params, axes, grads = _stacked_problem()
  cfg = optim.OptimizerConfig(learning_rate=1e-2, constant_fraction=0.4, momentum=momentum, epsilon1=epsilon1)
  want, opts = _reference(params, grads, cfg=cfg, num_steps=5, constant_steps=2)
  got, state = _run_jax(params, axes, grads, cfg, num_steps=5)
  for t in range(5):
    _assert_updates_close(got[t], want[t], 1e-6, f"step {t + 1}")
  # The problem exercises what it claims: clipping in one layer, not in the others...
  clipped = np.asarray([o.clipped for o in opts["stack"]])  # [layer, step]
  assert clipped[0, 3] > 1.5 and np.all(clipped[1:, 3] < 1.01)
  # ...and the per-layer statistics themselves (v_row keeps the layer and row dims).
  assert state.v_row["stack"].shape == (3, 128) and state.v_col["stack"].shape == (3, 256)
  for i, o in enumerate(opts["stack"]):
    np.testing.assert_allclose(np.asarray(state.v_row["stack"][i]), o.v_row, rtol=1e-6)
    np.testing.assert_allclose(np.asarray(state.v_col["stack"][i]), o.v_col, rtol=1e-6)
  assert (state.m is None) == (momentum is None)


def test_adafactor_step_one_alone_does_not_pin_the_decay_rate():
  # Why the test above runs several steps: at step 1 beta2 = 1 - 1^-d = 0 for any d.
  params, axes, grads = _stacked_problem(steps=2)
  cfg = optim.OptimizerConfig(learning_rate=1e-2)
  other = optim.OptimizerConfig(learning_rate=1e-2, decay_rate=0.3)
  a, _ = _run_jax(params, axes, grads, cfg, num_steps=10)
  b, _ = _run_jax(params, axes, grads, other, num_steps=10)
  np.testing.assert_allclose(a[0]["stack"], b[0]["stack"], rtol=1e-6)
  assert np.abs(a[1]["stack"] - b[1]["stack"]).max() > 1e-2 * np.abs(a[1]["stack"]).max()


def test_adafactor_matches_transformers_pytorch_adafactor():
  """transformers' Adafactor, each layer a separate torch parameter, 5 steps, momentum + schedule.

  Settings that make the two the same algorithm: relative_step=False (lr from the
  schedule, via LambdaLR), scale_parameter=True (lr x max(RMS(w), 1e-3)),
  decay_rate=-0.8 (beta2_t = 1 - t^-0.8), clip_threshold=1.0, eps=(1e-30, 1e-3), beta1.
  Where they differ (so not compared): transformers factors every >= 2-D tensor over its
  last two dims (t5x: only when both of the two largest dims are >= 128); and for a
  stacked >2-D tensor it takes the clipping and parameter-scale RMS over the whole
  tensor, i.e. across layers (t5x: within each layer). Hence each layer is its own
  parameter here, and only shapes that t5x factors too (and vectors) are used.
  """
  import torch
  from transformers.optimization import Adafactor

  params, axes, grads = _stacked_problem(seed=1)
  keep = ("stack", "stack_T", "ln", "emb", "vec")
  params = {k: params[k] for k in keep}
  axes = {k: axes[k] for k in keep}
  grads = [{k: g[k] for k in keep} for g in grads]
  cfg = optim.OptimizerConfig(learning_rate=1e-2, constant_fraction=0.4, momentum=0.9)
  got, _ = _run_jax(params, axes, grads, cfg, num_steps=5)

  torch.manual_seed(0)
  names = [(k, i) for k in keep for i in (range(params[k].shape[0]) if axes[k][0] == "layers" else [None])]
  # float64 in torch (transformers keeps float64 as is), so its updates read back from the
  # parameters exactly and the comparison has float32 rounding on one side only.
  tparams = {n: torch.nn.Parameter(torch.tensor(params[n[0]] if n[1] is None else params[n[0]][n[1]],
                                                dtype=torch.float64)) for n in names}
  topt = Adafactor(list(tparams.values()), lr=1e-2, eps=(1e-30, 1e-3), clip_threshold=1.0, decay_rate=-0.8,
                   beta1=0.9, weight_decay=0.0, scale_parameter=True, relative_step=False, warmup_init=False)
  sched = optim.learning_rate_schedule(learning_rate=1e-2, num_train_steps=5, constant_fraction=0.4)
  lr_sched = torch.optim.lr_scheduler.LambdaLR(topt, lambda step: float(sched(step)) / 1e-2)
  for t, g in enumerate(grads):
    before = {n: p.detach().clone() for n, p in tparams.items()}
    for (k, i), p in tparams.items():
      p.grad = torch.tensor(g[k] if i is None else g[k][i], dtype=torch.float64)
    topt.step()
    lr_sched.step()
    want = {}
    for k in keep:
      per = [(tparams[(k, i)] - before[(k, i)]).detach().numpy() for (kk, i) in names if kk == k]
      want[k] = np.stack(per) if axes[k][0] == "layers" else per[0]
    _assert_updates_close(got[t], want, 1e-6, f"step {t + 1} vs transformers")


def test_layers_axis_is_a_batch_axis_for_factoring():
  # The layers dim is never one of the two factored dims, and never in an RMS.
  plan = optim.plan_param((24, 1024, 2816), ("layers", "embed", "mlp"))
  assert plan.factored == (1, 2) and plan.batch_dims == (0,) and plan.rms_dims == (1, 2)
  # 200 stacked [64, 512] matrices: 64 < 128, not factored (without axes: 200 x 512 would be).
  assert optim.plan_param((200, 64, 512), ("layers", "embed", "mlp")).factored is None
  assert optim.plan_param((200, 64, 512)).factored == (0, 2)
  # Equal sizes keep their order: the first is the row, as for the unrolled [d, d] kernel.
  assert optim.plan_param((4, 768, 768), ("layers", "joined_kv", "embed")).factored == (1, 2)
  assert optim.plan_param((768, 768), ("joined_kv", "embed")).factored == (0, 1)
  with pytest.raises(ValueError, match=r"encoder/q.*one name per dimension"):
    optim.plan_param((2, 3), ("embed",), name="encoder/q")
  tx, _ = optim.make_optimizer(optim.OptimizerConfig(), num_train_steps=3, param_axes={"w": ("embed", "mlp")})
  with pytest.raises(ValueError, match="structure of the parameters"):
    tx.init({"w": np.zeros((2, 3), np.float32), "b": np.zeros((3,), np.float32)})


def test_adafactor_state_is_factored_for_large_matrices():
  tx, _ = optim.make_optimizer(optim.OptimizerConfig(), num_train_steps=10)
  params = {"big": np.zeros((256, 512), np.float32), "small": np.zeros((64, 512), np.float32),
            "vec": np.zeros((768,), np.float32)}
  state = tx.init(params)
  assert state.v_row["big"].shape == (256,) and state.v_col["big"].shape == (512,)
  assert state.v["big"].shape == (1,)  # no full second moment kept
  assert state.v["small"].shape == (64, 512) and state.v["vec"].shape == (768,)  # below 128 / 1-D
  assert state.m is None  # no momentum by default (t5x fine-tuning)
  # t5x semantics: update RMS clipped at 1 and scaled by the parameter's RMS (floor 1e-3).
  grads = {k: np.ones_like(v) for k, v in params.items()}
  upd, _ = tx.update(grads, state, params)
  np.testing.assert_allclose(np.asarray(upd["vec"]), -1e-3 * 1e-3, rtol=1e-5)


# ----------------------------------------------------------------------------- sharding


def _boxed(shapes_axes):
  return {k: nn.LogicallyPartitioned(jax.ShapeDtypeStruct(s, jnp.float32), names=a)
          for k, (s, a) in shapes_axes.items()}


def test_state_shardings_follow_the_dims_each_statistic_keeps():
  """Square T5.1.1-base kernels on data x fsdp x model = 2 x 2 x 2, scanned and not."""
  mesh = partitioning.make_mesh(partitioning.MeshConfig(2, 2, 2))
  boxed = _boxed({
      "q": ((768, 768), ("embed", "joined_kv")),
      "o": ((768, 768), ("joined_kv", "embed")),
      "wo": ((2048, 768), ("mlp", "embed")),
      "stack_q": ((12, 768, 768), ("layers", "embed", "joined_kv")),
      "stack_o": ((12, 768, 768), ("layers", "joined_kv", "embed")),
      "stack_ln": ((12, 768), ("layers", "embed")),
      "emb": ((32128, 768), ("vocab", "embed")),
  })
  cfg = optim.OptimizerConfig(momentum=0.9)
  sh = optim.state_shardings(cfg, boxed, mesh)
  spec = lambda field, k: getattr(sh, field)[k].spec  # noqa: E731
  assert partitioning.param_specs(boxed)["q"] == P("fsdp", "model")
  # q [embed, joined_kv]: v_row keeps embed (fsdp), v_col keeps joined_kv (model).
  assert spec("v_row", "q") == P("fsdp") and spec("v_col", "q") == P("model")
  # o [joined_kv, embed]: the row is joined_kv (model), the column embed (fsdp).
  assert spec("v_row", "o") == P("model") and spec("v_col", "o") == P("fsdp")
  assert spec("v_row", "wo") == P("fsdp") and spec("v_col", "wo") == P("model")  # row = the smaller dim
  # Scanned stacks: the layers dim stays in both statistics, unsharded.
  assert spec("v_row", "stack_q") == P(None, "fsdp") and spec("v_col", "stack_q") == P(None, "model")
  assert spec("v_row", "stack_o") == P(None, "model") and spec("v_col", "stack_o") == P(None, "fsdp")
  assert spec("v", "stack_ln") == P(None, "fsdp") and spec("v_row", "stack_ln") == P()
  assert spec("v_row", "emb") == P("fsdp") and spec("v_col", "emb") == P("model")
  assert spec("m", "stack_q") == P(None, "fsdp", "model") and spec("v", "q") == P() and sh.count.spec == P()
  # The specs fit the state the optimizer actually creates (same tree, every dim divisible).
  tx, _ = optim.make_optimizer(cfg, num_train_steps=3, param_axes=optim.logical_axes(boxed))
  abstract = jax.eval_shape(tx.init, nn.unbox(boxed))
  assert jax.tree.structure(abstract) == jax.tree.structure(sh)
  partitioning.check_divisible(abstract, jax.tree.map(lambda s: s.spec, sh), mesh)
  v_row = abstract.v_row
  assert v_row["stack_q"].shape == (12, 768) and v_row["o"].shape == (768,)


def test_parameters_and_optimizer_state_are_really_sharded():
  # A scanned T5.1.1-like model with factored (>= 128) kernels, through train.build.
  model = configs.ST5Config(t5=configs.T5Config(vocab_size=384, emb_dim=128, num_heads=2, head_dim=64, mlp_dim=256,
                                                num_encoder_layers=2, num_decoder_layers=2,
                                                mlp_activations=("gelu", "linear"), logits_via_embedding=False,
                                                dropout_rate=0.0, scan_layers=True), embedding_dim=16)
  mesh = partitioning.make_mesh(partitioning.MeshConfig(2, 2, 2))
  setup = train.build(model, train.TrainConfig(num_train_steps=2, global_batch_size=16, eval_every=-1), mesh)
  layer = lambda tree_: tree_["encoder"]["layers"]["attention"]  # noqa: E731
  assert layer(setup.state_shardings.params)["query"]["kernel"].spec == P(None, "fsdp", "model")
  opt = setup.state_shardings.opt_state
  assert layer(opt.v_row)["query"]["kernel"].spec == P(None, "fsdp")
  assert layer(opt.v_col)["query"]["kernel"].spec == P(None, "model")
  assert layer(opt.v_row)["out"]["kernel"].spec == P(None, "model")
  assert layer(opt.v_col)["out"]["kernel"].spec == P(None, "fsdp")
  with jax.set_mesh(mesh):
    state = train.init_state(setup, model, seed=0)
  v_row = layer(state.opt_state.v_row)["query"]["kernel"]
  assert v_row.shape == (2, 128) and v_row.sharding.spec == P(None, "fsdp")
  # Each device holds half the rows of every layer's statistic.
  assert {s.data.shape for s in v_row.addressable_shards} == {(2, 64)}


# ------------------------------------------------------------------ scanned == unrolled


def _scan_cfg(size, pooling, scan):
  return configs.ST5Config(t5=configs.t5_size(size, dropout_rate=0.0, vocab_size=384, scan_layers=scan),
                           embedding_dim=16, pooling=pooling)


def _train_two_steps(model, init_flat, opt_cfg):
  mesh = partitioning.make_mesh(partitioning.MeshConfig(1, 1, 1), devices=jax.devices()[:1])
  tc = train.TrainConfig(num_train_steps=10, global_batch_size=16, eval_every=-1, optimizer=opt_cfg)
  setup = train.build(model, tc, mesh)
  with jax.set_mesh(mesh):
    state = train.init_state(setup, model, seed=0, init_params=tree.unflatten(init_flat))
    batches = synthetic.SyntheticPairs(mesh, 16, 0)
    for _ in range(2):
      state, _ = setup.step_fn(state, next(batches))
  params = jax.device_get(state.params)
  tokens_BxL = synthetic.SyntheticPairs(mesh, 16, 7)._global_batch(0)[features.LEFT]
  emb_BxD = np.asarray(SentenceT5(model).apply({"params": params}, jnp.asarray(tokens_BxL)))
  return emb_BxD, {k: np.asarray(v) for k, v in tree.flatten(params).items()}


# T5 1.0 / T5.1.1 shapes, encoder / encoder-decoder; min_dim_size_to_factor 32 factors the
# tiny kernels (32 x 32, 32 x 64, 384 x 32), 128 keeps them whole.
@pytest.mark.parametrize("size,pooling,min_dim", [("t5_tiny", "enc_mean", 128), ("t5_tiny", "encdec_first", 32),
                                                  ("t5_1_1_tiny", "enc_mean", 32),
                                                  ("t5_1_1_tiny", "encdec_first", 128)])
def test_scanned_and_unrolled_training_agree(size, pooling, min_dim):
  """Same initial weights, one block scaled by 0.05, 2 steps: same parameters and embeddings.

  epsilon1=1e-6 as in the trainer tests: Adafactor's first update is ~sign(g), so with
  1e-30 a gradient at rounding-noise level (scan and unrolled sum in different orders)
  would become a full-size update. What is left is rounding noise (measured on 2 CPU
  cores: embeddings 0.9e-7 to 4.2e-7 apart; parameters at most 4e-5 of their 2-step
  movement in Frobenius norm, from a few elements of the small block's attention keys
  whose gradients are below sqrt(epsilon1)). With the parameter scale and clipping over
  the whole stack (optax.adafactor, used before) the embeddings were 1.2e-2 to 5.2e-2
  apart and the small block's parameters off by 13x to 16x their movement.
  """
  opt_cfg = optim.OptimizerConfig(learning_rate=1e-2, epsilon1=1e-6, min_dim_size_to_factor=min_dim)
  unrolled = _scan_cfg(size, pooling, scan=False)
  init = {k: np.asarray(v) for k, v in tree.flatten(nn.unbox(
      SentenceT5(unrolled).init(jax.random.PRNGKey(0), jnp.ones((1, 8), jnp.int32))["params"])).items()}
  for k in init:  # a block whose weights (and so parameter scale) are 20x smaller
    if k.startswith(("encoder/layers_1/", "decoder/layers_1/")) and k.endswith("kernel"):
      init[k] = init[k] * 0.05
  emb_u, p_u = _train_two_steps(unrolled, init, opt_cfg)
  emb_s, p_s = _train_two_steps(_scan_cfg(size, pooling, scan=True), tree.stack_layers(init), opt_cfg)
  p_s = tree.unstack_layers(p_s)
  assert p_s.keys() == p_u.keys()
  np.testing.assert_allclose(emb_s, emb_u, atol=2e-6, rtol=0)
  assert np.linalg.norm(p_u["encoder/layers_1/mlp/wo/kernel"] - init["encoder/layers_1/mlp/wo/kernel"]) > 0
  for k in p_u:
    moved = np.linalg.norm(p_u[k] - init[k])
    if moved == 0:  # no gradient (encdec_first: decoder self-attention keys over one position)
      np.testing.assert_array_equal(p_s[k], p_u[k], err_msg=k)
      continue
    # Relative to how far each parameter moved in 2 steps (the small block moves ~20x less).
    assert np.linalg.norm(p_s[k] - p_u[k]) <= 1e-3 * moved, k
