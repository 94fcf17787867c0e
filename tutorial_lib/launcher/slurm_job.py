"""Launch on SLURM: the same ``LaunchSpec`` submitted with ``sbatch`` through the batch script a learner would submit
by hand (``tl.slurm.slurm_script``), watched from the kernel through the files the job writes on the shared filesystem.

``launch(LaunchSpec(script, nnodes=2, slurm=SlurmSpec(...)))`` comes here: ``plan_slurm_launch``, then a
``SubmittedJob`` (the job interface, ``interface.Job``) driven by the one run loop every launch goes through
(``tutorial_lib.launcher.run.run_job``), which builds the error once with what this job knows (its ``SlurmJob``, the
node a failed rank ran on, how SLURM ended it, that it was cancelled, that it can never start).

The run directory, which must be on the filesystem every node shares (it is the job's ``--chdir``), then holds what a local launch leaves: ``command.txt`` (the sbatch command and the batch script, also
written as ``job.sh``), ``output.log`` (every rank's lines as ``[rank R] ...``, each node's torchrun's as ``[torchrun
node N] ...``, the batch script's own as ``[batch] ...``),
``logs/node<N>/`` (node N's torchrun ``--log-dir``: N is SLURM's index of the node, ``$SLURM_NODEID``; torchrun's node
rank, ``GROUP_RANK``, comes from the c10d rendezvous and may differ), ``metrics/`` and ``run.json`` (with
``slurm_job``), plus SLURM's own files ``<job>-<id>.out`` (the batch script) and ``<job>-<id>-node<N>.out`` (node N's
torchrun's own lines; its ranks' are in their files under ``logs/node<N>/``, ``--redirects 3``).

While the job waits in the queue the view says so, with SLURM's reason (``live.Queued``: "pending: SLURM job N waits
in the queue (Resources)"); a reason after which it never starts (``NeverStarts``: 64 CPUs per task on 2-CPU nodes is
``PartitionConfig``) has it cancelled at the first look and a ``LaunchError`` naming the job, the reason and what to
change; a job sbatch refuses leaves run.json with status ``refused`` and sbatch's message (the doctor shows both).
While the job runs the cell shows each change of its state and pending reason (``squeue``), every rank's output
(each rank's torchrun log files under ``logs/node<N>/`` and each node's torchrun output tailed as they grow, through
the same ``OutputPump`` and printer as a local launch: a rank's lines are attributed by the file they are in) and the
live loss and memory figure from the metrics files. Memory is the tensor bytes the scripts log per step: the ranks
run on other machines, so the kernel samples no RSS or GPU memory (``LaunchResult.memory_notes`` says so).

It ends as a local launch does: ``LaunchResult`` (with ``job``, a ``SlurmJob``), ``LaunchError`` naming the rank that
failed first (each node's root cause from that node's own output file and ``logs/node<N>/``, the earliest error file
across them: ``first_failure_of_nodes``), or ``LaunchTimeout``. At a limit every rank is asked for its Python stack
first: ``scancel --signal=USR1 JOBID`` signals every process of the job's steps; each node's torchrun ignores
SIGUSR1 (the batch script's ``trap``: it would die of it), and every rank's runner (``child/rank_runner.py``, which
runs each rank's script here as locally) prints its stack with ``faulthandler``. Then, as on a kernel interrupt,
``scancel`` and a wait until the job has left the queue: SLURM stops every process of it (SIGTERM, then SIGKILL
after ``KillWait``). A job whose kernel was killed outright runs on until its ``--time`` limit.
"""

from __future__ import annotations

import os
import re
import time
from dataclasses import dataclass
from pathlib import Path

from ..errors import ConfigError, LaunchError, SlurmError
from ..i18n import N_, Message
from ..runs.metrics import JsonlTail
from ..runs.rundir import COMMAND_TXT, LOGS, METRICS_SUBDIR, OUTPUT_LOG, RunRecord, RunStatus
from ..slurm.batch import slurm_script, time_limit
from ..slurm.commands import (JobInfo, JobState, SlurmJob, cancel, client_env, expand_hostlist, job_info, node_cpus,
                              run_slurm, submit)
from ..slurm.target import CANNOT_START, Request, what_to_change
from ..torchrun.output_lines import BATCH_LABEL
from ..torchrun.root_cause import RankFailure
from ..torchrun.stacks import STACK_HEADER, stacks_by_rank
from .devices import DevicePlan
from .environment import rank_env
from .interface import Job, LimitReached, Stopped
from .job import STACK_DUMP_WAIT_S, limit_reached, sigint_deferred
from .live import Outcome, Queued, safe_draw
from .outcome import when_stopped
from .output import OutputPump, ThrottledPrinter
from .plan import RANK_RUNNER, command_text
from .spec import LaunchSpec

