"""A launch's plan, worked out before anything starts: commands, environment, validation, limits. Nothing is launched."""

import os
import shlex
import socket
import sys

import pytest

from tutorial_lib import ConfigError, LaunchSpec, write_script
from tutorial_lib.launcher.devices import DevicePlan, node_visible_devices
from tutorial_lib.launcher.environment import build_env
from tutorial_lib.launcher.job import free_port, limit_reached
from tutorial_lib.launcher.plan import build_command, command_text, plan_launch

CPU2 = DevicePlan("cpu", "gloo", 2, 0)


def test_command_runs_torchrun_module_on_loopback_with_each_ranks_output_in_its_own_files_and_script_args(tmp_path):
    """Issue 44: the ranks' output goes only to their own files (--redirects 3), never through torchrun's output
    behind a prefix a rank can print too (--tee)."""
    cmd = build_command(tmp_path / "x.py", ["--max-steps", 5, "--lr", 0.1], CPU2, master_port=29555,
                        log_dir=tmp_path / "logs")
    assert cmd[:3] == [sys.executable, "-m", "torch.distributed.run"]
    joined = shlex.join(cmd)
    for part in ["--nproc-per-node 2", "--master-addr 127.0.0.1", "--master-port 29555", "--max-restarts 0",
                 "--redirects 3", f"--log-dir {tmp_path / 'logs'}", "--nnodes 1"]:
        assert part in joined
    assert "--tee" not in cmd
    assert cmd[-5:] == [str(tmp_path / "x.py"), "--max-steps", "5", "--lr", "0.1"]


def test_restarts_use_the_c10d_rendezvous_so_each_attempt_gets_fresh_store_keys(tmp_path):
    """Issue 6: with the static rendezvous a restarted group read the dead attempt's gloo addresses."""
    cmd = build_command(tmp_path / "x.py", [], CPU2, master_port=29555, log_dir=tmp_path / "logs", max_restarts=1)
    joined = shlex.join(cmd)
    # is_host=true: the agent hosts the store or fails; left to guess, a taken port made it a client of whatever
    # listened there (a hang until timeout_s, seen with a plain socket on the port).
    for part in ["--rdzv-backend c10d", "--rdzv-endpoint 127.0.0.1:29555", "--rdzv-conf is_host=true",
                 "--max-restarts 1", "--redirects 3"]:
        assert part in joined
    assert "--master-port" not in joined and "--master-addr" not in joined


def test_env_is_a_copy_with_defaults_and_never_touches_os_environ(monkeypatch):
    monkeypatch.setenv("OMP_NUM_THREADS", "3")
    before = dict(os.environ)
    env = build_env(CPU2, {"EXTRA": "1"}, max_restarts=2, shutdown_grace_s=4)
    assert dict(os.environ) == before
    assert env["OMP_NUM_THREADS"] == "3", "a user's own setting wins over the default"
    assert env["PYTHONUNBUFFERED"] == "1" and env["EXTRA"] == "1"
    assert env["GLOO_SOCKET_IFNAME"] == "lo"
    assert env["TORCH_DISABLE_SHARE_RDZV_TCP_STORE"] == "1"
    assert env["TORCH_ELASTIC_SHUTDOWN_TIMEOUT"] == "4"


def test_cpu_run_on_a_gpu_machine_hides_the_gpus():
    env = build_env(DevicePlan("cpu", "gloo", 2, gpu_count=4), base={"CUDA_VISIBLE_DEVICES": "0,1"})
    assert env["CUDA_VISIBLE_DEVICES"] == "" and "NCCL_SOCKET_IFNAME" not in env
    env = build_env(DevicePlan("cuda", "nccl", 2, gpu_count=4), base={})
    assert "CUDA_VISIBLE_DEVICES" not in env
    assert "TORCH_DISABLE_SHARE_RDZV_TCP_STORE" not in env


def test_gpu_runs_keep_gloo_and_nccl_on_loopback_too():
    """Issue 15 item 9: GPU jobs create gloo groups as well (sampler demo, DETAIL's helper group)."""
    env = build_env(DevicePlan("cuda", "nccl", 2, gpu_count=2), base={})
    assert env["GLOO_SOCKET_IFNAME"] == "lo" and env["NCCL_SOCKET_IFNAME"] == "lo"
    # Simulated nodes (nnodes > 1) get this same environment per agent: they rendezvous on 127.0.0.1 as well.
    env = build_env(DevicePlan("cuda", "nccl", 1, gpu_count=8), base={"PATH": "/bin"}, max_restarts=1)
    assert env["GLOO_SOCKET_IFNAME"] == "lo" and env["NCCL_SOCKET_IFNAME"] == "lo"


