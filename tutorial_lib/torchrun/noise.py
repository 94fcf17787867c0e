"""What a torch version prints that teaches nothing, and the lines a cell can do without (``output.log`` keeps all).

Read by the launcher's output pump (what the cell shows) and the doctor (what is evidence).
"""

from __future__ import annotations

import re

from .stacks import CHAINED_HEADER, STACK_BODY, STACK_HEADER

# Lines a torch version prints that teach nothing and that the learner cannot act on. They stay in output.log;
# the cell does not show them. torch 2.8: gloo reports each rank's connections ("[Gloo] Rank 0 is connected to
# 1 peer ranks. Expected number of connected peer ranks is : 1"), and DCP's own filesystem.py warns about
# TypedStorage on every save (Python's warning line, then the source line it points at). torch.profiler (kineto):
# torch 2.13 logs "USDT:<time> <pid>:<tid> SyncActivityProfilerHandler.cpp:52] profiler_start" (and _stop) at each
# start and stop; torch 2.8's CUDA wheel on a machine without a GPU logs "ERROR:<time> <pid>:<tid>
# DeviceProperties.cpp:47] gpuGetDeviceCount failed with code 35" when a profiler starts.
_VERSION_NOISE = re.compile(r"^\[Gloo\] Rank \d+ is connected to \d+ peer ranks|"
                            r"torch/distributed/checkpoint/filesystem\.py:\d+: UserWarning: TypedStorage is deprecated|"
                            r"^USDT:.* SyncActivityProfilerHandler\.cpp:\d+\] profiler_(start|stop)$|"
                            r"^ERROR:.* DeviceProperties\.cpp:\d+\] gpuGetDeviceCount failed with code \d+$")


def is_noise(text: str) -> bool:
    """Whether a rank's output line is noise a torch version adds (kept in the log, not shown)."""
    return _VERSION_NOISE.search(text) is not None


# torchrun's own log lines that repeat what the launcher says when it reports the failure (they stay in output.log).
_AGENT_REPEATS = re.compile(r"\] failed \(exitcode: -?\d+\) local_rank: \d+|no error file defined for parent|"
                            r"\] Sending process \d+ closing signal SIG")


class NoiseFilter:
    """``hide(rank, text)``: True for lines the screen does without (``output.log`` keeps them all).

    Version noise; the source line Python prints under a noisy warning; ``faulthandler`` stack dumps (the ranks
    print them when the launcher asks at a timeout and when torchrun stops them after a failure): the error the
    launch raises, its failure box and the doctor say where each rank was, in one line per rank; the body of a
    rank's Python traceback (the cell shows its exception line, the cause; the frames are in ``output.log`` and
    in the raised error); torchrun's own "failed (exitcode ...)" lines, which the launcher's failure line repeats.
    ``kind(rank, text)`` says which a hidden line is: version noise is no evidence of anything, so the error
    reports' per-rank tails leave it out too (a DCP warning printed after a rank's last words must not become
    "what the rank was doing"); the other kinds stay in the tails.
    """

    VERSION, STACK, TRACEBACK, AGENT = "version", "stack", "traceback", "agent"

    def __init__(self) -> None:
        self._after_warning: set[int | None] = set()
        self._in_dump: set[int | None] = set()
        self._in_traceback: set[int | None] = set()
        self._after_exception: set[int | None] = set()
        self.traceback_lines = 0  # hidden so far: the launcher says where they are

    def kind(self, rank: int | None, text: str) -> str | None:
        """``"version"``, ``"stack"``, ``"traceback"``, ``"agent"`` or ``None`` (a line to show). Call once per
        line, in order."""
        if rank is not None and text.startswith("Extension modules: "):  # faulthandler's list after a fatal error
            return self.STACK
        if rank is not None and STACK_HEADER.match(text):
            self._in_dump.add(rank)
            return self.STACK
        if rank in self._in_dump:
            if STACK_BODY.match(text):
                return self.STACK
            self._in_dump.discard(rank)
        if rank is not None and text.startswith("Traceback (most recent call last):"):
            self._in_traceback.add(rank)
            self.traceback_lines += 1
            return self.TRACEBACK
        if rank in self._in_traceback:
            if not text.strip() or text[0].isspace() or CHAINED_HEADER.match(text):
                self.traceback_lines += 1
                return self.TRACEBACK  # a frame, its source line, its ^^^ marker, or a chained exception's header
            self._in_traceback.discard(rank)  # the exception line: the cause, shown
            self._after_exception.add(rank)
            return None
        if rank in self._after_exception:
            if not text.strip() or CHAINED_HEADER.match(text):  # a chained exception's header, before its traceback
                self.traceback_lines += 1
                return self.TRACEBACK
            self._after_exception.discard(rank)
        if rank in self._after_warning:
            self._after_warning.discard(rank)
            if text.startswith("  "):
                return self.VERSION
        if is_noise(text):
            if "Warning:" in text:
                self._after_warning.add(rank)
            return self.VERSION
        if rank is None and _AGENT_REPEATS.search(text):
            return self.AGENT
        return None

    def hide(self, rank: int | None, text: str) -> bool:
        """Whether the screen leaves this line out (``kind`` is not ``None``)."""
        return self.kind(rank, text) is not None