JOB_SCRIPT = "job.sh"
BATCH_PREFIX = BATCH_LABEL  # the batch script's own lines in output.log
_SRUN_TASK = re.compile(r"^srun: error: (?P<host>\S+): task (?P<task>\d+): (?P<what>.*)$")
CANCEL_TIMEOUT_S = 120.0  # the longest wait for a cancelled job to leave the queue (KillWait is 30 s by default)


@dataclass(frozen=True)
class SlurmPlan:
    """What a ``SubmittedJob`` will submit, decided before anything runs (``plan_slurm_launch``; writes nothing).

    Attributes:
        spec: the launch's ``LaunchSpec`` (``spec.slurm`` set).
        device_plan: the nodes' device, backend and ranks per node.
        script: the training script, absolute; run_dir: the run directory (the job's ``--chdir``), absolute.
        nodes: ``range(nnodes)``: SLURM's node indices.
        job_env: the environment sbatch exports to the job (this process's, the rank environment, ``spec.env``,
            ``SLURM_CONF`` when ``SlurmSpec.conf`` is given).
        job_name: ``--job-name``, the prefix of SLURM's output files.
        batch_script: the text of ``job.sh`` (``tl.slurm.slurm_script``).
        sbatch_argv: the sbatch command, ``job.sh`` last.
    """

    spec: LaunchSpec
    device_plan: DevicePlan
    script: Path
    run_dir: Path
    nodes: tuple[int, ...]
    job_env: dict[str, str]
    job_name: str
    batch_script: str
    sbatch_argv: list[str]

    @property
    def conf(self) -> str | os.PathLike | None:
        """The ``slurm.conf`` the SLURM commands read (``None``: the environment's or the system's)."""
        return self.spec.slurm.conf

    def node_log_dir(self, node: int) -> Path:
        """Node ``node``'s torchrun ``--log-dir``: ``logs/node<N>`` (the batch script's ``$SLURM_NODEID``)."""
        return self.run_dir / LOGS / f"node{node}"

    @property
    def cwd(self) -> None:
        """The ranks' working folder as the live view names it: none apart (the job's ``--chdir`` is ``run_dir``)."""
        return None

    def node_output(self, job_id: int, node: int) -> Path:
        """Node ``node``'s torchrun's own output (srun's ``--output=%x-%j-node%n.out``; its ranks' lines are in their
        files under ``node_log_dir``)."""
        return self.run_dir / f"{self.job_name}-{job_id}-node{node}.out"

    def batch_output(self, job_id: int) -> Path:
        """The batch script's own output (sbatch's ``--output=%x-%j.out``)."""
        return self.run_dir / f"{self.job_name}-{job_id}.out"

    def shape(self, start: str) -> dict:
        """The job's shape, in run.json."""
        return dict(nnodes=self.spec.nnodes, nproc_per_node=self.device_plan.nproc_per_node,
                    device=self.device_plan.device, start=start)

    def command_txt(self) -> str:
        """``command.txt``: the sbatch command as a shell line (with the variables that differ from this process's
        environment), then the batch script."""
        line = command_text(self.sbatch_argv, self.job_env, self.run_dir, os.environ)
        return f"{line}# {JOB_SCRIPT}, submitted by the line above:\n{self.batch_script}"


def plan_slurm_launch(spec: LaunchSpec) -> SlurmPlan:
    """Validate ``spec`` (``spec.slurm`` set) and work out the batch script and the sbatch command; pure.

    Raises:
        ConfigError: a bad field of ``spec`` or of ``spec.slurm``, before anything is submitted.
    """
    device_plan = spec.validate()
    slurm = spec.slurm
    script = Path(spec.script).resolve()
    run_dir = Path(spec.run_dir).resolve() if spec.run_dir is not None else script.parent
    job_name = slurm.job_name or (re.sub(r"[^A-Za-z0-9._-]", "_", script.stem)[:64] or "job")
    batch = slurm_script(str(RANK_RUNNER), [str(script), *map(str, spec.args)], nnodes=spec.nnodes,
                         nproc_per_node=device_plan.nproc_per_node, gpus_per_node=slurm.gpus_per_node,
                         partition=slurm.partition, account=slurm.account,
                         time_limit=slurm.time_limit or time_limit(spec.timeout_s), cpus_per_task=slurm.cpus_per_task,
                         job_name=job_name, run_dir=run_dir, rendezvous_port=None, max_restarts=spec.max_restarts,
                         socket_ifname=slurm.socket_ifname, torchrun=slurm.torchrun_command(),
                         rendezvous_timeout_s=spec.rendezvous_timeout_s)
    env = client_env(slurm.conf, {**os.environ, **rank_env(), **spec.env})
    return SlurmPlan(spec, device_plan, script, run_dir, tuple(range(spec.nnodes)), env, job_name, batch,
                     ["sbatch", "--parsable", *slurm.sbatch_args, JOB_SCRIPT])


