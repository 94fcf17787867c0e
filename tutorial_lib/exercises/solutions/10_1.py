# Exercise 10.1: copies between .grad and the buckets in one backward, gradient_as_bucket_view=True, zero_grad()
# with its default set_to_none=True, ddp_knobs.py at --n-layers 10.
# zero_grad() drops the views, so each backward makes a new .grad that DDP copies into its bucket once (then makes
# .grad a view again); nothing is copied back out.
param_tensors = 2 * (1 + 10 + 1)  # input layer, 10 hidden layers, head_a: a weight and a bias each
answer = param_tensors  # 24 copies, all into the buckets
