# Exercise 04.2: fsdp_train.py --n-layers 6 --wrap fine: one FSDP unit per Linear, then the root.
# Each block has 4 Linear layers (qkv, proj, fc1, fc2); the head is a Linear; the root (embedding, positions,
# norm) is the last unit.
units = 4 * 6 + 1 + 1  # U = 26
# Every inner unit is all-gathered before its forward and again before its backward (it was freed after its
# forward); the root stays gathered from its forward to its backward: one all-gather.
answer = 2 * units - 1  # 51 all-gathers per step (and U = 26 reduce-scatters)