def node_exit_codes(batch_lines: list[str], nodes: tuple[int, ...], job_exit_code: int | None) -> dict[int, int]:
    """Each node task's exit status from srun's ``srun: error: <host>: task <N>: Exited with exit code <C>`` lines
    (one task per node: task N is node N; another ending, e.g. a signal, counts as 1); a node srun says nothing of
    exited 0. If srun named none, every node gets the job's exit code (0 when unknown)."""
    codes = {node: 0 for node in nodes}
    named = False
    for line in batch_lines:
        m = _SRUN_TASK.match(line.removeprefix(BATCH_PREFIX))
        if m is not None and int(m["task"]) in codes:
            exit_code = re.match(r"Exited with exit code (\d+)", m["what"])
            codes[int(m["task"])], named = int(exit_code.group(1)) if exit_code else 1, True
    return codes if named else {node: job_exit_code or 0 for node in nodes}


class CannotStart(Exception):
    """The job is pending for a ``NeverStarts`` reason of ``SlurmSpec.cancel_pending_reasons`` (``info``: what squeue
    said; ``info.never_starts`` is the reason)."""

    def __init__(self, info: JobInfo) -> None:
        super().__init__(info.reason)
        self.info = info


class FileTail:
    """The complete lines appended to a file since the last read (the file may not exist yet)."""

    def __init__(self, path: Path) -> None:
        self.path, self.offset, self.partial = path, 0, b""

    def read_lines(self, final: bool = False) -> list[str]:
        """New complete lines; ``final``: the last, unterminated one too (the file is closed for good)."""
        try:
            with open(self.path, "rb") as f:
                f.seek(self.offset)
                chunk = f.read()
        except FileNotFoundError:
            return []
        self.offset += len(chunk)
        lines = (self.partial + chunk).split(b"\n")
        self.partial = lines.pop()
        if final and self.partial:
            lines.append(self.partial)
            self.partial = b""
        return [line.decode("utf-8", errors="replace").rstrip("\r") for line in lines]


