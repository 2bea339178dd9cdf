"""logicrl/launch/slurm.py without SLURM: the shape from a job's environment, NodeAddr, the head's
address handed over by file, and the driver's command line. Environments are what SLURM 22.05 set
in the test cluster's batch steps (tests/slurm/conftest.py)."""

from __future__ import annotations

import shlex
import threading
import time

import pytest

from logicrl.launch.slurm import (
    MAIN,
    LaunchError,
    Shape,
    address_in,
    cpus_per_node,
    driver_argv,
    ipv4,
    node_addr,
    prepare,
    publish,
    ray_temp_dir,
    run_dir_name,
    shape,
    wait_for_file,
)

# sbatch --nodes=2 --cpus-per-task=16 (the wrapper's --ntasks-per-node=1), then one of:
JOB = {"SLURM_NNODES": "2", "SLURM_JOB_CPUS_PER_NODE": "16(x2)", "SLURM_CPUS_ON_NODE": "16",
       "SLURM_NTASKS_PER_NODE": "1",
       "SLURM_JOB_ID": "41", "SLURM_SUBMIT_DIR": "/home/me/logicrl", "SLURMD_NODENAME": "n1"}
GPUS_PER_NODE = {**JOB, "SLURM_GPUS_ON_NODE": "4", "SLURM_GPUS_PER_NODE": "4"}  # --gpus-per-node=4
GRES = {**JOB, "SLURM_GPUS_ON_NODE": "4"}  # --gres=gpu:4: SLURM_GPUS_PER_NODE is not set
TYPED = {**JOB, "SLURM_GPUS_ON_NODE": "4", "SLURM_GPUS_PER_NODE": "a100:4"}  # --gpus-per-node=a100:4


@pytest.mark.parametrize("env", [GPUS_PER_NODE, GRES, TYPED], ids=["gpus-per-node", "gres", "typed"])
def test_ranks_per_node_are_the_gpus_on_each_node(env):
    assert shape(env) == Shape(nnodes=2, ranks_per_node=4, cpus_per_node=16, gpus_per_node=4)


def test_without_gpus_one_cpu_rank_per_task():
    assert shape(JOB) == Shape(nnodes=2, ranks_per_node=1, cpus_per_node=16, gpus_per_node=0)
    # --ntasks-per-node=2 --cpus-per-task=8: two ranks, the node's 16 CPUs shared between them.
    two = {**JOB, "SLURM_NTASKS_PER_NODE": "2", "SLURM_JOB_CPUS_PER_NODE": "16(x2)"}
    assert shape(two) == Shape(nnodes=2, ranks_per_node=2, cpus_per_node=16, gpus_per_node=0)
    # Without --ntasks-per-node SLURM sets no SLURM_NTASKS_PER_NODE: one rank.
    bare = {k: v for k, v in JOB.items() if k != "SLURM_NTASKS_PER_NODE"}
    assert shape(bare).ranks_per_node == 1


def test_more_cpu_ranks_than_cpus_is_refused():
    with pytest.raises(LaunchError, match=r"--ntasks-per-node=4 CPU ranks need a CPU each, but the job holds 2"):
        shape({**JOB, "SLURM_NTASKS_PER_NODE": "4", "SLURM_JOB_CPUS_PER_NODE": "2(x2)"})


def test_outside_a_job_says_so():
    with pytest.raises(LaunchError, match="SLURM_NNODES is not set: run this inside a SLURM job"):
        shape({})


@pytest.mark.parametrize("text, cpus", [("8", 8), ("8(x2)", 8), ("8(x2),4", 4), ("2,16(x3)", 2)])
def test_cpus_per_node_is_the_fewest_on_any_node(text, cpus):
    assert cpus_per_node(text) == cpus


def test_node_addr_from_scontrol():
    line = ("NodeName=n2 Arch=x86_64 CoresPerSocket=1 CPUAlloc=1 CPUEfctv=2 CPUTot=2 CPULoad=0.52 "
            "AvailableFeatures=(null) "
            "ActiveFeatures=(null) Gres=gpu:4 NodeAddr=127.0.0.3 NodeHostName=localhost Version=22.05.8 OS=Linux")
    assert node_addr(line) == "127.0.0.3"
    with pytest.raises(LaunchError, match="no NodeAddr"):
        node_addr("NodeName=n2 NodeHostName=localhost")


