# Exercise 10.2: bytes each rank all-reduces per step with fp16_compress_hook, ddp_knobs.py at its defaults.
# The hook casts every bucket to fp16 (2 bytes per element) before the all-reduce: the gradients once, in 16 bits.
n_params = 7 * (256 * 256 + 256) + (256 + 1)  # input layer + 6 hidden layers, and head_a
answer = 2 * n_params  # 921,602 bytes: half of fp32's
