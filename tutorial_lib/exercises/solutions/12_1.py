# Exercise 12.1: the fewest micro-batches m for which every stage of a 4-stage GPipe step idles at most 1/5 of it.
# Section 4: with equal forwards and backwards each stage idles (p - 1) / (m + p - 1) of the step.
p = 4
answer = next(m for m in range(1, 100) if (p - 1) * 5 <= (m + p - 1))  # 3 / (m + 3) <= 1/5: m = 12
