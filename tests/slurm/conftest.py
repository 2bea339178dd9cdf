"""A real SLURM for the tests: `slurmctld` and two `slurmd` "nodes" on one host, with `munged`.

The nodes are n1 on 127.0.0.2 and n2 on 127.0.0.3: two slurmd processes told apart by `-N` and
their own Port=, each with 2 CPUs and 4 fake GPUs (char devices cloned from /dev/null, so SLURM
hands them out and sets CUDA_VISIBLE_DEVICES, though nothing can compute on them). Everything lives
in one short temp dir with random ports, nothing in /etc/slurm is read, and the daemons are stopped
by their pids: the host is shared, so nothing is found or stopped by name. Session-scoped: start-up
is under a second, but the tests share one cluster (and its job ids).

There is no accounting (`sacct` needs slurmdbd and a database): tests/slurm/bin/sacct is a
stand-in that answers from `scontrol show job`, put first on PATH for everything submitted here.

Needs root (slurmd runs jobs as their users) and the Debian packages slurm-wlm and munge, which
`make test` installs when it can; otherwise every test here skips and says why. The errors met
setting it up, and what this file does about each: docs/testing.md, "The SLURM fixture".
"""

from __future__ import annotations

import contextlib
import os
import shutil
import socket
import subprocess
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

import psutil
import pytest

BIN = Path(__file__).resolve().parent / "bin"
NODES = {"n1": "127.0.0.2", "n2": "127.0.0.3"}
CPUS, GPUS = 2, 4  # per node; the host has 2 cores
DAEMONS = ("slurmctld", "slurmd", "munged", "mungekey", "sbatch", "scontrol", "squeue")

SLURM_CONF = """\
ClusterName=logicrl
SlurmctldHost=localhost
SlurmctldPort={ctld_port}
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
CredType=cred/munge
AuthInfo=socket={base}/munge/munge.sock
StateSaveLocation={base}/state
SlurmdSpoolDir={base}/spool/%n
SlurmctldPidFile={base}/slurmctld.pid
SlurmdPidFile={base}/slurmd-%n.pid
SlurmctldLogFile={base}/log/slurmctld.log
SlurmdLogFile={base}/log/slurmd-%n.log
# linuxproc tracks a job's processes by parent pid: enough here, and why `ray start` runs --block.
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
SelectType=select/cons_tres
SelectTypeParameters=CR_CPU
MpiDefault=none
MailProg=/bin/true
ReturnToService=2
# Seconds between a step's SIGTERM and its SIGKILL.
KillWait=30
# Ended jobs stay visible to scontrol (and so to the sacct stand-in) for an hour.
MinJobAge=3600
JobCompType=jobcomp/filetxt
JobCompLoc={base}/log/jobcomp.txt
AccountingStorageType=accounting_storage/none
JobAcctGatherType=jobacct_gather/none
GresTypes=gpu
{nodes}
PartitionName=debug Nodes={names} Default=YES MaxTime=INFINITE State=UP
"""


def missing() -> str | None:
    """Why this host cannot run the cluster, or None."""
    absent = [name for name in DAEMONS if shutil.which(name) is None and not Path("/usr/sbin", name).exists()]
    if absent:
        return (f"SLURM is not installed ({', '.join(absent)} not found): `make test` installs slurm-wlm and munge "
                "when run as root with apt; else apt-get install slurm-wlm munge")
    if os.geteuid() != 0:
        return "the test SLURM cluster needs root (slurmd starts jobs as their users)"
    return None


def free_ports(n: int) -> list[int]:
    socks = [socket.socket() for _ in range(n)]
    try:
        for s in socks:
            s.bind(("", 0))
        return [s.getsockname()[1] for s in socks]
    finally:
        for s in socks:
            s.close()


