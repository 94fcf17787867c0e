"""Exercise 13.4, one solution of the open challenge: the same full fine-tune, its state sharded over the ranks with
FSDP2, as train_hf.py shards it: fully_shard makes each decoder layer, then the whole model, a unit; each rank holds
its shard of every parameter, of its gradient and of AdamW's two moments, so the state per rank is half the baseline's
on 2 ranks (the step counters, one 4-byte number per parameter tensor, stay whole). The update is the same: the
losses equal the baseline's up to rounding. Other solutions: ZeroRedundancyOptimizer (DDP, the state alone sharded),
or training fewer parameters (a decoder layer frozen; LoRA through peft, with the embedding, which is also the output
head, still trained): keep AdamW, and keep the loss falling as the full fine-tune's does.
"""
import argparse
import sysconfig
from pathlib import Path
import torch
import torch.distributed as dist
from torch.distributed.fsdp import FSDPModule, fully_shard
from transformers import AutoConfig, AutoModelForCausalLM
parser = argparse.ArgumentParser()
parser.add_argument("--seed", type=int, default=1)  # the model's weights and which sequences each rank trains on
args = parser.parse_args()
dist.init_process_group("gloo")
rank = dist.get_rank()
# train_hf.py's tiny Qwen2: the real config class, 2 decoder layers of width 64, a vocabulary of 256 bytes, the output
# head tied to the input embedding
config = AutoConfig.for_model("qwen2", hidden_size=64, intermediate_size=176, num_hidden_layers=2,
                              num_attention_heads=4, num_key_value_heads=2, vocab_size=256, tie_word_embeddings=True)
torch.manual_seed(args.seed)  # the weights to fine-tune: the same on every rank
model = AutoModelForCausalLM.from_config(config)
for layer in model.model.layers:
    fully_shard(layer)  # one unit per decoder layer: gathered just before it runs, its state 1/2 per rank
fully_shard(model)  # the root: the embedding (also the output head) and the final norm
for module in model.modules():  # torch 2.8's gloo reduce-scatter sums where it should average (pytorch#162338):
    if isinstance(module, FSDPModule):  # sum, then divide, right on every version (train_hf.py does the same)
        module.set_force_sum_reduction_for_comms(True)
optimizer = torch.optim.AdamW(model.parameters(), lr=3e-3)  # over the shards: the state is sharded too
text = (Path(sysconfig.get_paths()["stdlib"]) / "argparse.py").read_bytes()  # the corpus, as bytes
windows = torch.tensor(list(text[:len(text) // 65 * 65])).view(-1, 65)  # sequences of 64 tokens and their targets
order = torch.randperm(len(windows), generator=torch.Generator().manual_seed(args.seed))
rows = windows[order[2 * rank:2 * rank + 2]]  # this rank's 2 sequences, every step: the loss falls step by step
for step in range(1, 9):
    logits = model(input_ids=rows[:, :-1]).logits
    loss = torch.nn.functional.cross_entropy(logits.flatten(0, 1), rows[:, 1:].flatten())
    optimizer.zero_grad()
    loss.backward()
    optimizer.step()
    print(f"rank {rank} step {step}: loss {loss.item():.4f}")
dist.destroy_process_group()
