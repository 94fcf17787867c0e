"""The plan of a launch: every command, environment and folder it will use, worked out from its spec alone.

``plan_launch(spec)`` is pure: it validates the spec, resolves the device, and builds each node's torchrun command
and environment, and it writes nothing, binds no socket and starts nothing. The start step
(``tutorial_lib.launcher.job.RunningJob.start``) then picks the port, hosts the rendezvous, writes ``command.txt`` and
starts the processes. The command builders are unit-tested without launching, as accelerate does for its launchers.
"""

from __future__ import annotations

import ast
import dataclasses
import os
import shlex
import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from ..runs.rundir import METRICS_SUBDIR, node_log_dir, observed_dir
from .devices import DevicePlan, node_visible_devices
from .environment import build_env, with_observer
from .spec import LaunchSpec
from .warm import warm_enabled

LOOPBACK = "127.0.0.1"
# Every rank runs its script through this file (``python -u rank_runner.py SCRIPT ARGS``): exactly what
# ``python SCRIPT ARGS`` does, then a clean exit past gloo's teardown abort, stacks on SIGUSR1/SIGTERM, and
# death with torchrun. See its docstring.
RANK_RUNNER = Path(__file__).resolve().parent.parent / "child" / "rank_runner.py"


@dataclass(frozen=True)
class LaunchPlan:
    """What ``launch`` will start, decided before anything runs (``plan_launch``).

    Attributes:
        spec: the launch's ``LaunchSpec``.
        device_plan: device, backend and ranks per node (``resolve_device``).
        script: the script, as an absolute path.
        run_dir: the run directory (``spec.run_dir``, else the script's folder; ``launch`` first gives a script outside
            a lesson's run directory a fresh one), absolute.
        cwd: the ranks' (and torchrun's) working folder (``spec.cwd``, else the script's folder), absolute.
        nodes: the node ranks this launch starts (``spec.start_nodes``, else every node).
        job_env: the environment of the job (``build_env``): torchrun's and every rank's; with ``spec.observe``, the
            folder of the ranks' records (``with_observer``: ``<run_dir>/observed``).
        node_envs: each started node's environment (``job_env`` plus, on several CUDA nodes, its own slice of the
            GPUs).
        warm: whether to start the job from the kernel's warm-start helper (``spec.warm``, else
            ``$TUTORIAL_LIB_WARM``): decided here, once; the start step falls back to cold starts, saying why,
            when the helper cannot serve the job.
    """

    spec: LaunchSpec
    device_plan: DevicePlan
    script: Path
    run_dir: Path
    cwd: Path
    nodes: tuple[int, ...]
    job_env: Mapping[str, str]
    node_envs: Mapping[int, Mapping[str, str]]
    warm: bool

    def node_log_dir(self, node: int) -> Path:
        """torchrun's ``--log-dir`` of node ``node``."""
        return node_log_dir(self.run_dir, node, self.spec.nnodes)

    def commands(self, port: int) -> dict[int, list[str]]:
        """Each started node's torchrun argv with rendezvous port ``port`` (``build_command``)."""
        spec = self.spec
        return {node: build_command(self.script, spec.args, self.device_plan, master_port=port,
                                    log_dir=self.node_log_dir(node), max_restarts=spec.max_restarts,
                                    nnodes=spec.nnodes, rendezvous_id=self.run_dir.name,
                                    rendezvous_timeout_s=spec.rendezvous_timeout_s)
                for node in self.nodes}

    def command_txt(self, commands: Mapping[int, Sequence[str]], base: Mapping[str, str] | None = None) -> str:
        """The text of ``command.txt``: each node's command as a shell line to rerun it by hand (``command_text``;
        the variables shown are those that differ from ``base``, this process's environment by default)."""
        base = os.environ if base is None else base
        # The ranks run in cwd (the cd); when that is not the run directory, say where the launch's own files went.
        where = "" if self.cwd == self.run_dir else f"# ranks run in {self.cwd}; logs, metrics, run.json: {self.run_dir}\n"
        return where + "".join((f"# node {node}\n" if self.spec.nnodes > 1 else "")
                               + command_text(commands[node], self.node_envs[node], self.cwd, base) for node in self.nodes)

    def shape(self, start: str) -> dict:
        """The job's shape, in every run.json (the doctor reads it); ``start``: ``"warm"`` or ``"cold"``."""
        return dict(nnodes=self.spec.nnodes, nproc_per_node=self.device_plan.nproc_per_node,
                    device=self.device_plan.device, start=start)


def plan_launch(spec: LaunchSpec) -> LaunchPlan:
    """Validate ``spec`` and work out what its launch will start; pure (nothing is written, bound or started).

    Raises:
        ConfigError: a bad field of ``spec``, or a bad ``$TUTORIAL_LIB_WARM`` (``LaunchSpec.validate``).
    """
    device_plan = spec.validate()
    warm = warm_enabled(spec.warm)
    script = Path(spec.script).resolve()
    run_dir = Path(spec.run_dir).resolve() if spec.run_dir is not None else script.parent
    cwd = spec.working_folder()
    if cwd != run_dir and declares_option(script, METRICS_FLAG) and not any(
            str(a).split("=")[0] == METRICS_FLAG for a in spec.args):
        # A lesson copied into the learner's folder runs there, but its per-step metrics go to this run's directory:
        # one file per run, never appended to the last run's in the learner's folder.
        spec = dataclasses.replace(spec, args=[*spec.args, METRICS_FLAG, str(run_dir / METRICS_SUBDIR)])
    nodes = tuple(spec.start_nodes) if spec.start_nodes is not None else tuple(range(spec.nnodes))
    job_env = build_env(device_plan, spec.env, shutdown_grace_s=spec.shutdown_grace_s, max_restarts=spec.max_restarts)
    job_env = with_observer(job_env, observed_dir(run_dir) if spec.observe else None)  # the ranks' observer, or none
    node_envs = {}
    for node in nodes:
        env = node_envs[node] = dict(job_env)
        if spec.nnodes > 1 and device_plan.device == "cuda":  # each simulated node its own GPUs
            env["CUDA_VISIBLE_DEVICES"] = node_visible_devices(job_env, node, device_plan.nproc_per_node,
                                                               device_plan.gpu_count)
    return LaunchPlan(spec, device_plan, script, run_dir, cwd, nodes, job_env, node_envs, warm)