@dataclass
class Cluster:
    """The running cluster: `env` for anything that talks to it (sbatch, scontrol, squeue...)."""

    base: Path
    env: dict
    pids: list = field(default_factory=list)
    jobs: list = field(default_factory=list)  # every job submitted through sbatch(), cancelled at the end

    def run(self, *cmd: str, check: bool = True, timeout: float = 30) -> str:
        done = subprocess.run(cmd, env=self.env, capture_output=True, text=True, timeout=timeout)
        if check and done.returncode:
            raise RuntimeError(f"{' '.join(cmd)}: exit {done.returncode}: {done.stderr.strip()}")
        return done.stdout

    def sbatch(self, *args: str, cwd: Path, env: dict | None = None) -> str:
        out = subprocess.run(["sbatch", "--parsable", *args], cwd=cwd, env={**self.env, **(env or {})},
                             capture_output=True, text=True, timeout=30)
        if out.returncode:
            raise RuntimeError(f"sbatch {' '.join(args)}: {out.stderr.strip()}")
        job = out.stdout.strip().split(";")[0]
        self.jobs.append(job)
        return job

    def job(self, job: str) -> dict:
        """`scontrol show job -o` as a dict (the first record: an array's first task)."""
        line = self.run("scontrol", "show", "job", "-o", job).splitlines()[0]
        return dict(pair.split("=", 1) for pair in line.split() if "=" in pair)

    def state(self, job: str) -> str:
        return self.job(job)["JobState"]

    def wait(self, job: str, timeout: float, until=("COMPLETED", "FAILED", "CANCELLED", "TIMEOUT", "NODE_FAIL",
                                                    "OUT_OF_MEMORY", "BOOT_FAIL", "DEADLINE", "PREEMPTED")) -> str:
        """Poll every half second (sbatch --wait polls every ~10 s) until the job is in a state of `until`."""
        deadline = time.monotonic() + timeout
        while (state := self.state(job)) not in until:
            if time.monotonic() > deadline:
                raise TimeoutError(f"job {job} still {state} after {timeout:.0f} s")
            time.sleep(0.5)
        return state

    def release(self, job: str) -> None:
        """A requeued job is held ~120 s (Reason=BeginTime): let it start now."""
        self.run("scontrol", "update", f"jobid={job}", "StartTime=now")

    def stop(self) -> None:
        live = [j for j in self.jobs if self.state_or_none(j) not in (None, "COMPLETED", "FAILED", "CANCELLED",
                                                                        "TIMEOUT", "NODE_FAIL")]
        if live:  # only this cluster's own jobs, all submitted by these tests
            self.run("scancel", *live, check=False)
            deadline = time.monotonic() + 60
            while time.monotonic() < deadline and any(
                    self.state_or_none(j) in ("RUNNING", "COMPLETING", "PENDING", "REQUEUED") for j in live):
                time.sleep(0.5)
        stop_pids(self.pids)
        shutil.rmtree(self.base, ignore_errors=True)

    def state_or_none(self, job: str) -> str | None:
        try:
            return self.state(job)
        except (RuntimeError, IndexError, subprocess.TimeoutExpired):
            return None


def stop_pids(pids: list[int], timeout: float = 10) -> None:
    """SIGTERM to every daemon at once, then SIGKILL to any still there after `timeout`: each takes about 2 s
    to end, which one after another made the session's teardown 7 s."""
    procs = []
    for pid in pids:
        with contextlib.suppress(psutil.NoSuchProcess):
            procs.append(psutil.Process(pid))
    for proc in procs:
        with contextlib.suppress(psutil.NoSuchProcess):
            proc.terminate()
    _, left = psutil.wait_procs(procs, timeout=timeout)
    for proc in left:
        with contextlib.suppress(psutil.NoSuchProcess):
            proc.kill()


def read_pid(path: Path, timeout: float = 10) -> int:
    deadline = time.monotonic() + timeout
    while not (path.exists() and path.read_text().strip()):
        if time.monotonic() > deadline:
            raise RuntimeError(f"{path} did not appear")
        time.sleep(0.05)
    return int(path.read_text())


