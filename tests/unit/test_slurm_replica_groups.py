"""torchft's replica groups as SLURM jobs (issue 47), the parts that submit nothing: each group's batch script keeps
its files in its own folder of the shared run directory, each job's environment, and the values refused before
anything is submitted."""

import pytest

import tutorial_lib as tl
from tutorial_lib.errors import ConfigError
from tutorial_lib.launcher.slurm_replicas import job_env, start_slurm_replica_groups
from tutorial_lib.runs.rundir import LESSONS_DIR


def test_a_jobs_output_files_and_torchruns_logs_go_to_its_output_dir_under_the_run_dir():
    text = tl.slurm.slurm_script("ft_train.py", nnodes=1, nproc_per_node=1, run_dir="/shared/run", job_name="ft_1",
                           output_dir="group1/attempt2")
    for line in ("#SBATCH --chdir=/shared/run", "#SBATCH --output=group1/attempt2/%x-%j.out",
                 "srun --kill-on-bad-exit=1 --output=group1/attempt2/%x-%j-node%n.out \\\n",
                 """--log-dir "group1/attempt2/logs/node$SLURM_NODEID" "$@"'"""):
        assert line in text, line
    plain = tl.slurm.slurm_script("ft_train.py", nnodes=1, nproc_per_node=1)
    assert "#SBATCH --output=%x-%j.out" in plain and '--log-dir "logs/node$SLURM_NODEID"' in plain


@pytest.mark.parametrize("output_dir", ["my group", "g%j", 'g"1', "", 3])
def test_an_output_dir_slurm_or_the_script_would_misread_is_refused(output_dir):
    with pytest.raises(ConfigError, match="output_dir must be a folder path of letters"):
        tl.slurm.slurm_script("ft_train.py", nnodes=1, nproc_per_node=1, output_dir=output_dir)


def test_a_jobs_environment_is_what_torchft_reads_without_the_local_loopback_interface():
    env = job_env("http://127.0.0.1:4321", 1, 2, 1, {"X": "1"}, None, base={"PATH": "/bin"})
    assert env == {"PATH": "/bin", "OMP_NUM_THREADS": "1", "PYTHONUNBUFFERED": "1",
                   "TORCH_ELASTIC_SHUTDOWN_TIMEOUT": "5", "TORCHFT_LIGHTHOUSE": "http://127.0.0.1:4321",
                   "REPLICA_GROUP_ID": "1", "NUM_REPLICA_GROUPS": "2", "X": "1"}
    assert job_env("http://h:1", 0, 2, 1, {}, "lo", base={})["GLOO_SOCKET_IFNAME"] == "lo"  # the local cluster
    assert job_env("http://h:1", 0, 2, 1, {}, None, base={"GLOO_SOCKET_IFNAME": "ib0"})["GLOO_SOCKET_IFNAME"] == "ib0"


@pytest.mark.parametrize("kwargs, message", [
    (dict(num_groups=0), "num_groups must be >= 1, got 0"),
    (dict(nproc_per_group=True), "nproc_per_group must be a positive integer, got True"),
    (dict(slurm="local"), "slurm must be a SlurmSpec"),
    (dict(slurm=tl.slurm.SlurmSpec(poll_s=0)), "poll_s must be a number of seconds > 0, got 0"),
    (dict(script="nope.py"), r"script '.*nope\.py' does not exist")])
def test_bad_values_are_refused_before_anything_is_submitted(tmp_path, kwargs, message):
    values = {"script": LESSONS_DIR / "ft_train.py", "num_groups": 2, "slurm": tl.slurm.SlurmSpec(), **kwargs}
    with pytest.raises(ConfigError, match=message):
        start_slurm_replica_groups(values.pop("script"), lighthouse=None, run_dir=tmp_path / "run", **values)
    assert list(tmp_path.iterdir()) == []