class SubmittedJob(Job):
    """A launch on SLURM (``interface.Job``): the submitted job and what the kernel reads of it: its state, its output
    files, its metrics; and what it knows of its end, for the error the run loop builds once.

    Attributes:
        plan: the ``SlurmPlan``; job_id: SLURM's id; info: the last ``JobInfo`` (``None`` before the first look);
        pump: the ``OutputPump`` every node's lines go through; node_ranks: ``{node: global ranks}`` seen so far;
        command: the sbatch command; started_as: ``"cold"`` (SLURM's nodes have no warm-start helper).
    """

    def __init__(self, plan: SlurmPlan, view, printer: ThrottledPrinter) -> None:
        self.plan, self.view, self.printer = plan, view, printer
        self.command, self.started_as = plan.sbatch_argv, "cold"
        self.srun_named = False  # srun named the node task that failed (else SLURM itself ended the job)
        self.cancelled: Message | None = None  # that the launcher cancelled it, and while it did what
        self.job_id: int | None = None
        self.info: JobInfo | None = None
        self.node_names: tuple[str, ...] = ()
        self.waited_for = ""
        self.never_starts = None  # the NeverStarts reason the job was cancelled for
        self.refused: SlurmError | None = None  # sbatch's refusal of the job
        self.node_ranks: dict[int, set[int]] = {node: set() for node in plan.nodes}
        self.metrics_tail = JsonlTail(plan.run_dir / METRICS_SUBDIR, "rank*.jsonl")
        self.started_at = time.monotonic()
        self.tails: dict[int | None, FileTail] = {}
        self.pump: OutputPump | None = None

    def start(self) -> None:
        """Write ``command.txt`` and ``job.sh`` (never over existing files), open ``output.log`` and submit.

        Raises:
            ConfigError: the run directory already holds a launch, or cannot be written (nothing was submitted).
            SlurmError: sbatch refused the job (its message says why).
        """
        plan = self.plan
        try:
            for name, text in ((COMMAND_TXT, plan.command_txt()), (JOB_SCRIPT, plan.batch_script)):
                with open(plan.run_dir / name, "x") as f:
                    f.write(text)
        except FileExistsError as e:
            raise ConfigError(f"run_dir {str(plan.run_dir)!r} already holds {Path(e.filename).name}; use a new run "
                              "directory (new_run_dir) so nothing is overwritten") from None
        except OSError as e:
            raise ConfigError(f"run_dir {str(plan.run_dir)!r} is not a writable directory ({e.strerror})") from None
        self.pump = OutputPump(plan.spec.nnodes, plan.run_dir, plan.nodes, self.printer,
                               open(plan.run_dir / OUTPUT_LOG, "w"),
                               log_dirs={node: plan.node_log_dir(node) for node in plan.nodes})
        safe_draw(self.view.start)
        self.started_at = time.monotonic()
        try:
            self.job_id = submit(plan.run_dir / JOB_SCRIPT, plan.sbatch_argv[2:-1], conf=plan.conf, env=plan.job_env,
                                 cwd=plan.run_dir)
        except SlurmError as e:
            self.refused = e
            raise
        self.tails = {None: FileTail(plan.batch_output(self.job_id)),
                      **{node: FileTail(plan.node_output(self.job_id, node)) for node in plan.nodes}}
        self.printer.note(f"submitted SLURM job {self.job_id} ({plan.spec.nnodes} node(s) x "
                          f"{plan.device_plan.nproc_per_node} rank(s)); output in {plan.run_dir}")

    def elapsed(self) -> float:
        return time.monotonic() - self.started_at

    def read_output(self, final: bool = False) -> bool:
        """Pass the new lines of every output file through the pump: the batch script's, each node's torchrun's, and
        each rank's torchrun log files (``final``: the job has left the queue, the files are complete); True if any
        arrived."""
        got = False
        for node, tail in self.tails.items():
            for line in tail.read_lines(final):
                got = True
                if node is None:  # the batch script's own lines (srun's errors, SLURM's cancel notice)
                    self.pump.output_log.write(BATCH_PREFIX + line + "\n")
                    self.pump.transcript.append(BATCH_PREFIX + line)
                    self.printer.note(f"job {self.job_id} batch script: {line}")
                    continue
                self.pump.take(node, line)
        got = self.pump.read_rank_logs(final=final) or got
        for node, logs in self.pump.rank_logs.items():
            self.node_ranks[node] |= logs.ranks()
        return got

    def look(self) -> JobInfo:
        """Ask squeue for the job's state (and its nodes once it has some); say each change in the cell.

        Raises:
            SlurmError: squeue failed, or slurmctld no longer knows the job.
        """
        info = job_info(self.job_id, conf=self.plan.conf)
        if info is None:
            raise SlurmError(f"SLURM job {self.job_id} is not known to slurmctld any more (purged, or the controller "
                             "restarted without its state)")
        before = self.info
        if before is None or (before.state, before.reason) != (info.state, info.reason):
            self.waited_for = info.waiting_for or self.waited_for
            self.printer.note(f"SLURM job {self.job_id}: {info.state.value}" + (
                f", waiting: {info.waiting_for}" if info.waiting_for else f" on {info.nodes}" if info.nodes else ""))
            self.view.set_queued(Queued(self.job_id, info.waiting_for) if info.state == JobState.PENDING else None)
        if info.nodes and not self.node_names:
            self.node_names = tuple(expand_hostlist(info.nodes, conf=self.plan.conf))
        self.info = info
        return info

    def read_records(self) -> list[dict]:
        """The metrics records the ranks wrote since the last call (no loss is read from their printed lines)."""
        return self.metrics_tail.read_new()

    def wait(self) -> dict[int, int]:
        """Stream the output and the metrics until the job has finished; each node task's exit code
        (``exit_codes``).

        Raises ``LimitReached`` past ``timeout_s`` (from the submission) or ``stall_timeout_s``, ``CannotStart`` at the
        first look that finds the job pending for a reason of ``SlurmSpec.cancel_pending_reasons``."""
        spec = self.plan.spec
        cancel_for = spec.slurm.cancel_reasons()
        next_look = last_view = 0.0
        delay_s, progress_at = 0.25, None
        while True:
            self.read_output()
            elapsed = self.elapsed()
            if elapsed >= next_look:
                info = self.look()
                if info.state.finished:
                    break
                if info.never_starts in cancel_for:
                    self.never_starts = info.never_starts
                    raise CannotStart(info)
                delay_s = min(delay_s * 2, spec.slurm.poll_s)
                next_look = elapsed + delay_s
            if elapsed - last_view >= 0.25:
                last_view = elapsed
                records = self.metrics_tail.read_new()
                progress_at = elapsed if records else progress_at
                self.view.add(records)
                safe_draw(self.view.update, elapsed, [])
            if limit := limit_reached(spec, elapsed, progress_at):
                raise LimitReached(limit)
            time.sleep(0.1)
        self.read_output(final=True)  # the files are complete once the job has finished
        self.view.add(self.metrics_tail.read_new())
        return self.exit_codes(self.info)

    def exit_codes(self, info: JobInfo) -> dict[int, int]:
        """Each node task's exit code once the job has finished: 0 for every node of a job that completed; else what
        srun says of each task (``node_exit_codes``), or 1 for every node where srun named none (SLURM ended it:
        TIMEOUT, NODE_FAIL, cancelled by someone)."""
        if info.state == JobState.COMPLETED and not info.exit_code:
            return {node: 0 for node in self.plan.nodes}
        codes = node_exit_codes(self.pump.transcript, self.plan.nodes, info.exit_code)
        self.srun_named = any(codes.values())
        return codes if self.srun_named else {node: 1 for node in self.plan.nodes}

    def request_stacks(self) -> dict[int, str]:
        """Ask every rank of a running job for its Python stack (``scancel --signal=USR1``: the job's steps, where
        torchrun ignores it and each rank's runner prints its stack) and collect what they print, waiting at most
        ``STACK_DUMP_WAIT_S``, 0.5 s past the last rank's answer."""
        if self.info is None or self.info.state != JobState.RUNNING:
            return {}
        try:
            run_slurm(["scancel", "--signal=USR1", str(self.job_id)], conf=self.plan.conf)
        except SlurmError as e:
            self.printer.note(f"could not ask the ranks for their stacks: {e}")
            return {}
        mark, world = len(self.pump.ranked), set(range(self.plan.spec.nnodes * self.plan.device_plan.nproc_per_node))
        deadline = quiet_since = time.monotonic()
        deadline += STACK_DUMP_WAIT_S
        while time.monotonic() < deadline:
            if self.read_output():
                quiet_since = time.monotonic()
            answered = {rank for rank, text in self.pump.ranked[mark:] if rank is not None and STACK_HEADER.match(text)}
            if answered >= world and time.monotonic() - quiet_since > 0.5:
                break
            time.sleep(0.1)
        return stacks_by_rank(self.pump.ranked[mark:])

    def stop(self, ask_for_stacks: bool) -> Stopped:
        """Ask every rank for its stack if ``ask_for_stacks`` (``request_stacks``), then ``scancel`` the job and wait
        until it has left the queue (every process of it stopped), reading its output meanwhile; a cancel that fails
        is said with the command to end the job. A second interrupt waits until the end."""
        with sigint_deferred():
            stacks = self.request_stacks() if ask_for_stacks else {}
        try:
            with sigint_deferred():
                final = cancel(self.job_id, conf=self.plan.conf, timeout_s=CANCEL_TIMEOUT_S)
                if final is not None:
                    self.info = final
                self.read_output(final=True)
        except SlurmError as e:  # slurmctld not answering: say what is left and how to end it
            self.printer.note(f"could not cancel SLURM job {self.job_id}: {e}; cancel it with: scancel {self.job_id}")
        self.cancelled = Message(N_("SLURM job {job_id} was cancelled (scancel) while {where}"),
                                 {"job_id": self.job_id, "where": self.slurm_job().where_it_was()})
        return Stopped(sorted(stacks), stacks, None,
                       f"{self.cancelled}; it has left the queue, SLURM stopped every process of it")

    @property
    def started(self) -> bool:
        """Whether sbatch accepted the job (it has an id)."""
        return self.job_id is not None

    def not_started(self, exc: BaseException) -> None:
        """Nothing was submitted: a refusal of sbatch's is recorded (run.json's status ``refused`` with sbatch's
        message, which the doctor shows) and the view ended."""
        if self.refused is not None and exc is self.refused:
            plan, elapsed = self.plan, self.elapsed()
            said = exc.stderr or exc.message
            last = said.strip().splitlines()[-1] if said.strip() else "no message"
            headline = Message(N_("{script} was not submitted: sbatch refused the job ({said})"),
                               {"script": plan.script.name, "said": last})
            RunRecord(RunStatus.REFUSED, elapsed, **plan.shape("cold"), summary=str(headline),
                      submit_error=said).write(plan.run_dir)
            safe_draw(self.view.finish, [], Outcome(RunStatus.REFUSED, elapsed, headline))

    def slurm_job(self) -> SlurmJob | None:
        """The ``SlurmJob`` as last seen (``None`` before it was submitted)."""
        if self.job_id is None:
            return None
        info = self.info
        return SlurmJob(self.job_id, info.state.value if info else "UNKNOWN", info.reason if info else "",
                        self.node_names, {node: sorted(ranks) for node, ranks in self.node_ranks.items() if ranks},
                        info.exit_code if info else None, info.signal if info else None, self.waited_for,
                        self.never_starts)

    def said_failure(self, headline: Message, where: dict[int, str],
                     failure: RankFailure | None) -> tuple[Message, str]:
        """The launcher's headline with the node (and host) the failed rank ran on, and a summary that adds how SLURM
        ended the job; a job no node task of which failed (SLURM ended it) is named by how SLURM ended it alone."""
        info, job = self.info, self.slurm_job()
        ended = Message(N_("SLURM job {job_id} ended {state} (reason {reason}, exit code {code})"),
                        {"job_id": job.job_id, "state": info.state.value, "reason": info.reason,
                         "code": info.exit_code})
        if failure is not None and failure.rank is not None:
            node = next((n for n, ranks in job.node_ranks.items() if failure.rank in ranks), None)
            if node is not None and node < len(job.nodes):
                headline = Message(N_("{failed} on node {node} ({host})"),
                                   {"failed": headline, "node": node, "host": job.nodes[node]})
            return headline, f"{headline}{when_stopped(where)}; {ended}"
        if self.srun_named:  # torchrun itself failed on a node (its rendezvous, a bad command): the headline says which
            return headline, f"{headline}{when_stopped(where)}; {ended}"
        headline = Message(N_("{script} failed: {ended}"), {"script": self.plan.script.name, "ended": ended})
        return headline, str(headline)

    def said_stopped(self, headline: Message, summary: str) -> tuple[Message, str]:
        """The launcher's words for a job stopped at a limit, with that it was cancelled and where it was."""
        return (Message(N_("{failed}; {cancelled}"), {"failed": headline, "cancelled": self.cancelled}),
                f"{summary}; {self.cancelled}")

    def cannot_run(self, exc: BaseException, elapsed: float):
        """For a job cancelled as pending for a reason it never starts for (``CannotStart``): the ``LaunchError``
        naming the job, the reason, what it means and what to change (from the nodes ``sinfo`` lists, when it
        answers), its run.json (not yet written) and its outcome; else ``None``."""
        if not isinstance(exc, CannotStart):
            return None
        plan, reason, job = self.plan, exc.info.never_starts, self.slurm_job()
        try:
            cpus = node_cpus(conf=plan.conf, partition=plan.spec.slurm.partition)
        except SlurmError:  # what to change is then said without the nodes' figures
            cpus = {}
        request = Request(plan.spec.nnodes, plan.spec.slurm.cpus_per_task, cpus)
        headline = Message(N_("{script} cannot start: SLURM job {job_id} was pending with reason {reason} ({why}); "
                              "it was cancelled (scancel); to start it, {change}"),
                           {"script": plan.script.name, "job_id": job.job_id, "reason": reason.value,
                            "why": Message(CANNOT_START[reason]), "change": what_to_change(reason, request)})
        error = LaunchError(str(headline), run_dir=plan.run_dir, command=plan.sbatch_argv, returncode=None,
                            output_tail=self.pump.transcript[-30:], job=job, headline=headline)
        record = RunRecord(RunStatus.FAILED, elapsed, **plan.shape("cold"), summary=str(headline),
                           slurm_job=job.as_dict())
        short = Message(N_("cannot start: {reason}"), {"reason": reason.value})
        return error, record, Outcome(RunStatus.FAILED, elapsed, short)

    def close(self) -> None:
        """On every path: the last lines, ``output.log`` closed, what the printer held back shown."""
        if self.pump is None:
            return
        self.read_output(final=True)
        self.pump.close()
        self.pump.finish()
