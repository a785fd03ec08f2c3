"""The contamination check (st5_jax.data.offline.contamination) as an Apache Beam pipeline: the same report, at any size.

    units ─► texts ─► (normalised, text) ─► distinct (smallest text) ─┬─► exact join with the test texts ───┐
    (a file, a          (read in parallel: a task's                    │   (by normalised text)               ├─► best per
     shard, a chunk)     files or byte ranges, JSON                    └─► LSH bands ─► join with the test     │   test text
                         lines, cache shards decoded)                      texts' bands (band -> ids) ─►       │   ─► counts and
                                                                           candidates, each pair once ─►       │   examples per
                                                                           exact Jaccard >= threshold ─────────┘   set and side

Training signatures are computed by the workers (a MinHash per distinct text); a band is (band number,
its rows' hash values), the LSH buckets are the groups of a CoGroupByKey of training and test bands,
and a candidate pair found in several bands is verified once. The test texts travel as files (chunks of
`CHUNK` items, written beside the pipeline's other side files and removed at the end), so the job graph
holds neither them nor the vocabulary. The bands and rows are the in-memory path's (datasketch's
MinHashLSH for the same settings), candidates are verified by the same exact Jaccard, and the best match
per test text, the counts and the examples use the same functions, so the report equals `contamination.check`'s
(tests/test_contamination.py). A bad input (a corrupt JSON line, a damaged cache shard) is reported as
the in-memory path reports it: the first one in input order, after the run.
"""

from __future__ import annotations

import contextlib
import logging
import pickle
import tempfile
import time
import uuid
from typing import Any, Callable, Sequence

from st5_jax import paths
from st5_jax.data.offline import contamination as lib
from st5_jax.data.overlap import normalize

log = logging.getLogger("st5_jax.data")

CHUNK = 50_000  # test texts per side file
_MODELS = "_vocabularies.pickle"
_RESULT = "_result.pickle"


def _import_beam():
  try:
    import apache_beam as beam  # pylint: disable=g-import-not-at-top
  except ImportError as e:
    raise lib.ContaminationError("Apache Beam is not installed: `pip install 'st5_jax[beam]'` (or drop --runner to "
                                 "check in memory).") from e
  return beam


def _bad_input_errors() -> tuple[type, ...]:
  """What reading a unit raises for bad input (reported as the in-memory path raises it)."""
  from st5_jax.data import cache  # pylint: disable=g-import-not-at-top
  from st5_jax.errors import BadRowError, InputFileError  # pylint: disable=g-import-not-at-top
  return (lib.ContaminationError, cache.CacheError, BadRowError, InputFileError)


