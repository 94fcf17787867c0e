import argparse
import sysconfig
from pathlib import Path
import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP
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
model = DDP(AutoModelForCausalLM.from_config(config))
optimizer = torch.optim.AdamW(model.parameters(), lr=3e-3)  # full fine-tuning: 2 fp32 moments per parameter
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
