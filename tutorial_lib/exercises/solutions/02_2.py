# Exercise 02.2: DistributedSampler over 100 samples on 7 ranks, drop_last=False (the default).
# It pads the index list (repeating its first indices) until it divides by the world size:
# every rank gets ceil(100 / 7) = 15 indices, 105 in all, so 5 of them repeat an index.
samples, ranks = 100, 7
per_rank = -(-samples // ranks)  # ceil: 15
answer = per_rank * ranks - samples  # 5 indices seen twice
