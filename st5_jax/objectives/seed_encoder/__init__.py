"""SEED-Encoder (Lu et al., 2021) pre-training on the Sentence-T5 stack.

  objective.py        the SeedEncoder objective: L_span + w * L_dec (gin `TrainConfig.objective = @SeedEncoder()`)
  weak_decoder.py     the weak decoder and the pre-training model that carries it beside the tower
  span_corruption.py  T5 span corruption as seqio preprocessors, keeping the uncorrupted segment
  tasks.py            its seqio tasks (st5_seed_qa_text, st5_seed_user_text, st5_seed_tfds_c4)
"""
