"""Fine-tune your own Hugging Face causal language model (Llama, Qwen2, ...) across GPUs with FSDP2.

Run card
    # 4 x RTX 4090D (24 GB, PCIe): real weights in a local folder (config.json, *.safetensors, the tokenizer files),
    # e.g. downloaded once with `hf download Qwen/Qwen2.5-1.5B --local-dir ~/models/Qwen2.5-1.5B`
    torchrun --nproc-per-node 4 train_hf.py --model ~/models/Qwen2.5-1.5B --ac-mode selective --seq-len 2048 \
        --batch-size 1 --max-steps 200 --save-every 50 --data my_corpus.txt --export ~/models/Qwen2.5-1.5B-tuned
    # a 7B base on the same cards: LoRA adapters on the frozen base (needs `pip install peft`)
    torchrun --nproc-per-node 4 train_hf.py --model ~/models/Qwen2.5-7B --ac-mode full --lora-rank 16
    # continue exactly where a run stopped (also on another number of GPUs)
    torchrun --nproc-per-node 4 train_hf.py --model ~/models/Qwen2.5-1.5B --resume latest
    # afterwards, any checkpoint as a Hugging Face folder (one process; the 7B's LoRA as a PEFT adapter folder)
    python train_hf.py --model ~/models/Qwen2.5-1.5B --export-from checkpoints/step-150 --export ~/models/tuned-150
    python train_hf.py --model ~/models/Qwen2.5-7B --export-from latest --export-adapter --export ~/adapters/7b-r16
    # CPU ranks, no download: a tiny model of the same architecture, written here once, then trained the same way
    python train_hf.py --create-tiny-model tiny-qwen2 --arch qwen2
    torchrun --nproc-per-node 2 train_hf.py --model tiny-qwen2 --max-steps 8 --save-every 4 --export tiny-tuned

What it shows
    * ``transformers`` builds the architecture from ``config.json`` on the ``meta`` device (shapes, no memory);
      ``fully_shard`` makes each decoder layer (the classes the model lists in ``_no_split_modules``) and then the
      root an FSDP2 unit; ``to_empty`` gives each rank storage for its own shards only (torchtitan's pattern);
    * what ``to_empty`` does not restore: buffers computed in ``__init__`` and not saved in checkpoints (the rotary
      embedding's ``inv_freq``) hold whatever the new memory held, and tied weights (the input embedding reused as
      the output head, Qwen2.5-0.5B/1.5B) can come apart: ``materialize`` restores both, and checks them;
    * the weights come from the folder's ``*.safetensors``: rank 0 reads them and ``set_model_state_dict``
      (``broadcast_from_rank0``) sends each whole tensor to every rank, which keeps its own shard;
    * bf16 through FSDP's ``MixedPrecisionPolicy`` (fp32 shards and optimizer state, gradients reduced in fp32),
      activation checkpointing through the model's own ``gradient_checkpointing_enable`` (``full``, or
      ``selective``: matmul and attention outputs kept), FSDP's ``CPUOffloadPolicy`` (``--cpu-offload``: shards,
      gradients and the optimizer step on the CPU; the process group is then ``cuda:nccl,cpu:gloo``), LoRA adapters on a frozen base (``--lora-rank``, peft);
    * ``--export FOLDER``: the trained model written back as a Hugging Face folder (in config.json's dtype, sharded
      with an index, the tokenizer files beside it; LoRA merged, or a PEFT adapter folder with --export-adapter), for
      ``from_pretrained``, for inference servers, or as the next run's ``--model``; ``--export-from`` does it
      afterwards from any DCP checkpoint, in one process. Never the whole model in one process's memory: on torch
      2.13 DCP's ``HuggingFaceStorageWriter`` writes every rank's rows and consolidates them into whole files; where
      it cannot (torch 2.8), the tensors are gathered one at a time and written one file at a time;
    * DCP checkpoints of every rank's shards and an exact resume: the data position is global (windows consumed
      by all ranks), so a resume on another number of ranks reads each window once; there is no randomness in
      training (no dropout, a seeded data order), so no random state needs saving.

The data: ``--data FILE`` (text), else the Python standard library's source (on every machine, no download),
tokenised by the folder's tokenizer when it has one, else as bytes (the tiny models' vocabulary is 256).

It needs torch and transformers (and peft for ``--lora-rank``), so the file can be copied to a cluster as is. In a
workbook run, ``_workbook.py`` beside it adds what the notebooks measure (per-step JSON lines in
``<metrics-dir>/rank<RANK>.jsonl``, ``--track-memory``), each reached from a line marked ``# workbook``.
"""

import argparse
import contextlib
import json
import inspect
import math
import os
import shutil
import sys
import sysconfig
import time
import warnings
from datetime import timedelta
from pathlib import Path

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
import torch.nn.functional as F
from torch.distributed.checkpoint.state_dict import (StateDictOptions, get_model_state_dict, get_state_dict,
                                                     set_model_state_dict, set_state_dict)
from torch.distributed.checkpoint.stateful import Stateful
from torch.distributed.elastic.multiprocessing.errors import record
from torch.utils.checkpoint import CheckpointPolicy, create_selective_checkpoint_contexts

try:  # the workbook's instruments (metrics, --track-memory), written beside this file in a workbook run
    import _workbook as workbook
except ImportError:  # a copy alone trains without them
    workbook = None

# Architectures this script was checked with (config.json's "model_type"); others of the same family (a decoder-only
# transformers model with rotary embeddings) usually work: add them here after a small run.
ARCHITECTURES = ("llama", "qwen2", "qwen3", "mistral")
# The tiny models --create-tiny-model writes: the same config classes as the real ones, small dimensions.
TINY = {"hidden_size": 64, "intermediate_size": 176, "num_hidden_layers": 2, "num_attention_heads": 4,
        "num_key_value_heads": 2, "vocab_size": 256, "max_position_embeddings": 512}
TINY_TIED = {"qwen2": True, "llama": False}  # like Qwen2.5-0.5B/1.5B (tied) and Llama-3.1-8B (untied)
# Pure-Python standard-library modules present from Python 3.10 on: the default corpus.
CORPUS_FILES = ("argparse.py", "ast.py", "calendar.py", "collections/__init__.py", "dataclasses.py", "difflib.py",
                "enum.py", "fractions.py", "functools.py", "inspect.py", "json/decoder.py", "logging/__init__.py",
                "pathlib.py", "statistics.py", "string.py", "textwrap.py", "typing.py")
