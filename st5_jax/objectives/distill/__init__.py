"""Distillation: a student tower trained on a teacher's embeddings, computed once into a cache.

  objective.py   the Distill objective: embedding MSE / cosine and score MarginMSE / KL terms
                 (gin `TrainConfig.objective = @Distill()`)
  teacher.py     teachers: any model SentenceEncoder.load reads, or any sentence-transformers folder
  cache.py       the teacher cache (`st5 distill-cache`): decontaminated training texts, the teacher's
                 vectors in resumable parts, a manifest naming the teacher and the texts
  tasks.py       the seqio task that reads a cache: each example's texts and their teacher vectors
                 (gin `DataConfig.task = @st5_jax.objectives.distill.distill_task()`)

docs/architecture.md ("Distillation") walks through the commands and gin.
"""
