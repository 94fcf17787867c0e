"""Statements the workbook once made and must not make again (issue 18): each was wrong on torch 2.8+."""

from __future__ import annotations

import re
from pathlib import Path

import nbformat
import pytest

ROOT = Path(__file__).resolve().parents[2]


def corpus() -> str:
    """Every notebook's sources, the scripts' help texts and the README, whitespace folded (prose wraps lines)."""
    parts = [(ROOT / "README.md").read_text()]
    parts += [p.read_text() for p in sorted((ROOT / "tutorial_lib" / "lessons").glob("*.py"))]
    for path in sorted((ROOT / "notebooks").glob("[0-9][0-9]_*.ipynb")):
        parts += [c.source for c in nbformat.read(path, as_version=4).cells]
    return re.sub(r"\s+", " ", "\n".join(parts))


WRONG = {
    "NCCL's default collective timeout is 10 minutes, and its watchdog is not silent":
        r"30 minutes\*?\*? with no message|default 30-minute collective timeout|waits 30 minutes silently|"
        r"torch's default is 30 minutes\"",
    "fp16 rounds to 0 below about 3e-8, not below its smallest subnormal 6e-8":
        r"smallest value is about 6e-8, anything smaller becomes exactly 0|fall below 6e-8 and become 0",
    "a 1e-5 loss weight slows AdamW in fp32 too (eps=1e-8)": r"so fp32 learns as before",
    "set_device(RANK) is seed 000 §2.2 and seed 001 §3.1": r"set_device\(RANK\)` \(seed 000 §3\.2\)",
    "the 8-bit optimizer is seed 000 §5.2": r"from bitsandbytes import optim` \(001",
    "seed 000 already uses torch.amp.autocast": r"`torch\.cuda\.amp\.autocast\(\)` \(seed 000",
    "global ranks are unique: set_device(RANK) never puts two ranks on one GPU":
        r"or worse, when a node has more GPUs than ranks, silently puts two ranks on one GPU",
    "c10d's join timeout is 600 s; say the number": r"default wait is several minutes",
    "the checklist says which rows only explain": r"shown failing, and the fix \|",
    "FSDP1's FULL_SHARD keeps the root gathered after forward: FSDP2's default, not reshard_after_forward=True":
        r"\"FULL_SHARD\": \"fully_shard\(m, reshard_after_forward=True\)",
    "an int reshard_after_forward=k leaves each rank 1/k of a unit, not k/N": r"`k/N` of the unit's memory",
}


@pytest.mark.parametrize("why", sorted(WRONG))
def test_a_corrected_statement_does_not_come_back(why):
    match = re.search(WRONG[why], corpus())
    assert match is None, f"{why}: found {match.group(0)!r}"
