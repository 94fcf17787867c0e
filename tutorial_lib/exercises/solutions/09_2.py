# Exercise 09.2: bytes rank 0 of 4 holds between forward and backward, the default reshard_after_forward,
# fsdp_knobs.py at --dim 64 --n-layers 3. The default: inner units reshard (1/N), the root stays gathered.
root = (64 * 64 + 64) + (64 * 8 + 8)  # inp and head: 4,680 parameters, held whole
block = (64 * 256 + 256) + (256 * 64 + 64)  # 33,088 parameters, each rank holds 1/4
answer = 4 * root + 4 * 3 * block // 4  # 18,720 + 99,264 = 117,984 bytes (fp32)
