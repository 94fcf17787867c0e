# Exercise 11.1: the layout for the 1.3B GPT on 4 x 24 GB, with the fewest memory savers.
# Section 8's stored plans (one window of 1024 tokens per GPU, AdamW, 23.6 GiB usable per GPU):
from tutorial_lib.planning.memory_plan import read_memory_table  # tl.planning.read_memory_table in the notebook

table = read_memory_table()
rows = table[(table["model"] == "1.3B") & (table["gpus"] == 4)].set_index("layout")
# DDP fp32 does not fit (every GPU holds the whole model and its state); FSDP2 fp32 does, with headroom to spare.
order = ("DDP fp32", "FSDP2 fp32", "FSDP2 bf16", "FSDP2 bf16 + AC")  # each adds a memory saver
answer = next(layout for layout in order if rows.loc[layout, "fits"])