def test_a_node_address_resolves_to_ipv4():
    assert ipv4("127.0.0.3") == "127.0.0.3"
    assert ipv4("localhost").startswith("127.")
    with pytest.raises(LaunchError, match="does not resolve to IPv4"):
        ipv4("no-such-node.invalid")


def test_a_site_network_picks_the_nodes_own_address_in_it():
    mine = ["127.0.0.1", "172.17.0.1", "10.20.3.7", "fe80::1%eth0"]  # loopback, a docker bridge, the fabric
    assert address_in("10.20.0.0/16", mine) == "10.20.3.7"
    with pytest.raises(LaunchError, match="has no address in it"):
        address_in("192.168.0.0/24", mine)
    with pytest.raises(LaunchError, match="is not a network"):
        address_in("ib0", mine)


def test_the_head_address_is_handed_over_whole(tmp_path):
    head = tmp_path / "head"
    writer = threading.Timer(0.3, publish, args=(head, "127.0.0.2:43125"))
    writer.start()
    assert wait_for_file(head, timeout=10, poll=0.05) == "127.0.0.2:43125"
    assert [p.name for p in tmp_path.iterdir()] == ["head"]  # the temporary name is gone


def test_waiting_for_the_head_ends(tmp_path):
    start = time.monotonic()
    with pytest.raises(LaunchError, match="has ended"):  # the nodes' step died: no minutes of waiting
        wait_for_file(tmp_path / "head", timeout=60, alive=lambda: False, poll=0.05)
    with pytest.raises(LaunchError, match="did not appear within 0 s"):
        wait_for_file(tmp_path / "head", timeout=0.2, poll=0.05)
    assert time.monotonic() - start < 5


def test_run_dir_is_named_by_the_job_so_a_requeued_run_keeps_it():
    assert run_dir_name(JOB) == "slurm-41"
    assert run_dir_name({**JOB, "SLURM_ARRAY_JOB_ID": "40", "SLURM_ARRAY_TASK_ID": "3"}) == "slurm-40_3"


def test_driver_argv_gives_shape_and_cluster_then_the_users_overrides():
    argv = driver_argv(GRES, "127.0.0.2:43125", ["+recipe=stage1", "trainer.total_training_steps=5"])
    assert argv[1:] == [str(MAIN), "trainer.nnodes=2", "trainer.n_gpus_per_node=4",
                        "trainer.ray_address=127.0.0.2:43125",
                        "hydra.run.dir=outputs/${trainer.project_name}/${trainer.experiment_name}/slurm-41",
                        "+recipe=stage1", "trainer.total_training_steps=5"]
    # A key the user gives is theirs alone.
    argv = driver_argv(GRES, "127.0.0.2:43125", ["trainer.n_gpus_per_node=2", "hydra.run.dir=mine"])
    assert "trainer.n_gpus_per_node=4" not in argv and argv[-2:] == ["trainer.n_gpus_per_node=2", "hydra.run.dir=mine"]


def test_ray_dirs_are_per_job_and_node_and_short():
    env = {**JOB, "TMPDIR": "/tmp"}
    assert ray_temp_dir(env).as_posix() == "/tmp/ray-41-n1"
    # Ray puts unix sockets at <temp>/session_<date>_<time>_<us>_<pid>/sockets/plasma_store.
    session = "session_2026-11-24_01-51-13_619685_4194304"
    socket = ray_temp_dir({**env, "SLURM_JOB_ID": "123456789"}) / session / "sockets/plasma_store"
    assert len(str(socket)) < 107


def test_each_job_run_gets_a_private_dir_and_a_fresh_token(tmp_path):
    (tmp_path / "my runs").mkdir()
    env = {**JOB, "SLURM_SUBMIT_DIR": str(tmp_path / "my runs")}  # a space survives the shell's eval
    lines = dict(line.split("=", 1) for line in prepare(env).splitlines())
    job_dir = tmp_path / "my runs" / ".ray-41"
    assert shlex.split(lines["job_dir"]) == [str(job_dir)] and lines["cpus_per_node"] == "16"
    token = (job_dir / "token").read_text()
    assert len(token) == 64 and job_dir.stat().st_mode & 0o777 == 0o700
    assert (job_dir / "token").stat().st_mode & 0o777 == 0o600
    (job_dir / "head").write_text("127.0.0.2:1")  # a requeued job's first run left its address
    prepare(env)
    assert (job_dir / "token").read_text() != token and not (job_dir / "head").exists()
