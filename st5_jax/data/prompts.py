"""Training prompts: text prepended to a task's features before tokenisation (DataConfig.prompts).

As sentence-transformers' trainer `prompts`, the prompt is prepended as text, so it is
tokenised with the example and counts in the feature length; truncation cuts the end of
the text (and EOS is kept), never the prompt's start. The forms of `DataConfig.prompts`:

    "query: "                                      every token feature of every task
    {"query": "query: ", "document": "passage: "}  by side: query -> `inputs`; document -> `targets`
                                                   and every `negative_targets*`
    {"inputs": "q: ", "negative_targets": ""}      by task feature (wins over the side)
    {"st5_a": {"query": "q: "}, "document": "d: "} per task of a mixture (a string: all its features);
                                                   a task's own entries win over the common ones

`resolve` turns the spec into {task: {feature: prompt}} (empty prompts dropped) against the tasks'
batch layout. `with_prompts(task, prompts)` is the task with an `AddPrompts` step inserted before its
tokenize step: the seqio path runs it, the NumPy path (convert.TextEncoder) and the token cache's
writers recognise it and prepend the same text in Python, so all three paths give the same ids.
No TensorFlow or seqio at import (DataConfig checks the spec in the trainer's process).
"""

from __future__ import annotations

from typing import Any, Mapping, Sequence

SIDES = ("query", "document")
WHERE = "DataConfig.prompts"


def side_features(side: str, features: Sequence[str]) -> list[str]:
  """The task features of a side among `features`: query -> inputs; document -> targets, negative_targets*."""
  if side == "query":
    return [f for f in features if f == "inputs"]
  return [f for f in features if f == "targets" or f == "negative_targets" or f.startswith("negative_targets_")]


def check_spec(spec: Any, where: str = WHERE) -> None:
  """Raises ValueError (one line) unless `spec` has one of the forms of the module docstring (names unchecked)."""
  if spec is None or isinstance(spec, str):
    return
  if not isinstance(spec, Mapping):
    raise ValueError(f"{where} must be a string or a mapping (side / feature / task -> prompt), got "
                     f"{type(spec).__name__}: {spec!r}")
  for key, value in spec.items():
    if not isinstance(key, str) or not key:
      raise ValueError(f"{where}: keys are sides ({', '.join(SIDES)}), task features or task names; got {key!r}")
    if isinstance(value, Mapping):
      for k, v in value.items():
        if not isinstance(k, str) or not k or not isinstance(v, str):
          raise ValueError(f"{where}[{key!r}]: a task's prompts map sides or features to strings; got "
                           f"{k!r}: {v!r}")
    elif not isinstance(value, str):
      raise ValueError(f"{where}[{key!r}] must be a string (or, for a task of a mixture, a mapping), got "
                       f"{type(value).__name__}: {value!r}")


def _level(entries: str | Mapping[str, str], features: Sequence[str], where: str) -> dict[str, str]:
  """{feature: prompt} of one level of the spec: a string for all features, sides, then features over them."""
  if isinstance(entries, str):
    return {f: entries for f in features}
  out = {}
  for side in SIDES:
    if side in entries:
      out.update({f: entries[side] for f in side_features(side, features)})
  for key, text in entries.items():
    if key in SIDES:
      continue
    if key not in features:
      raise ValueError(f"{where}: {key!r} is not a side ({', '.join(SIDES)}) or a token feature of the task "
                       f"({', '.join(features)}), nor a task of it")
    out[key] = text
  return out


def resolve(spec: Any, task_names: Sequence[str], features: Sequence[str], where: str = WHERE
            ) -> dict[str, dict[str, str]]:
  """{task: {token feature: prompt}} of a spec for the tasks of a task or mixture and their token features."""
  check_spec(spec, where)
  out = {name: {} for name in task_names}
  if spec is None or spec == "" or spec == {}:
    return out
  if isinstance(spec, str):
    return {name: {f: spec for f in features} for name in task_names}
  common = {k: v for k, v in spec.items() if k not in task_names}
  bad = [k for k, v in common.items() if isinstance(v, Mapping)]
  if bad:
    raise ValueError(f"{where}[{bad[0]!r}] is a mapping, which names a task, but {bad[0]!r} is not one of the tasks "
                     f"({', '.join(task_names)})")
  base = _level(common, features, where)
  for name in task_names:
    own = _level(spec[name], features, f"{where}[{name!r}]") if name in spec else {}
    out[name] = {f: t for f, t in {**base, **own}.items() if t}
  return out


def side_prompts(resolved: Mapping[str, Mapping[str, str]]) -> dict[str, str | None]:
  """{"query": prompt of `inputs`, "document": prompt of `targets`} when every task agrees ("" for none);
  None for a side whose tasks disagree."""
  out = {}
  for side, feature in (("query", "inputs"), ("document", "targets")):
    texts = {prompts.get(feature, "") for prompts in resolved.values()}
    out[side] = texts.pop() if len(texts) == 1 else None
  return out


# ----------------------------------------------------------------------------- the task step


class AddPrompts:
  """A seqio preprocessor: prepends each prompt to its (string) feature, before the tokenize step."""

  def __init__(self, prompts: Mapping[str, str]):
    self.prompts = dict(sorted(prompts.items()))

  def __call__(self, dataset):
    import tensorflow as tf  # pylint: disable=g-import-not-at-top

    prompts = self.prompts

    def add(ex):
      ex = dict(ex)
      for key, text in prompts.items():
        ex[key] = tf.strings.join([tf.constant(text), ex[key]])
      return ex

    return dataset.map(add, num_parallel_calls=tf.data.AUTOTUNE)

  def __repr__(self):
    return f"AddPrompts({self.prompts!r})"


def _is_tokenize(step) -> bool:
  import seqio  # pylint: disable=g-import-not-at-top
  fn = getattr(step, "func", step)
  return fn in (seqio.preprocessors.tokenize, seqio.preprocessors.tokenize_and_append_eos)


def task_prompts(task) -> dict[str, str]:
  """{feature: prompt} of a task's AddPrompts step ({} without one)."""
  for step in task.preprocessors:
    if isinstance(step, AddPrompts):
      return dict(step.prompts)
  return {}


def with_prompts(task, prompts: Mapping[str, str]):
  """The task with an AddPrompts step before its tokenize step (the task itself when `prompts` is empty).

  Same name, source, features and shuffle buffer; not registered (the registry keeps the task without).
  """
  prompts = {k: v for k, v in prompts.items() if v}
  if not prompts:
    return task
  import seqio  # pylint: disable=g-import-not-at-top
  steps = list(task.preprocessors)
  if task_prompts(task):
    raise ValueError(f"Task {task.name} has prompts already ({task_prompts(task)}); {WHERE} would add {prompts}")
  where = next((i for i, step in enumerate(steps) if _is_tokenize(step)), None)
  if where is None:
    raise ValueError(f"{WHERE}: task {task.name} has no seqio.preprocessors.tokenize step to prepend prompts "
                     f"before (its preprocessors: {steps})")
  steps.insert(where, AddPrompts(prompts))
  return seqio.Task(task.name, source=task.source, output_features=task.output_features, preprocessors=steps,
                    postprocess_fn=task.postprocessor, shuffle_buffer_size=task.shuffle_buffer_size)


def apply(texts: Sequence[str], prompt: str) -> list[str]:
  """prompt + text for each text (the NumPy path and the cache writers)."""
  return [prompt + t for t in texts] if prompt else list(texts)
