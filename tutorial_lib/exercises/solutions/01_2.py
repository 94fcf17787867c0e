# Exercise 01.2: the bytes of AdamW's state on each rank of ddp_train.py (default sizes: 64 -> 256 -> 256 -> 8).
# DDP replicates: every rank holds the whole optimizer state. AdamW keeps, per parameter tensor,
# exp_avg and exp_avg_sq (each the parameter's size, fp32: 4 bytes per element) and one step counter
# (a 0-d float32 tensor: 4 bytes).
n_params = (64 * 256 + 256) + (256 * 256 + 256) + (256 * 8 + 8)  # 84,488 parameters
n_tensors = 6  # three weights, three biases
answer = 2 * 4 * n_params + 4 * n_tensors  # 675,928 bytes, on every rank
