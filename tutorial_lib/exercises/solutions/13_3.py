# Exercise 13.3: the fewest GPUs (of 1, 2, 4, 8, 16) on which Qwen2.5-7B fits for full fine-tuning at 1024 tokens with
# its state on the GPUs (no CPU offload). 16 bytes per parameter of state: 7.6 B x 16 / 8 GPUs is about 14 GiB each,
# which leaves half a GiB on 8, less than the root unit's 4 GiB collective buffer that the headroom counts.
from tutorial_lib.planning.hf_plan import read_hf_table  # tl.planning.read_hf_table in the notebook

table = read_hf_table()
on_gpu = ["fp32", "bf16", "bf16 + AC selective", "bf16 + AC full"]
rows = table[(table["model"] == "qwen2.5-7b") & (table["seq_len"] == 1024) & table["layout"].isin(on_gpu)
             & table["fits"]]
answer = int(rows["gpus"].min())  # 16 (two nodes of 8)