def test_a_users_own_interface_settings_win():
    base = {"GLOO_SOCKET_IFNAME": "eth0", "NCCL_SOCKET_IFNAME": "^docker"}
    env = build_env(DevicePlan("cuda", "nccl", 2, gpu_count=2), base=base)
    assert (env["GLOO_SOCKET_IFNAME"], env["NCCL_SOCKET_IFNAME"]) == ("eth0", "^docker")
    env = build_env(DevicePlan("cuda", "nccl", 2, gpu_count=2), {"NCCL_SOCKET_IFNAME": "eth1"}, base={})
    assert env["NCCL_SOCKET_IFNAME"] == "eth1", "LaunchSpec.env wins over the default"


def test_simulated_nodes_split_the_gpus_the_job_may_use():
    """Node n gets its slice of CUDA_VISIBLE_DEVICES, not GPUs counted from 0 (issue 15 item 6)."""
    assert [node_visible_devices({}, n, 2, 4) for n in (0, 1)] == ["0,1", "2,3"]
    env = {"CUDA_VISIBLE_DEVICES": "4,5,6,7"}
    assert [node_visible_devices(env, n, 2, 4) for n in (0, 1)] == ["4,5", "6,7"]
    env = {"CUDA_VISIBLE_DEVICES": "GPU-aa,GPU-bb"}
    assert [node_visible_devices(env, n, 1, 2) for n in (0, 1)] == ["GPU-aa", "GPU-bb"]


def test_command_text_is_a_rerunnable_shell_line(tmp_path):
    base = {"PATH": "/bin"}
    env = {"PATH": "/bin", "OMP_NUM_THREADS": "1"}
    text = command_text(["python", "-m", "torch.distributed.run", "my script.py"], env, tmp_path, base)
    assert text == f"cd {shlex.quote(str(tmp_path))} && OMP_NUM_THREADS=1 python -m torch.distributed.run 'my script.py'\n"


def test_free_port_is_bindable_on_loopback():
    import socket

    port = free_port()
    assert 1024 <= port <= 65535
    with socket.socket() as s:
        s.bind(("127.0.0.1", port))


def test_free_port_is_below_the_kernels_ephemeral_range(monkeypatch, tmp_path):
    """The kernel hands out ephemeral ports to any bind(0) and outgoing connection on the machine: a port picked
    there can be taken before torchrun binds it (EADDRINUSE). free_port picks below that range, and falls back to
    port 0 (inside it) when there is no room below."""
    from tutorial_lib.probes import ports as probe

    span = probe.ephemeral_ports()
    if span is None:
        pytest.skip("no /proc/sys/net/ipv4/ip_local_port_range: not Linux")
    ports = {free_port() for _ in range(20)}
    assert all(probe.FREE_PORT_LOW <= p < span[0] for p in ports), (ports, span)
    assert len(ports) > 1  # random, not one port every launch would share
    squeezed = tmp_path / "range"
    squeezed.write_text(f"{probe.FREE_PORT_LOW - 1000}\t60999\n")  # no room below: the kernel's choice
    monkeypatch.setattr(probe, "EPHEMERAL_RANGE", str(squeezed))
    assert probe.FREE_PORT_LOW - 1000 <= free_port() <= 60999


def test_the_local_clusters_ports_are_distinct_free_and_below_the_ephemeral_range(monkeypatch):
    """slurmctld's and each slurmd's port (``LocalCluster``'s slurm.conf): the same pick as torchrun's, held bound
    until all are found so no two coincide, even when the random draw repeats itself."""
    from tutorial_lib.probes import ports as probe

    span = probe.ephemeral_ports()
    if span is None:
        pytest.skip("no /proc/sys/net/ipv4/ip_local_port_range: not Linux")
    picked = probe.free_ports(3)
    assert len(set(picked)) == 3 and all(probe.FREE_PORT_LOW <= p < span[0] for p in picked), picked
    for port in picked:
        with socket.socket() as s:
            s.bind(("127.0.0.1", port))
    first, second = (p - probe.FREE_PORT_LOW for p in picked[:2])  # free a moment ago
    draws = iter([first, first, second])  # the second port's first draw repeats the first port: taken, drawn again
    monkeypatch.setattr(probe.secrets, "randbelow", lambda n: next(draws))
    assert probe.free_ports(2) == picked[:2]
    with pytest.raises(ValueError, match="count must be >= 1, got 0"):
        probe.free_ports(0)


