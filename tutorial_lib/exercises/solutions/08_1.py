# Exercise 08.1: the bytes each rank all-reduces per step, ddp_train.py at --input-dim 1024 --hidden-dim 1024.
# DDP all-reduces every parameter's gradient once per step, whatever the batch size; fp32: 4 bytes per element.
n_params = (1024 * 1024 + 1024) + (1024 * 1024 + 1024) + (1024 * 8 + 8)  # 2,107,400 parameters
answer = 4 * n_params  # 8,429,600 bytes per rank per step
