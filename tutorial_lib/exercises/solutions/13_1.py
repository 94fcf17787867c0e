# Exercise 13.1: the layout for Qwen2.5-1.5B on 4 x 24 GB at 4096 tokens (section 3's stored plans).
# fp32 and bf16 do not fit at 4096 tokens (the activations); selective activation checkpointing does, and it is the
# full fine-tuning layout with the fewest memory savers that fits.
from tutorial_lib.planning.hf_plan import read_hf_table, recommend_layout  # tl.planning.recommend_layout

answer = recommend_layout(read_hf_table(), "qwen2.5-1.5b", gpus=4, seq_len=4096)["layout"]  # bf16 + AC selective
