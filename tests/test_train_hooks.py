"""A caller's hooks in `train(..., hooks=...)`: they run at their steps, may switch the batch stream, keep state.

The hook here does what a negatives refresh does: every 3 steps it switches the stream to
the next "generation" (another seed of the synthetic data) and records the generation in
the checkpoint. A run interrupted after a switch and resumed must read exactly the batches
of an uninterrupted run and end with the same parameters, bit for bit.
"""

import numpy as np
import pytest

import synthetic
from st5_jax import configs, hooks, optim, partitioning, train
from st5_jax.checkpoints import native, tree
from st5_jax.features import LEFT

TINY = configs.ST5Config(t5=configs.t5_size("t5_tiny", dropout_rate=0.0, vocab_size=384), embedding_dim=16)


class Generations:
  """Every `every` steps: the next generation's stream (seed 100 + generation), from its start."""

  def __init__(self, every: int):
    self.every, self.generation, self.restored = every, 0, None

  def _stream(self, stream, generation):
    return synthetic.SyntheticPairs(stream.mesh, stream.global_batch_size, 100 + generation)

  def switch(self, info: hooks.StepInfo) -> None:
    self.generation += 1
    info.stream.replace(self._stream(info.stream, self.generation))

  def state_dict(self):
    return {"generation": self.generation}

  def load_state_dict(self, state, stream):
    self.restored = dict(state)
    self.generation = state["generation"]
    if self.generation:
      stream.replace(self._stream(stream, self.generation))

  def hook(self) -> hooks.Hook:
    return hooks.Hook(self.switch, every=self.every, name="generations", state_dict=self.state_dict,
                      load_state_dict=self.load_state_dict)


def _run(workdir, vocab_path, caller_hooks, **kw):
  tc = train.TrainConfig(num_train_steps=8, global_batch_size=16, checkpoint_every=2, log_every=1, eval_every=-1,
                         optimizer=optim.OptimizerConfig(learning_rate=1e-2))
  return train.train(workdir=workdir, model_config=TINY, train_config=tc, make_iterator=synthetic.factory(),
                     mesh_config=partitioning.MeshConfig(), vocab_file=vocab_path, progress=False, hooks=caller_hooks,
                     **kw)


def _seen(log):
  """A hook recording a fingerprint of every step's batch."""
  return hooks.Hook(lambda info: log.append((info.step, int(np.asarray(info.batch[LEFT]).sum()))), every=1)


def test_a_hook_switches_the_stream_keeps_its_state_and_a_resume_is_exact(tmp_path, vocab_path):
  full_log, gens = [], Generations(every=3)
  _run(tmp_path / "full", vocab_path, [gens.hook(), _seen(full_log)])
  assert gens.generation == 2  # switched after steps 3 and 6

  part_log, first = [], Generations(every=3)
  r1 = _run(tmp_path / "part", vocab_path, [first.hook(), _seen(part_log)], stop_after_steps=4)
  assert r1.step == 4 and first.generation == 1
  again = Generations(every=3)
  _run(tmp_path / "part", vocab_path, [again.hook(), _seen(part_log)])
  assert again.restored == {"generation": 1}  # from the step-4 checkpoint, after the switch at step 3
  assert again.generation == 2

  assert part_log == full_log  # the same batches at the same steps: the stream switched, then its position
  assert len({s for _, s in full_log[:3]} & {s for _, s in full_log[3:6]}) == 0  # the switch changed the data
  _, a, _ = native.load_params(tmp_path / "full")
  _, b, _ = native.load_params(tmp_path / "part")
  a, b = tree.flatten(a), tree.flatten(b)
  for k in a:
    np.testing.assert_array_equal(np.asarray(a[k]), np.asarray(b[k]), err_msg=k)


def test_hooks_with_state_need_a_name_and_both_halves():
  with pytest.raises(ValueError, match="needs a name"):
    hooks.Hook(lambda i: None, every=1, state_dict=dict, load_state_dict=lambda s, st: None)
  with pytest.raises(ValueError, match="both state_dict and load_state_dict"):
    hooks.Hook(lambda i: None, every=1, name="x", state_dict=dict)
  h = hooks.Hooks()
  h.add(hooks.Hook(lambda i: None, every=1, name="x", state_dict=dict, load_state_dict=lambda s, st: None))
  with pytest.raises(ValueError, match="two hooks are named 'x'"):
    h.add(hooks.Hook(lambda i: None, every=2, name="x", state_dict=dict, load_state_dict=lambda s, st: None))
