# Exercise 05.2: checkpoint_train.py with --save-every 4 --max-steps 20, rank 1 killed in the middle of the step-12 save,
# torchrun --max-restarts 1, --resume latest.
# Attempt 0 trains steps 1..12 and dies while saving step 12: step-4/ and step-8/ are complete (checkpoint.json),
# .tmp-step-12/ is not and is ignored. Attempt 1 loads step-8/ and trains steps 9..20: 12 steps.
attempt_0 = 12
attempt_1 = 20 - 8
answer = attempt_0 + attempt_1  # 24 optimizer steps on every rank; steps 9..12 ran twice
