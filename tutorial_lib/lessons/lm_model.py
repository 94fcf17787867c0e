"""train_lm.py's model: GPT-2's decoder (nanoGPT's shape), pre-norm, learned positions, an untied output head.

    from lm_model import GPT, GPTConfig
    model = GPT(GPTConfig(n_layers=6, d_model=384, n_heads=6))   # nanoGPT's small (Shakespeare) configuration

Each ``Block`` is one FSDP unit and one activation-checkpointing unit of ``train_lm.py``; ``GPT.checkpointing`` picks
the recomputation (``full``, or ``selective``: matmul and attention outputs kept). ``init_weights`` draws GPT-2's
initialisation on the model as it is, sharded or not, so every layout starts from the same weights. Only torch.
"""

import functools
import math
from dataclasses import dataclass

import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.utils.checkpoint import CheckpointPolicy, checkpoint, create_selective_checkpoint_contexts


@dataclass
class GPTConfig:
    vocab_size: int = 256
    block_size: int = 128
    n_layers: int = 2
    d_model: int = 128
    n_heads: int = 4
    dropout: float = 0.0
    bias: bool = False


class CausalSelfAttention(nn.Module):
    def __init__(self, cfg):
        super().__init__()
        self.n_heads, self.dropout = cfg.n_heads, cfg.dropout
        self.qkv = nn.Linear(cfg.d_model, 3 * cfg.d_model, bias=cfg.bias)
        self.proj = nn.Linear(cfg.d_model, cfg.d_model, bias=cfg.bias)
        self.resid_dropout = nn.Dropout(cfg.dropout)

    def forward(self, x):
        b, t, d = x.shape
        # One matmul for q, k and v, then (b, heads, t, head size) views of each, as nanoGPT: split + transpose, whose
        # backward is one cat (a permute of a (b, t, 3, heads, head size) view backs up through a stack and a strided
        # copy: 1% of a step on nanoGPT's small configuration on a CPU).
        q, k, v = (z.view(b, t, self.n_heads, d // self.n_heads).transpose(1, 2) for z in self.qkv(x).split(d, dim=2))
        # One fused kernel (flash / memory-efficient / math, whichever fits) with the causal mask built in.
        y = F.scaled_dot_product_attention(q, k, v, dropout_p=self.dropout if self.training else 0.0, is_causal=True)
        return self.resid_dropout(self.proj(y.transpose(1, 2).reshape(b, t, d)))


class MLP(nn.Module):
    def __init__(self, cfg):
        super().__init__()
        self.fc = nn.Linear(cfg.d_model, 4 * cfg.d_model, bias=cfg.bias)
        self.proj = nn.Linear(4 * cfg.d_model, cfg.d_model, bias=cfg.bias)
        self.dropout = nn.Dropout(cfg.dropout)

    def forward(self, x):
        return self.dropout(self.proj(F.gelu(self.fc(x))))


class Block(nn.Module):
    """Pre-norm: x + attn(norm(x)), then x + mlp(norm(x)). One FSDP unit and one checkpointing unit each."""

    def __init__(self, cfg):
        super().__init__()
        self.norm1 = nn.LayerNorm(cfg.d_model, bias=cfg.bias)
        self.attn = CausalSelfAttention(cfg)
        self.norm2 = nn.LayerNorm(cfg.d_model, bias=cfg.bias)
        self.mlp = MLP(cfg)

    def forward(self, x):
        x = x + self.attn(self.norm1(x))
        return x + self.mlp(self.norm2(x))


# Selective (op-level) activation checkpointing: keep the outputs of the expensive ops (matmuls, attention), recompute
# the cheap ones (norms, GELU, additions) in backward. torchtitan's "op" policy keeps a similar list.
SAVE_OPS = {torch.ops.aten.mm.default, torch.ops.aten.addmm.default, torch.ops.aten.bmm.default,
            *(getattr(torch.ops.aten, name).default for name in (
                "_scaled_dot_product_flash_attention", "_scaled_dot_product_efficient_attention",
                "_scaled_dot_product_flash_attention_for_cpu", "_scaled_dot_product_cudnn_attention")
              if hasattr(torch.ops.aten, name))}


def _selective_policy(ctx, op, *args, **kwargs):
    return CheckpointPolicy.MUST_SAVE if op in SAVE_OPS else CheckpointPolicy.PREFER_RECOMPUTE


class GPT(nn.Module):
    def __init__(self, cfg):
        super().__init__()
        self.cfg = cfg
        self.tok_emb = nn.Embedding(cfg.vocab_size, cfg.d_model)
        self.pos_emb = nn.Embedding(cfg.block_size, cfg.d_model)
        self.drop = nn.Dropout(cfg.dropout)
        self.blocks = nn.ModuleList(Block(cfg) for _ in range(cfg.n_layers))
        self.norm = nn.LayerNorm(cfg.d_model, bias=cfg.bias)
        self.head = nn.Linear(cfg.d_model, cfg.vocab_size, bias=False)  # untied: the root FSDP unit holds both
        self.checkpointing = "none"  # "full" or "selective": recompute each block's activations in backward

    def forward(self, idx):
        x = self.drop(self.tok_emb(idx) + self.pos_emb(torch.arange(idx.shape[1], device=idx.device)))
        for block in self.blocks:
            if self.checkpointing == "none":
                x = block(x)
            else:  # keep only the block's input (full) or its matmul/attention outputs (selective); recompute the rest
                context_fn = (functools.partial(create_selective_checkpoint_contexts, _selective_policy)
                              if self.checkpointing == "selective" else None)
                x = checkpoint(block, x, use_reentrant=False, **({"context_fn": context_fn} if context_fn else {}))
        return self.head(self.norm(x))

    @torch.no_grad()
    def generate(self, idx, n_tokens, generator, temperature=0.8, top_k=20):
        """``idx`` (1 x T token ids) continued by ``n_tokens`` tokens, each drawn with ``generator`` from the ``top_k``
        likeliest at ``temperature``, from the last ``block_size`` tokens (nanoGPT's ``generate``)."""
        for _ in range(n_tokens):
            logits = self(idx[:, -self.cfg.block_size:])[0, -1].float() / temperature
            top = torch.topk(logits, top_k)
            choice = torch.multinomial(F.softmax(top.values, dim=-1), 1, generator=generator)
            idx = torch.cat([idx, top.indices[choice].view(1, 1)], dim=1)
        return idx

    @torch.no_grad()
    def init_weights(self, seed):
        """GPT-2's initialisation, run on the model as it is (sharded or not), after ``to_empty``.

        Each parameter is drawn whole from one generator seeded with ``seed``, in a fixed order, and every rank keeps
        its own piece (its shard of a DTensor): the same weights whatever the layout or the number of ranks, at the
        cost of one whole parameter of temporary memory. (torchtitan draws on the shards with DTensor's random ops,
        which keep the shards distinct on CUDA only; the weights then depend on the layout.)
        """
        g = torch.Generator(device=self.head.weight.device).manual_seed(seed)
        for name, p in self.named_parameters():
            full = torch.empty(p.shape, dtype=p.dtype, device=p.device)  # a DTensor's shape is the global one
            if "norm" in name:
                full.fill_(1.0 if name.endswith("weight") else 0.0)
            elif name.endswith("bias"):
                full.zero_()
            else:  # residual projections scaled by 1/sqrt(2 * layers), as GPT-2
                std = 0.02 / math.sqrt(2 * self.cfg.n_layers) if name.endswith("proj.weight") else 0.02
                full.normal_(0.0, std, generator=g)
            copy_into(p, full)


def copy_into(param, full):
    """Copy a whole tensor into a parameter: into its local shard when it is a DTensor (FSDP, HSDP)."""
    if hasattr(param, "device_mesh"):
        from torch.distributed.tensor import distribute_tensor
        # src_data_rank=None: every rank has the whole tensor and cuts its own piece; nothing is sent.
        full = distribute_tensor(full, param.device_mesh, param.placements, src_data_rank=None)
    param.copy_(full)