LORA_TARGETS = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--model", type=str, default="",
                   help="a folder with config.json and *.safetensors (and optionally the tokenizer's files)")
    p.add_argument("--create-tiny-model", type=str, default="",
                   help="write a tiny model of --arch (config.json + model.safetensors) into this folder, then stop")
    p.add_argument("--arch", choices=sorted(TINY_TIED), default="qwen2", help="--create-tiny-model's architecture")
    p.add_argument("--data", type=str, default="", help="a text file to train on (default: the stdlib's source)")
    p.add_argument("--corpus-bytes", type=int, default=1 << 20, help="bytes of the default corpus used")
    p.add_argument("--seq-len", type=int, default=128, help="tokens per sequence (count)")
    p.add_argument("--batch-size", type=int, default=2, help="sequences per rank per step (count)")
    p.add_argument("--max-steps", type=int, default=20, help="optimizer steps of the whole training (count)")
    p.add_argument("--lr", type=float, default=1e-4, help="peak learning rate, after a linear warm-up")
    p.add_argument("--warmup-steps", type=int, default=2, help="linear warm-up steps (count)")
    p.add_argument("--weight-decay", type=float, default=0.0, help="AdamW weight decay (unitless)")
    p.add_argument("--clip-grad-norm", type=float, default=1.0, help="clip the global gradient norm (0: off)")
    p.add_argument("--precision", choices=["fp32", "bf16"], default=None,
                   help="compute dtype (default: bf16 on CUDA, fp32 on CPU; no fp16: it would need a loss scaler); "
                        "shards and optimizer state stay fp32")
    p.add_argument("--ac-mode", choices=["none", "full", "selective"], default="none",
                   help="activation checkpointing per decoder layer")
    p.add_argument("--attn", choices=["sdpa", "eager"], default="sdpa",
                   help="attention: sdpa (fused, torch's scaled_dot_product_attention) or eager (scores materialised)")
    p.add_argument("--cpu-offload", action="store_true",
                   help="FSDP's CPUOffloadPolicy: shards, gradients and the optimizer step on the CPU (on CUDA with a gloo "
                        "group beside NCCL for the CPU tensors; on CPU ranks the same code path, nothing moves)")
    p.add_argument("--lora-rank", type=int, default=0, help="LoRA adapters of this rank on a frozen base (0: full "
                                                             "fine-tuning); needs peft")
    p.add_argument("--lora-alpha", type=float, default=32.0, help="LoRA's scale numerator (alpha / rank)")
    p.add_argument("--replicate-degree", type=int, default=1,
                   help="HSDP: replicas of the sharded model (a (replicate, shard) mesh, e.g. the node count); 1: FSDP")
    p.add_argument("--seed", type=int, default=0, help="seed of the data order, the LoRA and tiny-model weights")
    p.add_argument("--deterministic", action="store_true",
                   help="deterministic kernels only (torch.use_deterministic_algorithms(True), cuBLAS's workspace "
                        "setting, no cuDNN autotuning): on CUDA a resumed fp32 run then matches an unbroken one bit "
                        "for bit, a little slower; an op without a deterministic kernel raises, naming itself "
                        "(torch's Reproducibility notes; torchtitan's --debug.deterministic)")
    p.add_argument("--checkpoint-dir", type=str, default="checkpoints", help="folder of step-N/ checkpoints")
    p.add_argument("--save-every", type=int, default=0, help="save every N steps and at the end (count; 0: never)")
    p.add_argument("--resume", type=str, default="none", help="none, latest, or a step-N/ checkpoint folder")
    p.add_argument("--export", type=str, default="",
                   help="at the end, write the trained model as a Hugging Face folder that "
                        "AutoModelForCausalLM.from_pretrained and --model read: config.json, the weights in the "
                        "model's dtype (config.json's), sharded with an index past --export-shard-gb, the source "
                        "folder's tokenizer files; LoRA merged into the weights (or --export-adapter)")
    p.add_argument("--export-from", type=str, default="",
                   help="with --export, no training: write this DCP checkpoint (a step-N/ folder, or 'latest' in "
                        "--checkpoint-dir) as a Hugging Face folder, in one process, whatever number of ranks saved "
                        "it, reading one output file's tensors at a time")
    p.add_argument("--export-shard-gb", type=float, default=5.0,
                   help="largest safetensors file of an export (GB, 1e9 bytes; Hugging Face's default 5); "
                        "without DCP's consolidation, about what the export holds in host memory at a time")
    p.add_argument("--export-adapter", action="store_true",
                   help="a LoRA run exports its adapters as a PEFT folder (adapter_config.json, "
                        "adapter_model.safetensors) that PeftModel.from_pretrained loads on the base, instead of merged")
    p.add_argument("--stop-at-step", type=int, default=0, help="stop after this step, as a job at its time limit")
    p.add_argument("--device", choices=["auto", "cpu", "cuda"], default="auto", help="auto: CUDA when available")
    p.add_argument("--backend", choices=["auto", "nccl", "gloo"], default="auto",
                   help="process group backend (auto: nccl on CUDA, gloo on CPU)")
    p.add_argument("--pg-timeout-s", type=float, default=120.0, help="collective timeout of the process group (s)")
    p.add_argument("--log-every", type=int, default=1, help="print a line every N steps (count)")
    if workbook:
        workbook.add_hf_flags(p)  # workbook: --metrics-dir, --track-memory
    return check_args(p, p.parse_args(argv))


def check_args(p, args):
    """Refuse bad flag values before anything starts (``p.error`` exits with 2); returns ``args``."""
    if args.device == "cuda" and not torch.cuda.is_available():
        p.error(f"--device cuda, but torch.cuda.is_available() is False here (torch {torch.__version__}): use "
                "--device cpu, or a machine with a GPU and a CUDA build of torch")
    if not args.model and not args.create_tiny_model:
        p.error("--model FOLDER is required (a folder with config.json and *.safetensors), or --create-tiny-model")
    for name in ("seq_len", "batch_size", "max_steps", "corpus_bytes", "log_every", "replicate_degree"):
        if getattr(args, name) <= 0:
            p.error(f"--{name.replace('_', '-')} must be > 0, got {getattr(args, name)}")
    for name in ("save_every", "stop_at_step", "lora_rank", "warmup_steps", "clip_grad_norm", "weight_decay"):
        if getattr(args, name) < 0:
            p.error(f"--{name.replace('_', '-')} must be >= 0, got {getattr(args, name)}")
    if not (args.lr > 0 and args.pg_timeout_s > 0):
        p.error(f"--lr and --pg-timeout-s must be > 0, got {args.lr}, {args.pg_timeout_s}")
    if args.export_from and not args.export:
        p.error("--export-from CHECKPOINT needs --export FOLDER (where the Hugging Face folder goes)")
    if args.export_from and "RANK" in os.environ and int(os.environ.get("WORLD_SIZE", 1)) > 1:
        p.error("--export-from runs in one process: run it with python, not torchrun")
    if args.export_adapter and not (args.lora_rank or args.export_from):
        p.error("--export-adapter exports LoRA adapters: it needs --lora-rank N (or --export-from a LoRA checkpoint)")
    if not args.export_shard_gb > 0:
        p.error(f"--export-shard-gb must be > 0, got {args.export_shard_gb}")
    if args.export and Path(args.export).expanduser().exists() and any(Path(args.export).expanduser().iterdir()):
        p.error(f"--export {args.export!r} exists and is not empty: export into a new folder (nothing is overwritten)")
    if args.data and not Path(args.data).is_file():
        p.error(f"--data {args.data!r}: no such file")
    if args.data and Path(args.data).stat().st_size == 0:
        p.error(f"--data {args.data!r} is empty: give it the text to train on")
    if workbook:
        workbook.check_hf_flags(p, args)  # workbook: --track-memory needs a second step
    return args