def build_command(script: str | os.PathLike, args: Sequence[object], plan: DevicePlan, *, master_port: int,
                  log_dir: str | os.PathLike, max_restarts: int = 0, python: str | None = None,
                  nnodes: int = 1, rendezvous_id: str = "tutorial_lib", rendezvous_timeout_s: float = 60.0) -> list[str]:
    """The torchrun argv of one node on loopback; pure (launches nothing).

    ``--redirects 3`` sends each worker's stdout and stderr to its own files under ``log_dir`` and nowhere else
    (``<log_dir>/<run id>_*/attempt_<N>/<local rank>/stdout.log``, ``stderr.log``): the launcher reads each rank's
    lines from them (``tutorial_lib.torchrun.rank_logs``), so torchrun's own output holds only its own lines. (``--tee
    3`` would also copy them to torchrun's output behind a ``[default<local rank>]:`` prefix, which a rank can print
    too: a line of rank 0 could pass for rank 1's.) Each worker runs ``RANK_RUNNER SCRIPT ARGS``
    (``tutorial_lib/child/rank_runner.py``: the script as ``python SCRIPT ARGS`` runs it, then a clean exit). The
    rendezvous:

    * one node, no restarts: static (``--master-addr``/``--master-port``);
    * one node with ``max_restarts > 0``: ``c10d`` on ``127.0.0.1:master_port``. The static rendezvous
      hands every attempt the same store keys, so a restarted group read the dead attempt's gloo
      addresses ("Gloo connectFullMesh failed ... Connection refused") or hung (torch 2.8 and 2.13: 1 and 2
      of 5 restarts recovered); c10d starts each attempt in a fresh round, with
      ``TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1`` (``build_env``; pytorch/pytorch#135712). ``is_host=true``: the agent
      hosts the store, and fails (EADDRINUSE) where the port is taken; left to guess, torch's c10d backend would
      connect to whatever listens there as a client, another job's store included;
    * ``nnodes > 1``: every agent joins the ``c10d`` rendezvous at ``127.0.0.1:master_port`` as a client
      (``is_host=false``: the launcher hosts that store, so it outlives every agent) and waits at most
      ``rendezvous_timeout_s`` for the others (``join_timeout``); node ranks follow arrival order.
    """
    if nnodes > 1:
        rendezvous = ["--nnodes", str(nnodes), "--rdzv-backend", "c10d",
                      "--rdzv-endpoint", f"{LOOPBACK}:{master_port}", "--rdzv-id", rendezvous_id,
                      "--rdzv-conf", f"is_host=false,join_timeout={rendezvous_timeout_s:g}"]
    elif max_restarts > 0:
        rendezvous = ["--nnodes", "1", "--rdzv-backend", "c10d", "--rdzv-endpoint", f"{LOOPBACK}:{master_port}",
                      "--rdzv-id", rendezvous_id, "--rdzv-conf", "is_host=true"]
    else:
        rendezvous = ["--nnodes", "1", "--master-addr", LOOPBACK, "--master-port", str(master_port)]
    return [
        python or sys.executable, "-m", "torch.distributed.run",
        *rendezvous,
        "--nproc-per-node", str(plan.nproc_per_node),
        "--max-restarts", str(max_restarts),
        "--log-dir", str(log_dir),
        "--redirects", "3",
        str(RANK_RUNNER), str(script), *map(str, args),
    ]


def command_text(command: Sequence[str], env: Mapping[str, str], cwd: Path, base: Mapping[str, str]) -> str:
    """A shell line that reruns the launch by hand: ``cd`` to the ranks' working folder ``cwd`` + the variables the
    launcher set + argv."""
    changed = {k: v for k, v in env.items() if base.get(k) != v}
    assignments = " ".join(f"{k}={shlex.quote(v)}" for k, v in sorted(changed.items()))
    return f"cd {shlex.quote(str(cwd))} && {assignments} {shlex.join(command)}\n"


def command_port(command: Sequence[str]) -> int | None:
    """The rendezvous port of a torchrun command built by ``build_command`` (``--master-port`` or the port of
    ``--rdzv-endpoint``); ``None`` if it has neither."""
    for flag, value in zip(command, command[1:]):
        if flag == "--master-port":
            return int(value)
        if flag == "--rdzv-endpoint":
            return int(value.rsplit(":", 1)[1])
    return None


METRICS_FLAG = "--metrics-dir"  # the lessons' option for where each rank writes its metrics JSON lines


def declares_option(script: str | os.PathLike, option: str) -> bool:
    """Whether ``script``'s source passes ``option`` (``"--metrics-dir"``) to a call (argparse's ``add_argument``),
    read with ``ast`` without running it; ``False`` for a file that cannot be read or parsed."""
    try:
        tree = ast.parse(Path(script).read_text())
    except (OSError, SyntaxError, ValueError):
        return False
    return any(isinstance(node, ast.Call) and any(isinstance(a, ast.Constant) and a.value == option for a in node.args)
               for node in ast.walk(tree))
