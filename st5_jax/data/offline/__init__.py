"""Offline data preparation: run once, before training, by `st5 data ...`; never imported by training.

  catalog         the public datasets: files, sha256, canonical URLs (`st5 data list`)
  download        getting those files from a local folder, a mirror or their URLs, verified
  prepare         `st5 data prepare`: raw files + prepared JSON-lines + MANIFEST.json
  tfds_builders   `st5 data prepare --tfds`: the prepared sets as TFDS datasets
  overlap_report  `st5 data overlap`: texts shared by training tasks and evaluation sets
  derive          how `prepare` rebuilds derived datasets from their sources (catalog recipes)
  cache_writer    `st5 data cache`: a task split's token cache, written in memory
  beam_cache      `st5 data cache --runner`: the same files written by an Apache Beam pipeline

What stays in st5_jax.data (the runtime pipeline), though preparation uses it too:

* builders.py (raw files -> examples) is shared. The prepared files are a cache, not a
  requirement: when a task's prepared JSON-lines are absent, its source
  (st5_jax.data.sources) runs the same builder from memory while the task is built, and
  the TFDS-catalogue, ConSERT and SEED-Encoder tasks call builders at load time as well.
  prepare.py writes with the same builders, so both paths give the same examples.
* cache.py is the token cache's format (manifest, shard names, record schema, errors) and
  its reader, which training uses (cache_stream.py); only the writers are here.
* overlap.py (normalisation, evaluation texts, `decontaminate`, `decontaminate_tf`) is
  shared: the public tasks are decontaminated when they are loaded, by sources.py and
  tfds_tasks.py. Only the report of `st5 data overlap`, which reads tasks through their
  sources, is here (overlap_report), so overlap.py imports no source and sources.py no
  report.

Modules here may import the runtime pipeline (prepare writes through its builders and
sources); nothing in the runtime pipeline imports this package. Every module is imported
on use only, so `st5 --help` imports none of them.
"""
