"""train_lm.py's checkpoints: what a DCP checkpoint holds and how a run resumes from one, on any world size.

A checkpoint is one ``dcp.save`` of ``checkpoint_state``: model and optimizer (each rank its own shards, keys without
DDP's "module." prefix), LR scheduler, gradient scaler, data position, step, and each rank's RNG under its own key.
``load_checkpoint`` reads it back on the same world size exactly, and on another one too: DCP reshards the model and
optimizer, the data position is global, only the RNG streams cannot be dealt out again (each rank seeds a new one).
``resume_path`` finds the newest complete ``step-N/`` folder (DCP writes ``.metadata`` last);
``load_initial_weights`` reads a seed checkpoint's weights into any layout. Only torch.
"""

import sys
from pathlib import Path

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint.state_dict import (StateDictOptions, get_model_state_dict, get_state_dict,
                                                     set_model_state_dict, set_state_dict)
from torch.distributed.checkpoint.stateful import Stateful


class ModelAndOptimizer(Stateful):
    """Model and optimizer as DCP saves them: keys without DDP's "module." prefix, each rank's own shards."""

    def __init__(self, model, optimizer):
        self.model, self.optimizer = model, optimizer

    def state_dict(self):
        model_sd, optim_sd = get_state_dict(self.model, self.optimizer)
        return {"model": model_sd, "optim": optim_sd}

    def load_state_dict(self, state):
        set_state_dict(self.model, self.optimizer, model_state_dict=state["model"], optim_state_dict=state["optim"])


class RNG(Stateful):
    """This rank's random state (dropout draws differ per rank): saved under the rank's own key, rng_rank<RANK>."""

    def __init__(self, device):
        self.device = device

    def state_dict(self):
        state = {"cpu": torch.get_rng_state()}
        if self.device.type == "cuda":
            state["cuda"] = torch.cuda.get_rng_state(self.device)
        return state

    def load_state_dict(self, state):
        torch.set_rng_state(state["cpu"])
        if "cuda" in state:
            torch.cuda.set_rng_state(state["cuda"], self.device)


class TrainState(Stateful):
    def __init__(self):
        self.step = 0

    def state_dict(self):
        return {"step": self.step}

    def load_state_dict(self, state):
        self.step = int(state["step"])


def checkpoint_state(model, optimizer, scheduler, scaler, batches, train_state, rank, device):
    return {"app": ModelAndOptimizer(model, optimizer), "scheduler": scheduler, "scaler": scaler, "data": batches,
            "train": train_state, f"rng_rank{rank}": RNG(device)}


def load_checkpoint(state, path, args, rank, world_size):
    """dcp.load every entry of ``state`` from ``path``; returns the world size that saved it.

    On the same world size every rank gets back its own RNG stream. On another one the streams cannot be dealt out
    again (there are more or fewer of them), so no rank loads one: each seeds a new stream from --seed, its rank and
    the step. Everything else loads on any world size (DCP reshards the model and optimizer; the data position is
    global)."""
    saved = dcp.FileSystemReader(path).read_metadata().state_dict_metadata  # "rng_rank1.cpu", "app.model.head.weight"
    saved_world = len({key.split(".")[0] for key in saved if key.startswith("rng_rank")})
    rng_key = f"rng_rank{rank}"
    dcp.load({k: v for k, v in state.items() if k != rng_key or saved_world == world_size}, checkpoint_id=path)
    if saved_world != world_size:
        torch.manual_seed(args.seed + 7919 * (rank + 1) + 104729 * state["train"].step)
    return saved_world


def complete_checkpoints(folder):
    """{step: path} of the step-N/ folders whose .metadata exists: DCP writes it last, once every rank has written."""
    return {int(p.name[5:]): p for p in Path(folder).glob("step-*") if p.name[5:].isdigit()
            and (p / ".metadata").is_file()}


def resume_path(args):
    if args.resume == "none":
        return None
    if args.resume == "latest":
        found = complete_checkpoints(args.checkpoint_dir)
        return found[max(found)] if found else None
    if not (Path(args.resume) / ".metadata").is_file():
        sys.exit(f"--resume {args.resume!r} is not a complete DCP checkpoint folder (no .metadata in it)")
    return Path(args.resume)


def save_checkpoint(state, step, save_group, args):
    """Save ``state`` to <checkpoint-dir>/step-<step>/ (every rank its own shards); returns the async save in flight."""
    checkpoint_id = Path(args.checkpoint_dir) / f"step-{step}"
    if args.async_save:  # copies the state to memory, then writes in a background thread
        return dcp.async_save(state, checkpoint_id=checkpoint_id, process_group=save_group)
    dcp.save(state, checkpoint_id=checkpoint_id)
    return None


def load_initial_weights(model, path):
    """Weights from a seed checkpoint (DCP: each rank reads its own shards) or a full .pt file (read by rank 0 and
    sent to every rank's shards with broadcast_from_rank0)."""
    if Path(path).is_dir():
        state = {"model": get_model_state_dict(model)}
        dcp.load(state, checkpoint_id=path)
        set_model_state_dict(model, state["model"])
    else:
        full = torch.load(path, map_location="cpu", weights_only=True) if dist.get_rank() == 0 else {}
        set_model_state_dict(model, full, options=StateDictOptions(full_state_dict=True, broadcast_from_rank0=True))