def build_pipeline(p, plan: lib.TrainingPlan, items: Sequence[lib.Item], settings: lib.Settings, *,
                   work_dir: str) -> Callable[[], None]:
  """Adds the check to pipeline `p` and writes its side files under `work_dir`; returns the cleanup of those."""
  beam = _import_beam()
  models_file = paths.join(work_dir, _MODELS)
  result_file = paths.join(work_dir, _RESULT)
  paths.write_bytes(models_file, pickle.dumps(plan.models, protocol=5))
  chunk_files = []
  for start in range(0, max(len(items), 1), CHUNK):
    chunk_files.append(paths.join(work_dir, f"_test_items-{len(chunk_files):05d}.pickle"))
    paths.write_bytes(chunk_files[-1], pickle.dumps(list(items[start:start + CHUNK]), protocol=5))
  threshold, k, num_perm, show = settings.near_threshold, settings.shingle, settings.num_perm, settings.show
  hashranges = list(settings.lsh().hashranges)
  bad_errors = _bad_input_errors()

  class ReadTexts(beam.DoFn):
    def setup(self):
      self._sp = lib.processors(pickle.loads(paths.read_bytes(models_file)))

    def process(self, unit):
      try:
        for text in lib.unit_texts(unit, self._sp):
          n = normalize(text)
          if n:
            yield n, text
      except bad_errors as e:  # the in-memory path raises the first of these; here it is kept to say so after
        yield beam.pvalue.TaggedOutput("bad", (unit.index, str(e)))

  class Bands(beam.DoFn):
    """(band, value) per LSH band of a text's MinHash signature."""

    def setup(self):
      self._signer = lib.Signer(num_perm)

    def process(self, element, *, test: bool):
      if test:  # an Item: each of its variants
        for n in element.variants:
          for band in lib.band_keys(self._signer.sign(lib.shingles(n, k)), hashranges):
            yield band, (element.index, n)
      else:  # (normalised, text)
        for band in lib.band_keys(self._signer.sign(lib.shingles(element[0], k)), hashranges):
          yield band, element

  def load_chunk(path):
    yield from pickle.loads(paths.read_bytes(path))

  def exact_hits(kv):
    _, groups = kv
    texts = list(groups["train"])
    if texts:
      for index in set(groups["test"]):
        yield index, (0, -1.0, min(texts))

  def candidates(kv):
    _, groups = kv
    tests = list(groups["test"])
    if tests:
      for n, text in groups["train"]:
        for index, variant in tests:
          if variant != n:  # an exact match is the exact join's
            yield (index, variant, n), text

  def verify(kv):
    (index, variant, n), text = kv
    j = lib.jaccard(lib.shingles(n, k), lib.shingles(variant, k))
    if j >= threshold:
      yield index, (1, -j, text)

  def entries(kv):
    _, groups = kv
    best, item = list(groups["best"]), list(groups["item"])
    if best:
      for group, key, example in lib.side_entries(item[0], best[0]):
        yield group, (key, example)

  def write_result(_, texts, distinct, counts, examples, bad):
    result = {"texts": texts, "distinct": distinct, "counts": dict(counts), "examples": dict(examples),
              "bad": sorted(bad)}
    paths.write_bytes(result_file, pickle.dumps(result, protocol=5))

  units = p | "Units" >> beam.Create(plan.units, reshuffle=False) | "Spread" >> beam.Reshuffle()
  read = units | "Read" >> beam.ParDo(ReadTexts()).with_outputs("bad", main="texts")
  distinct = read.texts | "Distinct" >> beam.CombinePerKey(min)  # the smallest original of each normalised text
  items_pc = (p | "TestChunks" >> beam.Create(chunk_files) | "Spread test" >> beam.Reshuffle()
              | "TestItems" >> beam.FlatMap(load_chunk))
  test_exact = items_pc | "TestTexts" >> beam.FlatMap(lambda it: [(n, it.index) for n in it.variants])
  exact = ({"train": distinct, "test": test_exact} | "ExactJoin" >> beam.CoGroupByKey()
           | "ExactHits" >> beam.FlatMap(exact_hits))
  train_bands = distinct | "TrainBands" >> beam.ParDo(Bands(), test=False)
  test_bands = items_pc | "TestBands" >> beam.ParDo(Bands(), test=True)
  near = ({"train": train_bands, "test": test_bands} | "BandJoin" >> beam.CoGroupByKey()
          | "Candidates" >> beam.FlatMap(candidates) | "OncePerPair" >> beam.CombinePerKey(min)
          | "Verify" >> beam.FlatMap(verify))
  best = (exact, near) | "Matches" >> beam.Flatten() | "Best" >> beam.CombinePerKey(min)  # lib.best_of over all
  keyed_items = items_pc | "ByIndex" >> beam.Map(lambda it: (it.index, it))
  found = {"best": best, "item": keyed_items} | "ItemJoin" >> beam.CoGroupByKey() | "Entries" >> beam.FlatMap(entries)
  counts = found | "Ones" >> beam.Map(lambda e: (e[0], 1)) | "Count" >> beam.CombinePerKey(sum)
  if show:
    examples = found | "Examples" >> beam.combiners.Top.SmallestPerKey(show, key=lambda e: e[0])
  else:
    examples = p | "NoExamples" >> beam.Create([])
  n_texts = read.texts | "CountTexts" >> beam.combiners.Count.Globally()
  n_distinct = distinct | "CountDistinct" >> beam.combiners.Count.Globally()
  _ = (p | "Once" >> beam.Create([None])
       | "Result" >> beam.Map(write_result, texts=beam.pvalue.AsSingleton(n_texts),
                              distinct=beam.pvalue.AsSingleton(n_distinct), counts=beam.pvalue.AsList(counts),
                              examples=beam.pvalue.AsList(examples), bad=beam.pvalue.AsList(read.bad)))

  def cleanup():
    for path in [models_file, result_file, *chunk_files]:
      if paths.exists(path):
        paths.path(path).unlink()

  return cleanup


def _work_dir(pipeline_args: Sequence[str]) -> tuple[str, bool]:
  """Where the side files go: under the pipeline's --temp_location (a remote runner's workers read it), else a
  local temporary folder. (folder, whether it is ours to remove)."""
  from apache_beam.options.pipeline_options import GoogleCloudOptions, PipelineOptions  # pylint: disable=g-import-not-at-top
  temp = PipelineOptions(list(pipeline_args)).view_as(GoogleCloudOptions).temp_location
  if temp:
    return paths.join(temp, f"st5_contamination-{uuid.uuid4().hex[:12]}"), False
  return tempfile.mkdtemp(prefix="st5_contamination_"), True


def check_beam(plan: lib.TrainingPlan, test_sets: Sequence[lib.TestSet], settings: lib.Settings, *,
               missing: Sequence[str] = (), pipeline_args: Sequence[str] = ("--runner=DirectRunner",),
               progress: Callable[[str], None] | None = None) -> dict[str, Any]:
  """`contamination.check`'s report, computed by a Beam pipeline (options: Beam's flags, e.g. --runner)."""
  beam = _import_beam()
  from apache_beam.options.pipeline_options import PipelineOptions  # pylint: disable=g-import-not-at-top
  settings.check()
  items = [item for t in test_sets for item in t.items]
  work_dir, local = _work_dir(pipeline_args)
  paths.mkdir(work_dir)
  start = time.perf_counter()
  try:
    p = beam.Pipeline(options=PipelineOptions(list(pipeline_args)))
    cleanup = build_pipeline(p, plan, items, settings, work_dir=work_dir)
    with contextlib.ExitStack() as stack:
      stack.callback(cleanup)
      p.run().wait_until_finish()
      result = pickle.loads(paths.read_bytes(paths.join(work_dir, _RESULT)))
  finally:
    if local:
      paths.remove_tree(work_dir)
  if result["bad"]:
    raise lib.ContaminationError(result["bad"][0][1])
  if progress:
    progress(f"{result['texts']} training texts, {result['distinct']} distinct; {len(items)} test texts "
             f"(Beam, {time.perf_counter() - start:.1f} s)")
  groups = {g: (n, [e for _, e in sorted(result["examples"].get(g, []), key=lambda x: x[0])])
            for g, n in result["counts"].items()}
  training = {"sources": plan.sources, "texts": result["texts"], "distinct_texts": result["distinct"]}
  return lib.assemble(test_sets, groups, settings=settings, training=training, missing=missing)