def process_group_backend(device_type, cpu_offload, backend="auto"):
    """The backend for init_process_group: nccl on CUDA, gloo on CPU (``backend``: another choice of --backend), and
    with --cpu-offload on CUDA a CPU backend beside it, ``"cuda:nccl,cpu:gloo"``: FSDP's CPUOffloadPolicy keeps the
    sharded gradients on the CPU, so clip_grad_norm_'s all-reduce of their norm and full_tensor() run collectives on
    CPU tensors, which an NCCL-only group refuses. torchtitan's ``_get_distributed_backend`` adds gloo the same way."""
    if backend == "auto":
        backend = "nccl" if device_type == "cuda" else "gloo"
    return f"{device_type}:{backend},cpu:gloo" if cpu_offload and device_type == "cuda" else backend


def setup(args):
    """Join the process group (a world of one without torchrun); return (rank, local_rank, world_size, device)."""
    rank, world_size = int(os.environ.get("RANK", 0)), int(os.environ.get("WORLD_SIZE", 1))
    local_rank = int(os.environ.get("LOCAL_RANK", 0))
    use_cuda = args.device == "cuda" or (args.device == "auto" and torch.cuda.is_available())
    if use_cuda and not torch.cuda.is_available():
        sys.exit(f"--device cuda, but torch.cuda.is_available() is False here (torch {torch.__version__})")
    device = torch.device("cuda", local_rank) if use_cuda else torch.device("cpu")  # LOCAL_RANK: this node's GPU
    if args.deterministic:  # before the first CUDA kernel: cuBLAS reads its workspace setting once
        os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")
        torch.use_deterministic_algorithms(True)
        torch.backends.cudnn.benchmark = False
    if use_cuda:
        torch.cuda.set_device(device)
    backend = process_group_backend(device.type, args.cpu_offload, args.backend)
    timeout = timedelta(seconds=args.pg_timeout_s)
    if "RANK" in os.environ:
        dist.init_process_group(backend, timeout=timeout, device_id=device if use_cuda else None)
    else:  # FSDP and DCP want a process group even alone: a world of one over an in-memory store
        dist.init_process_group(backend, store=dist.HashStore(), rank=0, world_size=1, timeout=timeout)
    return rank, local_rank, world_size, device


# --- The model: built from config.json on meta, sharded, materialised, loaded ------------------------------------

def load_config(folder):
    """The folder's config.json as a transformers config, checked: the file exists, its architecture is one this
    script knows, its sizes are positive integers. Nothing is downloaded (local files only)."""
    from transformers import AutoConfig
    path = Path(folder).expanduser() / "config.json"
    if not path.is_file():
        sys.exit(f"--model {folder!r}: no config.json in it (a model folder holds config.json and *.safetensors; "
                 "download one with `hf download NAME --local-dir FOLDER`, or make a tiny one with "
                 "--create-tiny-model FOLDER)")
    try:
        raw = json.loads(path.read_text())
    except json.JSONDecodeError as e:
        sys.exit(f"{path}: not valid JSON ({e})")
    if raw.get("model_type") not in ARCHITECTURES:
        sys.exit(f"{path}: model_type {raw.get('model_type')!r} is not one this script was checked with "
                 f"({', '.join(ARCHITECTURES)}); add it to ARCHITECTURES after a small run")
    for key in ("hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads", "vocab_size",
                "max_position_embeddings"):
        if not isinstance(raw.get(key), int) or raw[key] <= 0:
            sys.exit(f"{path}: field {key!r} must be a positive integer, got {raw.get(key)!r}")
    return AutoConfig.from_pretrained(path.parent, local_files_only=True)


def decoder_layers(model):
    """The model's decoder layers: the modules whose class the model names in ``_no_split_modules`` (transformers'
    own list of the blocks that must stay whole: the natural FSDP units)."""
    base = model.get_base_model() if hasattr(model, "get_base_model") else model
    names = set(base._no_split_modules or ())
    layers = [m for m in model.modules() if type(m).__name__ in names]
    if not layers:
        sys.exit(f"{type(base).__name__} lists no decoder layer class in _no_split_modules: cannot shard it per layer")
    return layers


def compute_dtype(args, device):
    if args.precision is None:
        return torch.bfloat16 if device.type == "cuda" else torch.float32
    return {"fp32": torch.float32, "bf16": torch.bfloat16}[args.precision]


# Selective activation checkpointing, torchtitan's "op" policy (torchtitan/models/llama3/infra/parallelize.py):
# keep the outputs of attention and of matmuls, except every second matmul, and recompute the rest (norms,
# activations, additions and the other matmuls) in backward: about half a layer's matmul outputs kept.
SAVE_OPS = {torch.ops.aten.mm.default, torch.ops.aten.addmm.default, torch.ops.aten.bmm.default,
            *(getattr(torch.ops.aten, name).default for name in (
                "_scaled_dot_product_flash_attention", "_scaled_dot_product_efficient_attention",
                "_scaled_dot_product_flash_attention_for_cpu", "_scaled_dot_product_cudnn_attention")
              if hasattr(torch.ops.aten, name))}
MATMULS = {torch.ops.aten.mm.default, torch.ops.aten.addmm.default}


def selective_context():
    """A checkpoint context for one layer's forward (and its recomputation): its own matmul count."""
    counts = {"forward": 0, "recompute": 0}

    def policy(ctx, op, *args, **kwargs):
        if op in MATMULS:
            key = "recompute" if ctx.is_recompute else "forward"
            counts[key] += 1
            if counts[key] % 2 == 0:  # every second matmul: recomputed
                return CheckpointPolicy.PREFER_RECOMPUTE
        return CheckpointPolicy.MUST_SAVE if op in SAVE_OPS else CheckpointPolicy.PREFER_RECOMPUTE
    return create_selective_checkpoint_contexts(policy)


