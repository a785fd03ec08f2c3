"""Records the `t5` package's span corruption on fixed documents and seeds (t5_span_corruption.json).

tests/test_seed_encoder.py compares st5_jax/objectives/seed_encoder/span_corruption.py with these outputs.
t5 cannot be installed beside this project's pins (t5 0.9.4 requires seqio-nightly,
tfds-nightly and mesh-tensorflow, which install over seqio 0.0.20 and
tensorflow-datasets), so this script loads only `t5/data/preprocessors.py` from the
unpacked wheel; `babel`, which only its translation preprocessor uses, is stubbed.

    pip download t5==0.9.4 --no-deps -d /tmp/t5
    unzip -q /tmp/t5/t5-0.9.4-py2.py3-none-any.whl -d /tmp/t5/whl
    python tests/golden/make_t5_span_corruption.py --t5_dir /tmp/t5/whl --vocab ../shared/data/t5_spiece/spiece.model
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import pathlib
import re
import sys
import types

import numpy as np

OUT = pathlib.Path(__file__).with_name("t5_span_corruption.json")
# Lengths cover: empty (filtered), shorter than a segment, several segments, noise rounding edges.
DOC_LENGTHS = [1, 2, 3, 5, 9, 17, 30, 31, 64, 120, 7, 0, 12]
CASES = [dict(seed=seed, merge=merge, inputs_length=length)
         for seed in (0, 7) for merge in (True, False) for length in (16, 32)]


def documents() -> list[list[int]]:
  rng = np.random.default_rng(2021)
  return [rng.integers(3, 32000, size=n).tolist() for n in DOC_LENGTHS]


def run(span_corruption, vocabulary, docs, *, seed: int, merge: bool, inputs_length: int, **kw) -> list[dict]:
  """Outputs of a seqio-style `span_corruption(dataset, sequence_length=..., output_features=...)`."""
  import seqio
  import tensorflow as tf

  def gen():
    for d in docs:
      yield {"targets": np.asarray(d, np.int32)}

  ds = tf.data.Dataset.from_generator(gen, output_signature={"targets": tf.TensorSpec([None], tf.int32)})
  features = {"inputs": seqio.Feature(vocabulary), "targets": seqio.Feature(vocabulary)}
  with seqio.utils.map_seed_manager(seed):
    out = span_corruption(ds, sequence_length={"inputs": inputs_length, "targets": inputs_length},
                          output_features=features, merge_examples_to_reduce_padding=merge, **kw)
  return [{k: v.tolist() for k, v in sorted(ex.items())} for ex in out.as_numpy_iterator()]


def main(argv=None) -> int:
  parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
  parser.add_argument("--t5_dir", required=True, help="unpacked t5-0.9.4 wheel (holds t5/data/preprocessors.py)")
  parser.add_argument("--vocab", required=True, help="T5 spiece.model (only its size, 32000 + 100 extra ids, matters)")
  args = parser.parse_args(argv)

  import seqio

  sys.modules.setdefault("babel", types.ModuleType("babel"))
  path = pathlib.Path(args.t5_dir) / "t5" / "data" / "preprocessors.py"
  spec = importlib.util.spec_from_file_location("t5_reference_preprocessors", path)
  module = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(module)
  version = re.search(r"__version__ = '([^']+)'", (pathlib.Path(args.t5_dir) / "t5" / "version.py").read_text())[1]
  vocabulary = seqio.SentencePieceVocabulary(args.vocab, extra_ids=100)

  docs = documents()
  cases = [dict(case, examples=run(module.span_corruption, vocabulary, docs, **case)) for case in CASES]
  OUT.write_text(json.dumps({"t5_version": version, "vocab_size": vocabulary.vocab_size, "documents": docs,
                             "cases": cases}, separators=(",", ":")) + "\n")
  print(f"wrote {OUT} ({len(cases)} cases, t5 {version})")
  return 0


if __name__ == "__main__":
  sys.exit(main())
