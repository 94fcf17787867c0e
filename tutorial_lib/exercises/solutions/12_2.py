# Exercise 12.2: micro-batches whose activations stage 1 holds at once under 1F1B (4 stages, 8 micro-batches).
# Section 4: 1F1B warms up stage s with p - s forwards, then alternates one backward and one forward, so the stage
# never holds more than p - s micro-batches (GPipe holds all m).
p, m, s = 4, 8, 1
answer = min(m, p - s)  # 3