def build_model(args, config, device, mesh):
    """The model laid out over ``mesh``: ``meta_model``, ``shard``, then ``materialize``d: storage for this rank's
    shards only, buffers computed. The weights are not loaded here (``load_weights``)."""
    model = shard(meta_model(args, config), args, device, mesh)
    materialize(model, "cpu" if args.cpu_offload else device)
    return model


def meta_model(args, config):
    """The architecture on the meta device (shapes only), with activation checkpointing and LoRA applied."""
    from transformers import AutoModelForCausalLM
    with torch.device("meta"):
        # fp32 parameters (FSDP keeps fp32 shards; bf16 is the compute dtype of the MixedPrecisionPolicy below);
        # --attn sdpa (the default): fused, it saves the attention's output and log-sum-exp, not the T x T scores.
        model = AutoModelForCausalLM.from_config(config, dtype=torch.float32, attn_implementation=args.attn)
    model.config.use_cache = False  # training: no key/value cache
    model.train()  # from_config may leave it in eval mode, where activation checkpointing is skipped
    if args.ac_mode != "none":
        kwargs = {"use_reentrant": False}
        if args.ac_mode == "selective":
            kwargs["context_fn"] = selective_context
        if hasattr(model, "activation_checkpointing_enable"):  # transformers >= 5.21 (the old name is deprecated)
            model.activation_checkpointing_enable(activation_checkpointing_kwargs=kwargs)  # each decoder layer
        else:
            model.gradient_checkpointing_enable(gradient_checkpointing_kwargs=kwargs)
    if args.lora_rank:
        import warnings
        from peft import LoraConfig, get_peft_model
        with warnings.catch_warnings():  # peft 0.21 asks transformers >= 5.21 for a property it has deprecated
            warnings.filterwarnings("ignore", message=".*is_gradient_checkpointing.*", category=FutureWarning)
            model = get_peft_model(model, LoraConfig(r=args.lora_rank, lora_alpha=args.lora_alpha, lora_dropout=0.0,
                                                     target_modules=list(LORA_TARGETS)))  # the base is frozen
    return model


def shard(model, args, device, mesh):
    """Each decoder layer and then the root made an FSDP2 unit over ``mesh``, still on meta (no memory yet)."""
    from torch.distributed.fsdp import CPUOffloadPolicy, FSDPModule, MixedPrecisionPolicy, fully_shard
    dtype = compute_dtype(args, device)
    mp = MixedPrecisionPolicy(param_dtype=dtype, reduce_dtype=torch.float32)
    offload = CPUOffloadPolicy(pin_memory=device.type == "cuda") if args.cpu_offload else None  # pinning needs CUDA
    kw = {"mesh": mesh, "mp_policy": mp, **({"offload_policy": offload} if offload else {})}
    for layer in decoder_layers(model):
        fully_shard(layer, **kw)  # one unit per decoder layer: gathered just before it runs, freed after
    fully_shard(model, **kw)  # the root: embeddings, the final norm, the output head
    if dist.get_backend() == "gloo":
        # gloo's reduce-scatter in torch 2.8 treats ReduceOp.AVG as a sum (pytorch/pytorch#162338): sum, then
        # divide, right on every version.
        for module in model.modules():
            if isinstance(module, FSDPModule):
                module.set_force_sum_reduction_for_comms(True)
    return model


def make_mesh(args, world_size, device):
    """The DeviceMesh FSDP shards over: 1-D (all ranks), or 2-D (replicate, shard) for HSDP (--replicate-degree)."""
    from torch.distributed.device_mesh import init_device_mesh
    if args.replicate_degree > 1:
        return init_device_mesh(device.type, (args.replicate_degree, world_size // args.replicate_degree),
                                mesh_dim_names=("replicate", "shard"))
    return init_device_mesh(device.type, (world_size,), mesh_dim_names=("shard",))


def materialize(model, device, check=True):
    """``to_empty`` and what it leaves undone. ``to_empty`` gives every parameter and buffer new, uninitialised
    storage on ``device``. Parameters are then loaded from the checkpoint, but two things are not in it:

    * non-persistent buffers computed in ``__init__``, such as the rotary embedding's ``inv_freq``: on meta they
      were never computed, after ``to_empty`` they hold whatever the memory held. Recomputed here by building each
      such module again on ``device`` and copying its buffers;
    * tied weights (``tie_word_embeddings``: the output head reuses the input embedding): a plain module's
      ``to_empty`` makes two tensors of the one shared parameter. ``tie_weights()`` ties them again (under FSDP2
      the tie survives on torch 2.8 and 2.13; tying again is harmless).
    """
    model.to_empty(device=device)
    base = model.get_base_model() if hasattr(model, "get_base_model") else model
    for module in base.modules():
        if "RotaryEmbedding" in type(module).__name__:
            with torch.device(device):
                fresh = type(module)(config=module.config)
            for name, buffer in fresh.named_buffers(recurse=False):
                getattr(module, name).copy_(buffer)
    if getattr(base.config, "tie_word_embeddings", False):
        base.tie_weights()
    if check:
        check_materialized(model)


def check_materialized(model):
    """Raise if a rotary ``inv_freq`` is not 1 / theta^(2i/d) or a tied output head is not the embedding."""
    base = model.get_base_model() if hasattr(model, "get_base_model") else model
    for module in base.modules():
        if hasattr(module, "inv_freq") and "RotaryEmbedding" in type(module).__name__:
            inv = module.inv_freq.float().cpu()
            if not (torch.isfinite(inv).all() and inv[0] == 1.0 and (inv[1:] < inv[:-1]).all()):
                raise RuntimeError(f"{type(module).__name__}.inv_freq holds garbage after to_empty: {inv[:4].tolist()}")
    if getattr(base.config, "tie_word_embeddings", False):
        if base.get_output_embeddings().weight is not base.get_input_embeddings().weight:
            raise RuntimeError("tie_word_embeddings is set but the output head is not the input embedding")


def load_weights(model, folder, seed):
    """The folder's ``*.safetensors`` into the sharded model: rank 0 reads the files, ``set_model_state_dict``
    broadcasts each whole tensor from rank 0 and every rank keeps its own shard. LoRA adapters, which the file does
    not have, start as peft starts them (A: Kaiming-uniform from ``seed``, B: zeros, so the first step is the base)."""
    from safetensors.torch import load_file
    files = sorted(Path(folder).expanduser().glob("*.safetensors"))
    if not files:
        sys.exit(f"--model {folder!r}: no *.safetensors weights in it")
    full = {}
    if dist.get_rank() == 0:
        for f in files:
            full.update(load_file(f))
        names = model_keys(model)
        full = {names.get(k, k): v for k, v in full.items()}
        g = torch.Generator().manual_seed(seed)
        for name, param in model.named_parameters():
            if "lora_A" in name:
                full[name] = torch.nn.init.kaiming_uniform_(torch.empty(param.shape), a=math.sqrt(5), generator=g)
            elif "lora_B" in name:
                full[name] = torch.zeros(param.shape)
    result = set_model_state_dict(model, full, options=StateDictOptions(full_state_dict=True,
                                                                        broadcast_from_rank0=True, strict=False))
    base = model.get_base_model() if hasattr(model, "get_base_model") else model
    tied = {"lm_head.weight"} if getattr(base.config, "tie_word_embeddings", False) else set()
    missing = {k for k in result.missing_keys if k.split("base_model.model.")[-1] not in tied}
    if missing:
        sys.exit(f"{folder}: the checkpoint lacks {len(missing)} of the model's weights, e.g. {sorted(missing)[:3]}: "
                 "does config.json belong to these weights?")


def model_keys(model):
    """{checkpoint name: model name}: peft renames ``q_proj.weight`` to ``base_model.model.q_proj.base_layer.weight``."""
    out = {}
    for name in get_model_state_dict(model, options=StateDictOptions(full_state_dict=False)):
        plain = name.removeprefix("base_model.model.").replace(".base_layer.", ".")
        out[plain] = name
    return out


def tiny_config(arch):
    """The config of --create-tiny-model's model: ``arch``'s config class (qwen2 or llama), ``TINY``'s sizes."""
    from transformers import AutoConfig
    return AutoConfig.for_model(arch, **TINY, tie_word_embeddings=TINY_TIED[arch])


# What a Hugging Face model folder carries beside its weights: the tokenizer and the generation defaults.
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "added_tokens.json",
                   "vocab.json", "merges.txt", "tokenizer.model", "chat_template.jinja", "generation_config.json")


