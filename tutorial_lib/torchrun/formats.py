"""The text formats of what torchrun, Python and the process groups print into a rank's output, as patterns: the one
place they are written down (the readers here use them, and so do the launcher, the doctor and the run readers, by
name). Each was read from torch 2.8's and 2.13's output on this machine (tests/fixtures/run_dirs/ holds both).
"""

from __future__ import annotations

import re

# torchrun's ranks per node on its command line (command.txt): --nproc-per-node N, --nproc_per_node=N.
NPROC_PER_NODE_ARG = re.compile(r"--nproc[-_]per[-_]node[ =](\d+)")
# A Python exception's last line ("ValueError: bad batch", "torch.OutOfMemoryError: ...", "KeyboardInterrupt:").
EXCEPTION_LINE = re.compile(r"^([A-Za-z_][\w.]*(Error|Exception|Interrupt|Exit)|[\w.]*(Error|Exception)):")
# Every exception line in a process's stderr (torch.multiprocessing's children: "ValueError: boom", one per line).
EXCEPTION_LINES = re.compile(r"^(?:\w+\.)*\w+(?:Error|Exception|Interrupt|Exit)\b.*$", re.M)
# A line that says an error happened, for the printer that thins a flood: an exception's line or faulthandler's header.
ERROR_LINE = re.compile(r"^([A-Za-z_][\w.]*)?(Error|Exception|Interrupt)\b.*: |^Fatal Python error")
# The first line of a Python traceback.
TRACEBACK_START = re.compile(r"^Traceback \(most recent call last\)|^Traceback", re.M)
# torchrun's own exception when a worker failed (its failure summary follows).
CHILD_FAILED = "ChildFailedError"
# A frame of a faulthandler dump ('  File "train.py", line 12 in main': no comma before "in", unlike a traceback's).
FAULTHANDLER_FRAME = re.compile(r'\s*File "(?P<path>[^"]+)", line (?P<line>\d+) in (?P<function>\S+)')
# A frame of torch.compile's own machinery (dynamo tracing; inductor generating and building kernels).
COMPILER_FRAME = re.compile(r'File "[^"]*torch[/\\]_(dynamo|inductor)[/\\]')
# A frame of either ('  File "train.py", line 12, in main' or '  File "train.py", line 12 in main'), anywhere in a
# line (torch prefixes its ranks' tracebacks with "[rank1]:"; dynamo's "from user code:" frames are written so too).
ANY_FRAME = re.compile(r'File "(?P<path>[^"]+)", line (?P<line>\d+),? in (?P<function>\S+)')
# A frame of a Python traceback ('  File "train.py", line 12, in main'): the line after it is the frame's source
# code, never a message ('raise RuntimeError(f"Missing key in checkpoint state_dict: {fqn}.")' is code).
TRACEBACK_FRAME = re.compile(r'^\s*File "[^"]*", line \d+, in ')
# The lines of a faulthandler dump: its thread headers, its frames, the blank line that ends it.
STACK_LINE = re.compile(r'^(Current thread 0x|Thread 0x|\s+File "|\s*$)')
# Python's report of a file it cannot parse: '  File "train.py", line 12' (no ", in function": no frame ran), the
# line, a caret, then the error; a traceback ends so when the file is a module the script imports.
SYNTAX_ERROR_LINE = re.compile(r"^\s*(SyntaxError|IndentationError|TabError): ")
SYNTAX_FILE_LINE = re.compile(r'^\s*File "(?P<path>[^"]+)", line (?P<line>\d+)\s*$')
# Lines that are noise for the doctor, not evidence: C++ log lines (TORCH_CPP_LOG_LEVEL=INFO: "[I1130 03:28:12.47
# file.cpp:887] ..."), the fingerprints TORCH_DISTRIBUTED_DEBUG=DETAIL logs for every collective, and gloo's
# connection report (torch 2.8).
DOCTOR_NOISE = re.compile(r"^(\[rank\d+\]:)?\[[IWV]\d{4} |Running collective: CollectiveFingerPrint|"
                          r"^\[Gloo\] Rank \d+ is connected to")
# TORCH_DISTRIBUTED_DEBUG=DETAIL's error: "Rank 1 is running collective: CollectiveFingerPrint(SequenceNumber=9,
# OpType=ALLREDUCE, TensorShape=[64, 64], ..." (what it decodes of the peer's call can be garbled: not read).
COLLECTIVE_FINGERPRINT = re.compile(r"Rank (?P<rank>\d+) is running collective: CollectiveFingerPrint\("
                                    r"SequenceNumber=\d+, OpType=(?P<op>\w+), TensorShape=\[(?P<shape>[\d, ]*)\]")