@pytest.fixture
def script(tmp_path):
    return write_script("ddp_train", tmp_path)


@pytest.mark.parametrize(
    "changes, match",
    [
        ({"timeout_s": 0}, "timeout_s must be a number > 0, got 0"),
        ({"timeout_s": -5}, "timeout_s must be a number > 0, got -5"),
        ({"timeout_s": "60"}, "timeout_s must be a number > 0, got '60'"),
        ({"nproc_per_node": 0}, "nproc_per_node must be >= 1, got 0"),
        ({"nproc_per_node": "2"}, "nproc_per_node must be a positive integer, got '2'"),
        ({"master_port": 80}, "master_port must be an integer in 1024..65535"),
        ({"master_port": 70000}, "got 70000"),
        ({"max_restarts": -1}, "max_restarts must be an integer >= 0, got -1"),
        ({"live": "fancy"}, "live must be one of"),
        ({"args": "--max-steps 5"}, "not one string"),
        ({"env": {"A": 1}}, "env must map str to str"),
        ({"device": "cuda"}, "no usable CUDA GPU"),
        ({"sample_memory_hz": 0}, "sample_memory_hz must be a number > 0"),
    ],
)
def test_bad_spec_is_refused_before_launch(script, changes, match):
    spec = LaunchSpec(script, **changes)
    with pytest.raises(ConfigError, match=match):
        spec.validate(gpu_count=0)
    assert not (script.parent / "command.txt").exists(), "nothing was launched"


def test_missing_script_and_reused_run_dir_are_refused(tmp_path, script):
    with pytest.raises(ConfigError, match="does not exist"):
        LaunchSpec(tmp_path / "nope.py").validate(gpu_count=0)
    with pytest.raises(ConfigError, match=r"is a folder, not a script: give the .py file to run \(in it: ddp_train.py\)"):
        LaunchSpec(script.parent).validate(gpu_count=0)  # issue 48: a folder was "does not exist; create it"
    (script.parent / "command.txt").write_text("earlier launch")
    with pytest.raises(ConfigError, match="already holds a launch"):
        LaunchSpec(script).validate(gpu_count=0)
    assert (script.parent / "command.txt").read_text() == "earlier launch", "nothing a user made is overwritten"
    with pytest.raises(ConfigError, match="not a writable directory"):
        LaunchSpec(script, run_dir=tmp_path / "missing").validate(gpu_count=0)


def test_the_plan_is_pure_it_builds_each_nodes_command_and_environment_and_writes_nothing(tmp_path):
    script = tmp_path / "t.py"
    script.write_text("")
    plan = plan_launch(LaunchSpec(script, args=["--x", 1], nproc_per_node=2, device="cpu", master_port=29511))
    assert plan.nodes == (0,) and plan.run_dir == tmp_path.resolve() and plan.script == script.resolve()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["t.py"], "no command.txt, output.log or logs/ yet"
    command = plan.commands(29511)[0]
    assert command[command.index("--master-port") + 1] == "29511" and command[-2:] == ["--x", "1"]
    assert plan.node_log_dir(0) == tmp_path.resolve() / "logs" and plan.node_envs[0]["OMP_NUM_THREADS"] == "1"
    assert plan.shape("warm") == {"nnodes": 1, "nproc_per_node": 2, "device": "cpu", "start": "warm"}
    assert shlex.join(command) in plan.command_txt({0: command})


def test_simulated_nodes_get_their_own_log_folder_and_command_block(tmp_path):
    script = tmp_path / "t.py"
    script.write_text("")
    plan = plan_launch(LaunchSpec(script, nnodes=2, start_nodes=[1], nproc_per_node=1, device="cpu"))
    assert plan.nodes == (1,) and plan.node_log_dir(1) == tmp_path.resolve() / "logs" / "node1"
    commands = plan.commands(29512)
    assert list(commands) == [1] and "--rdzv-endpoint" in commands[1]
    assert plan.command_txt(commands).startswith("# node 1\n")


