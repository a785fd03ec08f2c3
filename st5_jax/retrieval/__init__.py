"""Dense retrieval: metrics, retrieval sets, run files, corpus indexes and search.

  metrics       trec_eval's MRR@k, nDCG@k, Recall@k, Precision@k, MAP@k and top-k accuracy on a
                run ({query id: {doc id: score}}), with trec_eval's tie order; `run_from_topk`
                turns a search's top-k arrays into a run. Pure Python and NumPy.
  beir          `load_beir`: a BEIR-format folder (corpus.jsonl, queries.jsonl, qrels/<split>.tsv),
                local or gs://, as a `RetrievalData`; `RetrievalDataError` for malformed input.
  runs          TREC run files and JSON lines (write and read), BEIR / TREC qrels.
  bm25          BM25 over a corpus in memory (the baseline row).
  index         an encoded corpus on disk: embedding shards, ids and a manifest (`st5 index`).
  search        exact search on the JAX devices (blocked matmul + top-k merge).
  ann           an approximate-nearest-neighbour index for corpora beyond device memory.
  corpus_files  reading corpus and query files for `st5 index` / `st5 search`.

Importing the package imports none of them (and no JAX): import the module you need.
"""
