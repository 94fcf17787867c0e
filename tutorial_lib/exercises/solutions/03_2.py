# Exercise 03.2: fp16's largest finite value is 65504 (65536 and above round to inf).
# The scaler starts at 2**24 and halves after every step whose scaled gradients overflowed (that step is skipped).
# The largest gradient, 0.5, times the scale must stay <= 65504:
#   2**24 ... 2**17: 0.5 * 2**17 = 65536 > 65504, still inf: skipped (8 scales: 24, 23, ..., 17)
#   2**16: 0.5 * 2**16 = 32768 fits: the first step the optimizer takes.
answer = 24 - 17 + 1  # 8 skipped steps