def export(model, config, folder, args, streaming=None):
    """The trained model as a Hugging Face folder, at the end of a run, on every rank, without gathering the whole
    model in one process. Each rank starts from its own shards (``get_model_state_dict``: DTensors) and the folder
    gets either

    * the model: LoRA adapters merged into their base weights (W + alpha / r B A, peft's merge, in fp32), named as
      the checkpoint it loaded named them, a tied head dropped (it is the embedding), cast once to config.json's
      dtype, in safetensors files of at most --export-shard-gb with a ``model.safetensors.index.json``, as
      ``save_pretrained`` writes a large model. Where torch's ``HuggingFaceStorageWriter`` can consolidate
      (``dcp_writes_hf_folders``; torch 2.13) every rank merges and casts its own rows and writes them with
      ``dcp.save``, and rank 0 joins the pieces into whole files one tensor at a time (``export_with_dcp``); where it
      cannot (torch 2.8) the tensors are gathered one at a time and rank 0 writes each file and frees it before the
      next (``write_streaming``). Either way rank 0's host memory holds a file's or a tensor's bytes about twice
      (measured: +67 MB exporting a 273 MB model in 20 MB files, largest tensor 34 MB; the whole gathered: +306 MB).
      ``streaming`` (True/False) picks a path by hand, None by the feature, and the line printed says which ran;
    * with --export-adapter (a LoRA run): the adapters alone, gathered (they are small), as peft's ``save_pretrained``
      writes them (``adapter_config.json``, ``adapter_model.safetensors``), for ``PeftModel.from_pretrained``;

    and the source folder's tokenizer files (``TOKENIZER_FILES``), so the folder is a model one can load and run."""
    folder, rank = Path(folder).expanduser(), dist.get_rank()
    state = get_model_state_dict(model)  # this rank's shards: nothing is gathered
    if args.export_adapter:
        adapters = {k: full(v).cpu() for k, v in state.items() if "lora_" in k}  # a collective per tensor
        if rank == 0:
            folder.mkdir(parents=True, exist_ok=True)
            written = export_adapter(model, adapters, folder)
    else:
        dtype, scale = saved_dtype(args.model), args.lora_alpha / max(args.lora_rank, 1)
        plan = merge_plan(state, getattr(config, "tie_word_embeddings", False))
        files = file_plan({out: state[w].numel() * dtype.itemsize for out, (w, _, _) in plan.items()},
                          args.export_shard_gb)
        use_dcp = dcp_writes_hf_folders() if streaming is None else not streaming
        if use_dcp:
            export_with_dcp(state, plan, files, scale, dtype, folder)
            how = "every rank wrote its own rows with dcp.save (HuggingFaceStorageWriter), rank 0 consolidated them"
        else:
            def gathered(outs):  # full_tensor() is a collective: every rank gathers each tensor, rank 0 keeps it
                kept = {}
                for out in outs:  # one whole tensor at a time on the device
                    tensor = merge(*(full(state[n]) if n else None for n in plan[out]), scale, dtype)
                    if rank == 0:
                        kept[out] = tensor.cpu()
                return kept
            write_streaming(files, gathered, folder, rank == 0)
            how = "gathered file by file, rank 0 wrote each and freed it (no consolidating HuggingFaceStorageWriter)"
        written = f"{len(plan)} tensors in {dtype}, {len(files)} file(s); {how}"
        if rank == 0:
            config.dtype = dtype  # the model was built in fp32 for training; the folder says what its weights are
            config.save_pretrained(folder)
    if rank == 0:
        finish_export(folder, args.model, written)


def full(t):
    return t.full_tensor() if hasattr(t, "full_tensor") else t  # a DTensor's whole tensor: an all-gather


def dcp_writes_hf_folders():
    """True where torch's DCP writes a Hugging Face folder from every rank's shards: its ``HuggingFaceStorageWriter``
    takes ``enable_consolidation`` (torch 2.13; torch 2.8's writer has no such argument). Decided by the feature, not
    by a version number."""
    try:
        from torch.distributed.checkpoint import HuggingFaceStorageWriter
    except ImportError:
        return False
    return "enable_consolidation" in inspect.signature(HuggingFaceStorageWriter).parameters


def merge_plan(names, tied):
    """{name in the exported folder: (the training's name of the weight, of its LoRA A, of its LoRA B; None without
    LoRA)}: peft's ``base_model.model.X.base_layer.weight`` is exported as ``X.weight``; a tied head is dropped."""
    plan = {}
    for name in names:
        if "lora_A" in name or "lora_B" in name:
            continue
        prefix = name[:-len("base_layer.weight")] if name.endswith(".base_layer.weight") else None
        a, b = (prefix + "lora_A.default.weight", prefix + "lora_B.default.weight") if prefix else (None, None)
        lora = (a, b) if a in names and b in names else (None, None)
        plan[name.removeprefix("base_model.model.").replace(".base_layer.", ".")] = (name, *lora)
    if tied:
        plan.pop("lm_head.weight", None)
    return plan


