# Exercise 07.1: exercise 2's script, launched on 2 ranks with a 3 s collective timeout.
# The doctor names rank 0 first: its barrier (line 9) timed out while it waited for rank 1. That is the victim.
# Its row "rank 1 was in  train.py:12 in <module>" is the culprit: rank 1 never reached a collective; it was
# polling for the file rank 0 writes only after that barrier (line 12: while not os.path.exists(vocab): ...).
rank = 1
line = 12
answer = (rank, line)