def test_the_warm_or_cold_start_is_decided_once_in_the_plan(tmp_path, monkeypatch):
    script = tmp_path / "t.py"
    script.write_text("")
    monkeypatch.setenv("TUTORIAL_LIB_WARM", "0")
    assert plan_launch(LaunchSpec(script, device="cpu")).warm is False
    assert plan_launch(LaunchSpec(script, device="cpu", warm=True)).warm is True, "the spec wins"
    monkeypatch.setenv("TUTORIAL_LIB_WARM", "maybe")
    with pytest.raises(ConfigError, match="TUTORIAL_LIB_WARM='maybe'"):
        plan_launch(LaunchSpec(script, device="cpu"))


def test_the_limit_check_names_the_limit_and_a_stall_needs_a_first_metrics_line(tmp_path):
    script = tmp_path / "t.py"
    script.write_text("")
    spec = LaunchSpec(script, timeout_s=10, stall_timeout_s=3)
    assert limit_reached(spec, 9.0, None) is None
    assert limit_reached(spec, 10.5, 9.0) == "timeout_s"
    assert limit_reached(spec, 8.0, None) is None, "no metrics line yet: start-up is not a stall"
    assert limit_reached(spec, 8.0, 4.5) == "stall_timeout_s" and limit_reached(spec, 8.0, 5.5) is None
    assert limit_reached(LaunchSpec(script, timeout_s=10), 9.9, 0.0) is None, "stall_timeout_s=None: off"


def test_the_ranks_run_in_the_scripts_folder_unless_cwd_says_otherwise_and_command_txt_says_where(tmp_path):
    """Issue 26: a launch says where its ranks run; a script of yours finds the files beside it."""
    project, runs, elsewhere = tmp_path / "my project", tmp_path / "runs", tmp_path / "data"
    for folder in (project, runs, elsewhere):
        folder.mkdir()
    script = project / "train.py"
    script.write_text("")
    lesson = plan_launch(LaunchSpec(script, device="cpu"))  # a lesson script: written into its run directory
    assert lesson.cwd == lesson.run_dir == project.resolve()
    assert lesson.command_txt({0: ["torchrun", "train.py"]}).startswith(f"cd {shlex.quote(str(project))} && ")
    own = plan_launch(LaunchSpec(script, device="cpu", run_dir=runs))
    assert own.cwd == project.resolve() and own.run_dir == runs.resolve()
    first, second = own.command_txt({0: ["torchrun"]}).splitlines()
    assert first == f"# ranks run in {project}; logs, metrics, run.json: {runs}"
    assert second.startswith(f"cd {shlex.quote(str(project))} && ") and second.endswith(" torchrun")
    given = plan_launch(LaunchSpec(script, device="cpu", run_dir=runs, cwd=elsewhere))
    assert given.cwd == elsewhere.resolve() and f"cd {elsewhere} && " in given.command_txt({0: ["torchrun"]})
    assert sorted(p.name for p in tmp_path.rglob("*")) == ["data", "my project", "runs", "train.py"], "pure"


@pytest.mark.parametrize("cwd, match", [
    ("missing", r"cwd '.*missing' is not a folder \(missing\): the ranks' working folder must exist"),
    ("t.py", r"is not a folder \(a file\)"),
    ("", "cwd must be a folder"),
    (b"/tmp", "cwd must be a folder"),
])
def test_a_bad_working_folder_is_a_config_error(tmp_path, cwd, match):
    script = tmp_path / "t.py"
    script.write_text("")
    value = str(tmp_path / cwd) if cwd in ("missing", "t.py") else cwd
    with pytest.raises(ConfigError, match=match):
        plan_launch(LaunchSpec(script, device="cpu", cwd=value))


def test_a_loss_pattern_is_checked_with_the_spec(tmp_path):
    script = tmp_path / "t.py"
    script.write_text("")
    for bad, match in [(r"loss (\d+)", "needs the groups"), (r"(?P<step>\d+", "not a regular expression"),
                       (42, "must be a str or a compiled re.Pattern")]:
        with pytest.raises(ConfigError, match=match):
            plan_launch(LaunchSpec(script, device="cpu", loss_pattern=bad))
    assert plan_launch(LaunchSpec(script, device="cpu", loss_pattern=None)).spec.loss_pattern is None