def merge(weight, lora_a, lora_b, scale, dtype):
    """W + scale B A (peft's merge) in fp32, then cast once to ``dtype``: on whole tensors, or on DTensors (each rank
    its own rows of W and B; DTensor gathers the small A)."""
    if lora_a is not None:
        weight = weight + scale * (lora_b @ lora_a)
    return (weight.to(dtype) if weight.is_floating_point() else weight).contiguous()


def file_plan(nbytes, shard_gb):
    """{file name: [tensor names]}: consecutive tensors in files of at most ``shard_gb`` GB (1e9 bytes; a larger
    tensor alone), as ``save_pretrained`` splits a state dict; one file is ``model.safetensors``."""
    shards, size = [[]], 0
    for name, n in nbytes.items():
        if shards[-1] and size + n > shard_gb * 1e9:
            shards.append([])
            size = 0
        shards[-1].append(name)
        size += n
    if len(shards) == 1:
        return {"model.safetensors": shards[0]}
    return {f"model-{i:05d}-of-{len(shards):05d}.safetensors": names for i, names in enumerate(shards, 1)}


def export_with_dcp(state, plan, files, scale, dtype, folder):
    """torch's DCP writes the folder: every rank merges and casts its own rows (DTensors) and ``dcp.save`` writes
    them to ``folder/sharded/``; ``HuggingFaceStorageWriter``'s consolidation (on rank 0) then writes the whole files
    of ``files`` and ``model.safetensors.index.json``, holding one tensor at a time. The ``sharded/`` pieces (a second
    copy of the model on disk) are removed; a single file is named ``model.safetensors``, without an index."""
    from torch.distributed.checkpoint import HuggingFaceStorageWriter
    merged = {out: merge(*(state[n] if n else None for n in plan[out]), scale, dtype) for out in plan}
    index = {out: i for i, outs in enumerate(files.values(), 1) for out in outs}  # file numbers from 1
    dcp.save(merged, storage_writer=HuggingFaceStorageWriter(str(folder), fqn_to_index_mapping=index,
                                                             save_distributed=True, enable_consolidation=True))
    if dist.get_rank() == 0:
        shutil.rmtree(folder / "sharded")
        if len(files) == 1:  # DCP names it model-00001-of-00001.safetensors, with an index
            (folder / "model-00001-of-00001.safetensors").rename(folder / "model.safetensors")
            (folder / "model.safetensors.index.json").unlink()


def write_streaming(files, tensors_of, folder, writer):
    """Each file of ``files`` in turn: ``tensors_of(names)`` gives its tensors (merged, cast; a collective at the
    end of a run, so every rank calls it), the ``writer`` process writes them and frees them before the next file,
    then writes ``model.safetensors.index.json``: one file's tensors in host memory at a time."""
    from safetensors.torch import save_file
    if writer:
        folder.mkdir(parents=True, exist_ok=True)
    weight_map, total_bytes = {}, 0
    for file, names in files.items():
        tensors = tensors_of(names)
        if writer:
            save_file(tensors, str(folder / file), metadata={"format": "pt"})
            weight_map.update(dict.fromkeys(tensors, file))
            total_bytes += sum(t.numel() * t.element_size() for t in tensors.values())
        del tensors
    if writer and len(files) > 1:
        index = {"metadata": {"total_size": total_bytes}, "weight_map": weight_map}
        (folder / "model.safetensors.index.json").write_text(json.dumps(index, indent=2, sort_keys=True) + "\n")


def finish_export(folder, source, written):
    """The source folder's tokenizer files copied beside the weights; one line saying what was written."""
    source = Path(source).expanduser()
    copied = [name for name in TOKENIZER_FILES if (source / name).is_file()]
    for name in copied:
        shutil.copyfile(source / name, folder / name)
    sys.stdout.write(f"exported {written} to {folder}" + (f" with {', '.join(copied)}" if copied else "") + "\n")


def saved_dtype(folder):
    """The dtype the model folder's config.json gives its weights ("dtype", or the older "torch_dtype"; fp32 if
    neither): what an export writes, as the model was published."""
    saved = json.loads((Path(folder).expanduser() / "config.json").read_text())
    name = saved.get("dtype") or saved.get("torch_dtype") or "float32"
    dtype = getattr(torch, str(name).removeprefix("torch."), None)
    if not isinstance(dtype, torch.dtype) or not dtype.is_floating_point:
        sys.exit(f"{folder}/config.json: dtype {name!r} is not a floating-point torch dtype")
    return dtype


def export_adapter(model, adapters, folder):
    """A LoRA run's adapters (``adapters``: the whole lora_A/lora_B tensors) as peft writes them: named as
    ``get_peft_model_state_dict`` names them, with the adapter's config; what was written."""
    from peft import get_peft_model_state_dict
    from safetensors.torch import save_file
    if not hasattr(model, "peft_config"):
        sys.exit("--export-adapter exports LoRA adapters: this run has none (--lora-rank 0)")
    adapters = {k: v.contiguous() for k, v in get_peft_model_state_dict(model, state_dict=adapters).items()}
    save_file(adapters, str(folder / "adapter_model.safetensors"), metadata={"format": "pt"})
    model.peft_config["default"].save_pretrained(folder)
    return f"{len(adapters)} adapter tensors (adapter_config.json, adapter_model.safetensors)"