def start_cluster() -> Cluster:
    # Short: Ray's and munge's unix sockets live under it (jobs set TMPDIR here), and their paths
    # may not pass 107 bytes.
    base = Path(tempfile.mkdtemp(prefix="sl", dir="/tmp"))
    cluster = Cluster(base, env={})
    try:
        for sub in ("munge", "state", "spool", "log"):
            (base / sub).mkdir()
        os.chmod(base, 0o755)
        os.chmod(base / "munge", 0o755)  # munged refuses a socket directory without o+x
        key = base / "munge" / "munge.key"
        subprocess.run(["mungekey", "--create", f"--keyfile={key}"], check=True, capture_output=True)
        subprocess.run(["munged", f"--key-file={key}", f"--socket={base}/munge/munge.sock",
                        f"--pid-file={base}/munge/munged.pid", f"--log-file={base}/munge/munged.log",
                        f"--seed-file={base}/munge/munged.seed"], check=True, capture_output=True)
        cluster.pids.append(read_pid(base / "munge" / "munged.pid"))

        # Fake GPUs: SLURM wants character devices; clones of /dev/null (1, 3) do.
        gres = []
        for name in NODES:
            for g in range(GPUS):
                dev = base / f"gpu-{name}-{g}"
                os.mknod(dev, 0o666 | 0o020000, os.makedev(1, 3))
                gres.append(f"NodeName={name} Name=gpu File={dev}")
        (base / "gres.conf").write_text("\n".join(gres) + "\n")
        ctld_port, *node_ports = free_ports(1 + len(NODES))
        nodes = "\n".join(f"NodeName={name} NodeHostname=localhost NodeAddr={ip} Port={port} CPUs={CPUS} "
                          f"RealMemory=1000 Gres=gpu:{GPUS}" for (name, ip), port in zip(NODES.items(), node_ports))
        conf = base / "slurm.conf"
        conf.write_text(SLURM_CONF.format(base=base, ctld_port=ctld_port, nodes=nodes, names=",".join(NODES)))

        # Everything submitted from here: this cluster's config, the sacct stand-in, and TMPDIR for
        # the wrapper's per-node Ray dirs (two test clusters on one host share job ids and node names).
        env = {k: v for k, v in os.environ.items() if not k.startswith(("SLURM_", "RAY_"))}
        cluster.env = {**env, "SLURM_CONF": str(conf), "PATH": f"{BIN}:{env.get('PATH', '')}", "TMPDIR": str(base)}
        subprocess.run(["slurmctld", "-f", str(conf)], check=True, env=cluster.env, capture_output=True)
        cluster.pids.append(read_pid(base / "slurmctld.pid"))
        for name in NODES:
            subprocess.run(["slurmd", "-f", str(conf), "-N", name], check=True, env=cluster.env, capture_output=True)
            cluster.pids.append(read_pid(base / f"slurmd-{name}.pid"))
        deadline = time.monotonic() + 30
        while True:
            states = cluster.run("sinfo", "-h", "-N", "-o", "%N %t", check=False).split()
            if states.count("idle") == len(NODES):
                return cluster
            if time.monotonic() > deadline:
                log = (base / "log" / "slurmctld.log").read_text()[-2000:]
                raise RuntimeError(f"the nodes did not come up idle: {states}\n{log}")
            time.sleep(0.2)
    except BaseException:
        cluster.stop()
        raise


@pytest.fixture(scope="session")
def slurm():
    why = missing()
    if why:
        pytest.skip(why)
    cluster = start_cluster()
    try:
        yield cluster
    finally:
        cluster.stop()


def job_processes(cluster: Cluster, job: str) -> list[str]:
    """Live processes that belong to `job` of this cluster (by their environment, which Ray's workers
    inherit too), as "pid name" strings."""
    import psutil

    found = []
    for proc in psutil.process_iter(["pid", "name"]):
        try:
            env = proc.environ()
        except (psutil.Error, OSError):
            continue
        if env.get("SLURM_JOB_ID") == job and env.get("SLURM_CONF") == cluster.env["SLURM_CONF"]:
            found.append(f"{proc.info['pid']} {proc.info['name']}")
    return found


def output_of(path: Path) -> str:
    return path.read_text() if path.exists() else "(no output file)"

