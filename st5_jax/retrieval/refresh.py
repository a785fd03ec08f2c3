"""ANCE-style hard negatives refreshed from the model in training: a caller's hook of st5_jax/train.py.

    refresh = NegativesRefresh(every=1000, num_negatives=3, pairs_task="st5_stage1_public_qa", mined_per_query=7)
    train.train(..., make_iterator=data, hooks=[refresh.hook(data)])        # data: the run's DataConfig
    # gin: run.negatives_refresh = @NegativesRefresh()                       (gin/ance_tiny_cpu.gin)

Generation 0 is the run's own data: a task with K negatives per example, typically BM25 negatives written by
`st5 data mine` (ANCE and SEED-Encoder start from BM25 negatives too). Every `every` steps but the last, the hook
(mode="sync", the default), on every process:

  1. encodes the corpus with the objective's document tower and the queries with its query tower, with the
     current parameters, through the trainer's sharded encoder (st5_jax.evaluation.in_training.ShardedEncoder:
     the run's parameter shardings; every process encodes the same texts and gets the same embeddings);
  2. retrieves each query's `range_max` best documents by exact search on its devices
     (st5_jax.retrieval.search.exact_search) and keeps `mined_per_query` of them through `st5 data mine`'s
     false-negative filters and sampling (st5_jax.data.offline.mine.mine_rows: one owner of the selection);
  3. the lead writes them to WORKDIR/negatives/gen-{g:05d}.jsonl (`{query, pos, neg}` lines, atomic), every
     process waits at a barrier and reads that file back (so all train on the lead's bytes);
  4. switches the stream to a task over that file (register_hard_negatives_task: K of a row's negatives drawn
     per example, as for any mined file), made by the run's DataConfig with only its task replaced, from the
     start of the file; then the lead writes gen-{g:05d}.json: counts, settings and the seconds of each phase.

Resuming. The hook's state rides in every checkpoint ({"generation", "step", "file", "sha256"}), and the
stream's data state names the generation's task (`negatives_refresh_gen00003`): a data position restores only
onto the generation it was saved from. A resumed run rebuilds generation g's stream from its file (its sha256
checked; never mined again) before the trainer sets the data position. A run killed after writing generation g
but before a checkpoint recorded it mines g again on its rerun from the same parameters, so the rerun ends
bit-identical to an uninterrupted run (tests/test_ance_refresh.py, one and two processes).

mode="checkpoint" (ANCE's asynchronous refresh: negatives from a recent checkpoint while training goes on): the
hook mines nothing. Another process mines from the work dir's latest checkpoint into a generation folder:

    st5 data mine --method dense --model WORKDIR --checkpoint latest --pairs_task st5_stage1_public_qa \\
      --num_negatives 7 --out WORKDIR/negatives/gen-00001           # then gen-00002, ... as checkpoints come

(its manifest.json, written last, marks the generation finished), and at each refresh step the hook switches to
the newest finished generation newer than the one it reads: the lead looks, every process follows its choice.
Such a run resumes exactly (the state names the generation and its manifest's identity), but which generation a
step reads depends on when the miner finished, so two such runs agree only if their generations appeared at
the same steps, as in ANCE.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import logging
import re
import time
from typing import Any, Sequence

import numpy as np
from jax.experimental import multihost_utils

from st5_jax import encode_options, hooks, multihost, paths, train
from st5_jax import vocab as vocab_lib
from st5_jax.data import registry
from st5_jax.evaluation import in_training
from st5_jax.features import negative_features
from st5_jax.retrieval import search

log = logging.getLogger(__name__)


def _mine_lib():
  """st5_jax.data.offline.mine, imported when a refresh runs: `st5 train` without one imports no offline module
  (gin registers this class at every start; tests/test_imports.py)."""
  from st5_jax.data.offline import mine  # pylint: disable=g-import-not-at-top

  return mine

MODES = ("sync", "checkpoint")
FOLDER = "negatives"  # under the work dir
_FINISHED_GENERATION = re.compile(r"gen-(\d{5,})$")


@dataclasses.dataclass(frozen=True)
class NegativesRefresh:
  """Every `every` steps, K hard negatives per query mined again with the parameters in training (module doc).

  num_negatives: K drawn per example at each step (= the run's data's K and Contrastive.num_negatives).
  pairs_task / pairs_files: the (query, positive) pairs mined for (one of them): a registered pair task's
    `pairs_split`, or files as `st5 data mine --pairs` reads them (a `{query, pos, neg}` file's neg is ignored).
  corpus_files: the candidate documents as `st5 index` reads them; default: the pairs' distinct positives.
  mined_per_query: negatives kept per query in a generation's file (default K); K of them are drawn per step.
  range_min, range_max (the search depth), margin, relative_margin, keep_equal_to_positive, sampling, seed:
    st5_jax.data.offline.mine.MineConfig's filters and sampling; seed also seeds the per-example draw.
  batch_size: texts per encoder batch (over the whole mesh).
  mode: "sync" (mine in the hook) or "checkpoint" (pick up generations another process mined).
  name: the hook's key in the checkpoint and the generations' task prefix.
  """

  every: int
  num_negatives: int
  pairs_task: str | None = None
  pairs_split: str = "train"
  pairs_files: str | Sequence[str] | None = None
  corpus_files: str | Sequence[str] | None = None
  mined_per_query: int | None = None
  range_min: int = 0
  range_max: int = 100
  margin: float | None = None
  relative_margin: float | None = None
  keep_equal_to_positive: bool = False
  sampling: str = "top"
  seed: int = 0
  batch_size: int = 128
  mode: str = "sync"
  name: str = "negatives_refresh"

  def __post_init__(self):
    if self.every < 1:
      raise ValueError(f"NegativesRefresh.every must be >= 1 step, got {self.every}")
    negative_features(self.num_negatives)  # 1..MAX_NEGATIVES, else one line
    if self.mode not in MODES:
      raise ValueError(f"NegativesRefresh.mode must be one of {', '.join(MODES)}, got {self.mode!r}")
    if not re.fullmatch(r"[A-Za-z_]\w*", self.name):
      raise ValueError(f"NegativesRefresh.name must be a Python identifier (it names tasks), got {self.name!r}")
    if self.batch_size < 1:
      raise ValueError(f"NegativesRefresh.batch_size must be >= 1, got {self.batch_size}")
    if self.mode == "sync":
      if (self.pairs_task is None) == (self.pairs_files is None):
        raise ValueError("NegativesRefresh needs the pairs to mine for: bind pairs_task (a registered pair task) or "
                         "pairs_files (JSON lines {query, pos}, TSV, CSV), one of them")
      self.mine_config().check()

  def mine_config(self):  # -> st5_jax.data.offline.mine.MineConfig
    return _mine_lib().MineConfig(method="dense", num_negatives=self.mined_per_query or self.num_negatives,
                               range_min=self.range_min, range_max=self.range_max, margin=self.margin,
                               relative_margin=self.relative_margin, keep_equal_to_positive=self.keep_equal_to_positive,
                               sampling=self.sampling, seed=self.seed)

  def hook(self, data: train.DataConfig) -> hooks.Hook:
    """The trainer's hook; `data` is the run's DataConfig (generation 0, and the template of the others)."""
    return Refresher(self, data).hook()


class _Scorer:
  """mine_rows' scorer on the run's parameters: queries by the query tower, exact search over the corpus
  embeddings, a positive's score from its corpus embedding (or the document tower's, outside the corpus)."""

  def __init__(self, encode_queries, encode_documents, corpus_texts: Sequence[str], d_NxD: np.ndarray):
    self.encode_queries, self.encode_documents, self.d_NxD = encode_queries, encode_documents, d_NxD
    self.where = {t: i for i, t in reversed(list(enumerate(corpus_texts)))}  # a text's first index
    self.seconds = {"encode_queries": 0.0, "search": 0.0}

  def shard(self, queries, positives, depth):
    start = time.perf_counter()
    q_QxD = self.encode_queries(list(queries))
    outside = list(dict.fromkeys(p for pos in positives for p in pos if p not in self.where))
    other = dict(zip(outside, self.encode_documents(outside))) if outside else {}
    self.seconds["encode_queries"] += time.perf_counter() - start
    start = time.perf_counter()
    scores_QxR, indices_QxR = search.exact_search(q_QxD, self.d_NxD, depth)
    self.seconds["search"] += time.perf_counter() - start
    out = []
    for q, pos in enumerate(positives):
      p_PxD = np.stack([self.d_NxD[self.where[p]] if p in self.where else other[p] for p in pos])
      out.append((indices_QxR[q], scores_QxR[q], (p_PxD @ q_QxD[q]).astype(np.float32)))
    return out


def _sha256(data: bytes) -> str:
  return hashlib.sha256(data).hexdigest()


class Refresher:
  """The hook's state and work: the generation the stream reads, and how to make or find the next one."""

  def __init__(self, config: NegativesRefresh, data: train.DataConfig):
    if not isinstance(data, train.DataConfig):
      raise TypeError(f"NegativesRefresh makes each generation's stream with the run's DataConfig (run.data = "
                       f"@DataConfig()), got {type(data).__name__}")
    self.config, self.data = config, _side_prompts_only(data)
    self.state: dict[str, Any] = {"generation": 0}
    self.costs: list[dict[str, Any]] = []  # the seconds of each refresh of this invocation, by phase
    self.context: hooks.RunContext | None = None
    self.restored: dict[str, Any] | None = None  # the state a resumed run started from
    self.pairs = self.corpus = None
    self._queries = self._documents = None
    self._features: set[str] | None = None  # the batch features of generation 0

  @property
  def generation(self) -> int:
    return int(self.state["generation"])

  def hook(self) -> hooks.Hook:
    return hooks.Hook(self.refresh, every=self.config.every, name=self.config.name, state_dict=self.state_dict,
                      load_state_dict=self.load_state_dict, start=self.start)

  # ----------------------------------------------------------------------------------------------- the hook

  def start(self, context: hooks.RunContext) -> None:
    """Once per invocation: the pairs, the corpus and the encoders (sync), generation 0's batch features."""
    self.context = context
    self._features = set(getattr(context.stream.iterator, "element_spec", None) or ()) or None
    if self.config.mode != "sync":
      return
    c = self.config
    self.pairs = (_mine_lib().task_pairs(c.pairs_task, c.pairs_split) if c.pairs_task is not None
                  else _mine_lib().read_pairs(c.pairs_files))
    self.corpus = (_mine_lib().files_corpus(c.corpus_files) if c.corpus_files is not None
                   else _mine_lib().positives_corpus(self.pairs))
    towers = context.setup.objective.inference_towers(context.model_config)
    tokenizer = vocab_lib.Tokenizer(context.vocab_file)

    def encoder(side: str):
      encode, keys = train.tower_encode(context.setup, context.model_config, side, context.rules)
      sharded = in_training.ShardedEncoder(encode, param_keys=keys, max_length=context.model_config.max_length,
                                           mesh=context.setup.mesh,
                                           param_shardings=context.setup.state_shardings.params,
                                           tokenizer=tokenizer, batch_size=c.batch_size)
      # Mined with the model's prompts (the trained ones: DataConfig.prompts), as encode_query / _document.
      prompt = encode_options.side_prompt(context.model_config.prompt_dict, side)
      return sharded if not prompt else lambda params, texts: sharded(params, [prompt + t for t in texts])

    self._queries = encoder("query")  # one compile per length bucket for the run, as the dev evaluation's
    same = towers["query"] is towers["document"] and encode_options.side_prompt(
        context.model_config.prompt_dict, "query") == encode_options.side_prompt(context.model_config.prompt_dict,
                                                                                   "document")
    self._documents = self._queries if same else encoder("document")
    log.info("negatives refresh every %d steps: %d queries, a corpus of %d documents", c.every,
             len(self.pairs.queries), len(self.corpus.texts))

  def refresh(self, info: hooks.StepInfo) -> None:
    if info.step >= self.context.num_train_steps:  # no step would read it
      return
    if self.config.mode == "sync":
      self.mine(info.state.params, info.step, info.stream)
    else:
      self.pick_up(info.step, info.stream)

  def state_dict(self) -> dict[str, Any]:
    return dict(self.state)

  def load_state_dict(self, state, stream: hooks.Stream) -> None:
    """On resume: generation g's stream again, from its file in the work dir (checked, never mined again)."""
    state = dict(state)
    self.restored = dict(state)
    g = int(state["generation"])
    if g:
      if state.get("mode", "sync") != self.config.mode:
        raise ValueError(f"the checkpoint's negatives came from mode={state.get('mode')!r}, this run's "
                         f"NegativesRefresh.mode is {self.config.mode!r}: resume with the same mode")
      if self.config.mode == "sync":
        path = self._path(f"gen-{g:05d}.jsonl")
        if not paths.exists(path) or _sha256(paths.read_bytes(path)) != state["sha256"]:
          raise ValueError(f"the checkpoint reads negatives generation {g} from {path}, which is "
                           f"{'changed' if paths.exists(path) else 'missing'}: restore that file, or train in a new "
                           "work dir")
      else:
        manifest = self._manifest(g)
        if manifest is None or manifest.get("identity") != state["identity"]:
          raise ValueError(f"the checkpoint reads negatives generation {g} from {self._path(f'gen-{g:05d}')}, whose "
                           "manifest.json is missing or of another mining run: restore it, or train in a new work dir")
      self._switch(stream, g, self._path(state["file"]))
    self.state = state

  # ------------------------------------------------------------------------------------------------- sync

  def mine(self, params: Any, step: int, stream: hooks.Stream) -> dict[str, Any]:
    """Generation g + 1 from `params`: encode, search, select, write, switch (module doc). Every process."""
    g = self.generation + 1
    seconds: dict[str, float] = {}
    t0 = time.perf_counter()
    d_NxD = self._documents(params, self.corpus.texts)
    seconds["encode_corpus"] = time.perf_counter() - t0
    scorer = _Scorer(lambda texts: self._queries(params, texts), lambda texts: self._documents(params, texts),
                     self.corpus.texts, d_NxD)
    t1 = time.perf_counter()
    rows, counts = _mine_lib().mine_rows(self.pairs, self.corpus, scorer, self.config.mine_config(), 0,
                                      len(self.pairs.queries))
    seconds.update(scorer.seconds, select=time.perf_counter() - t1 - sum(scorer.seconds.values()))
    t2 = time.perf_counter()
    name = f"gen-{g:05d}.jsonl"
    path = self._path(name)
    if multihost.is_lead():
      paths.write_bytes(path, "".join(json.dumps(r, ensure_ascii=False) + "\n" for r in rows).encode())
    multihost.barrier(f"{self.config.name}:gen-{g:05d}")
    sha256 = _sha256(paths.read_bytes(path))  # the lead's bytes, which every process trains on
    seconds["write"] = time.perf_counter() - t2
    t3 = time.perf_counter()
    self._switch(stream, g, path)
    seconds["switch"] = time.perf_counter() - t3
    seconds["total"] = time.perf_counter() - t0
    self.state = {"generation": g, "step": step, "mode": "sync", "file": name, "sha256": sha256}
    seconds = {k: round(v, 3) for k, v in seconds.items()}
    self.costs.append({"generation": g, "step": step, **seconds})
    if multihost.is_lead():
      c = self.config
      meta = {**self.state, "counts": counts, "settings": dataclasses.asdict(c.mine_config()),
              "num_negatives": c.num_negatives, "pairs": {"source": self.pairs.source,
                                                          "fingerprint": self.pairs.fingerprint},
              "corpus": {"source": self.corpus.source, "documents": len(self.corpus.texts),
                         "fingerprint": self.corpus.fingerprint}, "seconds": seconds}
      paths.write_text(self._path(f"gen-{g:05d}.json"), json.dumps(meta, indent=1, sort_keys=True) + "\n")
    log.info("step %d: negatives generation %d, %d negatives for %d queries (%d short) in %.1fs (%s)", step, g,
             counts["mined"], counts["queries"], counts["short"], seconds["total"],
             ", ".join(f"{k} {v:.2f}s" for k, v in seconds.items() if k != "total"))
    return self.costs[-1]

  # ------------------------------------------------------------------------------------------- checkpoint

  def _manifest(self, g: int) -> dict | None:
    path = self._path(f"gen-{g:05d}", _mine_lib().MANIFEST)
    try:
      return json.loads(paths.read_text(path))
    except (FileNotFoundError, ValueError):
      return None

  def newest_finished(self) -> int:
    """The largest g of WORKDIR/negatives/gen-{g:05d}/ holding a manifest.json (0: none)."""
    found = [0]
    for manifest in paths.glob(self._path("gen-*", _mine_lib().MANIFEST)):
      m = _FINISHED_GENERATION.match(paths.path(manifest).parent.name)
      if m:
        found.append(int(m.group(1)))
    return max(found)

  def pick_up(self, step: int, stream: hooks.Stream) -> None:
    """Switches to the newest generation another process finished, when newer; the lead decides for all."""
    newest = self.newest_finished() if multihost.is_lead() else 0
    newest = int(multihost_utils.broadcast_one_to_all(np.asarray(newest, np.int32)))
    if newest <= self.generation:
      return
    start = time.perf_counter()
    name = f"gen-{newest:05d}/part-*.jsonl"
    self._switch(stream, newest, self._path(name))
    self.state = {"generation": newest, "step": step, "mode": "checkpoint", "file": name,
                  "identity": self._manifest(newest)["identity"]}
    self.costs.append({"generation": newest, "step": step, "switch": round(time.perf_counter() - start, 3)})
    log.info("step %d: negatives generation %d (mined by another process from a checkpoint)", step, newest)

  # ------------------------------------------------------------------------------------------------ shared

  def _path(self, *parts: str) -> str:
    return paths.join(self.context.workdir, FOLDER, *parts)

  def _switch(self, stream: hooks.Stream, g: int, pattern: str) -> None:
    """The stream reads generation g (a task over `pattern`) from its start."""
    task = f"{self.config.name}_gen{g:05d}"
    registry.register_hard_negatives_task(task, file_pattern={self.data.split: pattern},
                                          num_negatives=self.config.num_negatives, seed=self.config.seed)
    iterator = dataclasses.replace(self.data, task=task, cache_dir=None)(stream.mesh, stream.global_batch_size,
                                                                         stream.seed)
    features = set(getattr(iterator, "element_spec", None) or ())
    if self._features is not None and features != self._features:
      iterator.close()
      raise ValueError(f"negatives generation {g} batches {sorted(features)}, the run's data "
                       f"{sorted(self._features)}: bind NegativesRefresh.num_negatives "
                       f"({self.config.num_negatives}) to the K of the run's data (and Contrastive.num_negatives)")
    old = stream.iterator
    stream.replace(iterator)
    if hasattr(old, "close"):
      old.close()  # its prefetching thread


def _side_prompts_only(data: train.DataConfig) -> train.DataConfig:
  """`data` with its prompts as {"query": ..., "document": ...}: each generation is a task of another name with K
  negatives (negative_targets_1, ...), which per-task or per-feature prompts would not name."""
  if not data.prompts:
    return data
  by_task = list(data.resolved_prompts().values())
  if any(p != by_task[0] for p in by_task):
    raise ValueError(f"NegativesRefresh trains every generation with one set of prompts; DataConfig.prompts gives "
                     f"the tasks of {data.task} different ones: give one per side ({{'query': ..., 'document': ...}})")
  features = by_task[0]
  query = features.get("inputs", "")
  document = features.get("targets", "")
  if any(text != document for name, text in features.items() if name.startswith("negative_targets")):
    raise ValueError("NegativesRefresh draws its own negatives: DataConfig.prompts must give them the targets' "
                     f"prompt ({document!r}); give one per side ({{'query': ..., 'document': ...}})")
  return dataclasses.replace(data, prompts={k: v for k, v in (("query", query), ("document", document)) if v})