def export_checkpoint(args):
    """--export-from CHECKPOINT --export FOLDER: a DCP checkpoint of this script written as a Hugging Face folder,
    afterwards (the step that evaluated best, a run that was stopped), in one process, whatever number of ranks saved
    it, without loading the whole model: the checkpoint's metadata gives every tensor's name and shape, and DCP
    reads the tensors of one output file at a time (it reads only the keys asked for; a LoRA base weight comes with
    its A and B), which are merged, cast, written and freed (``write_streaming``). The optimizer's state is never
    read."""
    path = resume_path(argparse.Namespace(resume=args.export_from, checkpoint_dir=args.checkpoint_dir))
    if path is None:
        sys.exit(f"--export-from latest: no complete checkpoint in {args.checkpoint_dir}/")
    config = load_config(args.model)
    saved = TrainState()
    warnings.filterwarnings("ignore", message="torch.distributed is disabled")  # one process, no group: as meant
    dcp.load({"train": saved}, checkpoint_id=path, no_dist=True)
    sys.stdout.write(f"{path}: step {saved.step}, saved on {saved.world_size} ranks\n")
    args.lora_rank, args.seq_len = saved.lora_rank, saved.seq_len
    shapes = {k[len("app.model."):]: v.size for k, v in dcp.FileSystemReader(path).read_metadata()
              .state_dict_metadata.items() if k.startswith("app.model.")}

    def loaded(names):  # only these tensors are read, in fp32 as saved
        state = {"app": {"model": {n: torch.empty(shapes[n]) for n in names}}}
        dcp.load(state, checkpoint_id=path, no_dist=True)
        return state["app"]["model"]

    folder = Path(args.export).expanduser()
    if args.export_adapter:
        if not saved.lora_rank:
            sys.exit(f"--export-adapter exports LoRA adapters: {path} was saved with --lora-rank 0")
        folder.mkdir(parents=True, exist_ok=True)  # the model on meta (no memory) gives peft's names and config
        written = export_adapter(meta_model(args, config), loaded([n for n in shapes if "lora_" in n]), folder)
    else:
        dtype, scale = saved_dtype(args.model), args.lora_alpha / max(args.lora_rank, 1)
        plan = merge_plan(shapes, getattr(config, "tie_word_embeddings", False))
        files = file_plan({out: math.prod(shapes[w]) * dtype.itemsize for out, (w, _, _) in plan.items()},
                          args.export_shard_gb)

        def tensors_of(outs):
            got = loaded([n for out in outs for n in plan[out] if n])
            return {out: merge(*(got[n] if n else None for n in plan[out]), scale, dtype) for out in outs}
        write_streaming(files, tensors_of, folder, True)
        config.dtype = dtype
        config.save_pretrained(folder)
        written = f"{len(plan)} tensors in {dtype}, {len(files)} file(s); read from the checkpoint file by file"
    finish_export(folder, args.model, written)


def create_tiny_model(args):
    """One process writes a tiny model of --arch (same config class as the real models, small sizes) with seeded
    weights, in the format a downloaded model has: config.json and model.safetensors."""
    from transformers import AutoModelForCausalLM
    config = tiny_config(args.arch)
    torch.manual_seed(args.seed)
    model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    model.save_pretrained(args.create_tiny_model)  # safetensors; a tied head is written once
    n = sum(p.numel() for p in model.parameters())
    sys.stdout.write(f"tiny {args.arch}: {n} parameters in {args.create_tiny_model}\n")


def build_optimizer(args, model):
    # After sharding: the state exists for the local shards of the trainable parameters only (LoRA: the adapters).
    # foreach=False: one parameter at a time, so the update's temporaries are one parameter's size.
    params = [p for p in model.parameters() if p.requires_grad]
    return torch.optim.AdamW(params, lr=args.lr, weight_decay=args.weight_decay, foreach=False)


# --- The data: one token stream, windows in a seeded order, a global position ------------------------------------

def read_tokens(args, folder):
    """The corpus as a 1-D tensor of token ids: --data or the stdlib's source, through the folder's tokenizer if it
    has one, else as bytes."""
    if args.data:
        text = Path(args.data).read_bytes()
    else:
        root = Path(sysconfig.get_paths()["stdlib"])
        text = b"".join((root / f).read_bytes() for f in CORPUS_FILES if (root / f).is_file())[:args.corpus_bytes]
    if folder and (Path(folder).expanduser() / "tokenizer_config.json").is_file():
        from transformers import AutoTokenizer
        tokenizer = AutoTokenizer.from_pretrained(Path(folder).expanduser(), local_files_only=True)
        return torch.tensor(tokenizer(text.decode("utf-8", errors="replace"))["input_ids"], dtype=torch.long)
    return torch.frombuffer(bytearray(text), dtype=torch.uint8).long()


class Windows(Stateful):
    """Non-overlapping windows of ``seq_len + 1`` tokens, in an order shuffled per epoch with ``seed + epoch``.
    The position is global: every step takes the next ``batch_size x world_size`` windows and rank r the r-th
    ``batch_size`` of them. A checkpoint keeps (epoch, consumed): a resume on any number of ranks continues with the
    next unread window. DCP saves it as it saves the model (Stateful)."""

    def __init__(self, tokens, seq_len, seed):
        self.tokens, self.seq_len, self.seed = tokens, seq_len, seed
        self.n = (len(tokens) - 1) // seq_len
        self.epoch, self.consumed, self.order = 0, 0, None

    def check(self, batch_size, world_size):
        if batch_size * world_size > self.n:
            sys.exit(f"the corpus holds {self.n} windows of {self.seq_len + 1} tokens, fewer than one global batch "
                     f"({batch_size} x {world_size} ranks): use more data or a smaller --seq-len/--batch-size")

    def next(self, batch_size, rank, world_size, device):
        """This rank's (inputs, targets), each (batch_size, seq_len), of the next global batch."""
        global_batch = batch_size * world_size
        self.check(batch_size, world_size)
        if self.consumed + global_batch > self.n:
            self.epoch, self.consumed, self.order = self.epoch + 1, 0, None
        if self.order is None:
            g = torch.Generator().manual_seed(self.seed + self.epoch)
            self.order = torch.randperm(self.n, generator=g).tolist()
        start = self.consumed + rank * batch_size
        starts = torch.tensor(self.order[start:start + batch_size]) * self.seq_len
        self.consumed += global_batch
        # Gathered into a new tensor (advanced indexing), not views of the corpus: a view would keep the whole
        # corpus's storage alive and, under --track-memory, counted as this step's.
        rows = self.tokens[starts[:, None] + torch.arange(self.seq_len + 1)]  # (batch_size, seq_len + 1)
        return rows[:, :-1].to(device), rows[:, 1:].to(device)

    def state_dict(self):
        return {"epoch": self.epoch, "consumed": self.consumed}

    def load_state_dict(self, state):
        self.epoch, self.consumed, self.order = int(state["epoch"]), int(state["consumed"]), None


# --- Training ------------------------------------------------------------------------------------------------------

def train_step(model, optimizer, windows, args, rank, world_size, device):
    """One optimizer step; returns (this rank's mean loss, the global gradient norm) as tensors."""
    x, y = windows.next(args.batch_size, rank, world_size, device)
    logits = model(input_ids=x).logits  # (batch, seq_len, vocab), in the compute dtype
    loss = F.cross_entropy(logits.float().flatten(0, 1), y.flatten())  # fp32 loss; mean over this rank's tokens
    loss.backward()  # FSDP reduce-scatters each layer's gradients: the mean over ranks, this rank's shard
    params = [p for p in model.parameters() if p.requires_grad]
    norm = torch.nn.utils.clip_grad_norm_(params, args.clip_grad_norm or float("inf"))
    norm = norm.full_tensor() if hasattr(norm, "full_tensor") else norm  # a DTensor under FSDP
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)
    return loss.detach(), norm


