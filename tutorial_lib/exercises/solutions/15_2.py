# Exercise 15.2: ft_train.py as 4 replica groups, 32 samples per group per step; group 2 last committed step 500, died,
# and, started again, healed at step 560 (the step it joined at: its heal record's "step").
# Group 2's batch reached the weights up to step 500. From step 501 on, each commit averaged the other 3 groups only.
# At the heal it joined at step 560, and the step it heals in makes step 561: its own gradient, computed on the stale
# weights it had before the heal, is left out (participants 3). From step 562 on, all 4 groups train together.
# (A step in flight when it died fails for everyone, nobody commits it, and it is taken again without group 2: it adds
# no batch.)
first_without, healing_step = 501, 561
steps_without_group_2 = healing_step - first_without + 1  # 61 steps, one batch of group 2's share each
answer = steps_without_group_2 * 32  # 1952 samples never trained on
