# Exercise 09.1: all-gathers per optimizer step, fsdp_knobs.py at --n-layers 5, K = 4 micro-batches, the default
# reshard_after_forward, set_requires_gradient_sync(False) until the last micro-batch.
units = 5 + 1  # one unit per block, and the root (input layer and head)
per_micro_batch = 2 * units - 1  # forward and backward each gather every unit, but the root stays gathered between
answer = 4 * per_micro_batch  # 44: gradient sync skips reduce-scatters, never the all-gathers