class ModelAndOptimizer(Stateful):
    """Model and optimizer as DCP saves them: each rank's own shards, the keys as the model names them."""

    def __init__(self, model, optimizer):
        self.model, self.optimizer = model, optimizer

    def state_dict(self):
        model_sd, optim_sd = get_state_dict(self.model, self.optimizer)
        return {"model": model_sd, "optim": optim_sd}

    def load_state_dict(self, state):
        set_state_dict(self.model, self.optimizer, model_state_dict=state["model"], optim_state_dict=state["optim"])


class TrainState(Stateful):
    """The step, and what a resume must agree with: the window length and LoRA rank (they decide what the data
    position and the saved tensors mean) and the world size (it decides the global batch)."""

    def __init__(self, args=None, world_size=1):
        self.step, self.world_size = 0, world_size
        self.seq_len, self.lora_rank = (args.seq_len, args.lora_rank) if args else (0, 0)

    def state_dict(self):
        return {"step": self.step, "seq_len": self.seq_len, "lora_rank": self.lora_rank, "world_size": self.world_size}

    def load_state_dict(self, state):
        self.step, self.seq_len = int(state["step"]), int(state["seq_len"])
        self.lora_rank, self.world_size = int(state["lora_rank"]), int(state["world_size"])


def check_resume(args, path, world_size, rank):
    """Read the checkpoint's TrainState first: refuse one whose --seq-len or --lora-rank differ from this run's (its
    data position counts other windows, its tensors have other names), and say what a new world size changes."""
    saved = TrainState()
    dcp.load({"train": saved}, checkpoint_id=path)
    for flag, then, now in (("--seq-len", saved.seq_len, args.seq_len), ("--lora-rank", saved.lora_rank,
                                                                           args.lora_rank)):
        if then != now:
            sys.exit(f"{path} was saved with {flag} {then}; this run has {flag} {now}: resume with {flag} {then}, or "
                     "start afresh without --resume")
    if saved.world_size != world_size and rank == 0:
        sys.stdout.write(f"saved on {saved.world_size} ranks, now {world_size}: the data position carries on; the "
                         f"global batch is now {args.batch_size} x {world_size} sequences (was "
                         f"{args.batch_size} x {saved.world_size})\n")
    if saved.step >= args.max_steps and rank == 0:
        sys.stdout.write(f"{path} is at step {saved.step}, --max-steps is {args.max_steps}: nothing to train\n")


def resume_path(args):
    if args.resume == "none":
        return None
    if args.resume == "latest":
        found = {int(p.name[5:]): p for p in Path(args.checkpoint_dir).glob("step-*")
                 if p.name[5:].isdigit() and (p / ".metadata").is_file()}  # .metadata: written last, when complete
        return found[max(found)] if found else None
    if not (Path(args.resume) / ".metadata").is_file():
        sys.exit(f"--resume {args.resume!r} is not a complete DCP checkpoint folder (no .metadata in it)")
    return Path(args.resume)


@record  # writes this rank's traceback to torchrun's error file, so the launcher can show the root cause
def main():
    args = parse_args()
    if args.create_tiny_model:
        create_tiny_model(args)
        return
    if args.export_from:
        export_checkpoint(args)  # one process, no process group: it reads and writes files, one at a time
        return
    rank, local_rank, world_size, device = setup(args)
    try:
        train(args, rank, local_rank, world_size, device)
    finally:
        if dist.is_initialized():
            dist.destroy_process_group()


def train(args, rank, local_rank, world_size, device):
    config = load_config(args.model)
    if args.seq_len > config.max_position_embeddings:
        sys.exit(f"--seq-len {args.seq_len} is above the model's max_position_embeddings "
                 f"{config.max_position_embeddings} (config.json)")
    if world_size % args.replicate_degree:
        sys.exit(f"--replicate-degree {args.replicate_degree} must divide the world size {world_size}")
    windows = Windows(read_tokens(args, args.model), args.seq_len, args.seed)  # before the model: a too-small
    windows.check(args.batch_size, world_size)                                 # corpus fails in a second
    path = resume_path(args)
    if path is not None:
        check_resume(args, path, world_size, rank)
    elif args.resume == "latest" and rank == 0:
        sys.stdout.write(f"--resume latest: no complete checkpoint in {args.checkpoint_dir}/, starting at step 0\n")
    mesh = make_mesh(args, world_size, device)
    model = build_model(args, config, device, mesh)
    load_weights(model, args.model, args.seed)
    optimizer = build_optimizer(args, model)
    warmup = max(args.warmup_steps, 1)
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda s: min(1.0, (s + 1) / warmup))
    train_state = TrainState(args, world_size)
    state = {"app": ModelAndOptimizer(model, optimizer), "scheduler": scheduler, "data": windows,
             "train": train_state}
    if path is not None:
        dcp.load(state, checkpoint_id=path)  # each rank reads its own shards, on any number of ranks
        train_state.world_size = world_size  # saved from now on: this run's
        sys.stdout.write(f"rank {rank}: resumed from {path} at step {train_state.step}\n")
    log = (workbook.HFStepRecorder(args, rank, local_rank, world_size, device, model, optimizer,  # workbook
                                   train_state.step, compute_dtype(args, device)) if workbook else None)  # workbook
    last_step = min(args.max_steps, args.stop_at_step or args.max_steps)
    while train_state.step < last_step:
        train_state.step += 1
        step = train_state.step
        t0 = time.perf_counter()
        lr = scheduler.get_last_lr()[0]
        with log.tracking(step) if log else contextlib.nullcontext():  # workbook: --track-memory, second step
            loss, grad_norm = train_step(model, optimizer, windows, args, rank, world_size, device)
        scheduler.step()
        loss_global = loss.clone()
        dist.all_reduce(loss_global)  # SUM then / world: each rank's loss is over its own windows
        loss_global /= world_size
        if args.save_every and (step % args.save_every == 0 or step == last_step):
            dcp.save(state, checkpoint_id=Path(args.checkpoint_dir) / f"step-{step}")
        if log:  # workbook
            log.step_done(step, loss, loss_global, grad_norm, lr, windows.epoch, time.perf_counter() - t0)  # workbook
        if rank == 0 and (step % args.log_every == 0 or step == args.max_steps):
            sys.stdout.write(f"step {step}/{args.max_steps} loss {loss_global.item():.4f} lr {lr:.2e}\n")
    if args.export:
        export(model, config, args.export, args)
    if log:  # workbook
        log.close()  # workbook
    dist.barrier()  # nobody tears the process group down while a peer still uses it


if __name__ == "__main__":
    main()
    sys.stdout.flush()  # and leave without Python's teardown, where a gloo thread still tidying up can abort the
    os._exit(0)         # finished run (torch 2.13 on CPU: "terminate called without an active exception", SIGABRT)
