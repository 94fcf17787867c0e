"""This machine's torch, measured in the kernel: what a lesson claims, checked where the learner runs it.

The rule: these modules ask the installed torch and the hardware a question and return the answer as a value
(``env``: versions, backends, GPUs and their peer access; ``precision``: the dtype each op runs in under autocast;
``attention``: which SDPA backends exist and how fast each is; ``ports``: TCP ports free for a program to bind, below
the kernel's ephemeral range). They run in this process: they start no process,
display nothing, and import only ``errors`` from the package. ``env``'s report never raises.
"""

# tl.probes: the questions a notebook asks this machine's torch (tl.probes.autocast_op_dtypes(...))
from .attention import sdpa_backends
from .env import EnvironmentReport, environment_report
from .precision import autocast_op_dtypes, autocast_supported, cpu_low_precision_flags, float_formats

__all__ = ["EnvironmentReport", "autocast_op_dtypes", "autocast_supported", "cpu_low_precision_flags",
           "environment_report", "float_formats", "sdpa_backends"]
