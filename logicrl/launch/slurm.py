"""A private Ray cluster per SLURM job, and the driver's command line: the logic of slurm/train.sbatch.

    python -m logicrl.launch.slurm prepare             # batch step: the job's shared dir, token, shape
    srun ... python -m logicrl.launch.slurm node DIR   # one task per node: this node's `ray start --block`
    python -m logicrl.launch.slurm driver DIR -- ARGS  # batch step: wait for every node, print main_ppo's argv
    srun ... python -m logicrl.launch.slurm clean      # one task per node: remove what a killed node left

Nothing is shared with another job on the same nodes: free ports (never 6379), a Ray temp dir per job
and node, a token of its own (otherwise Ray >= 2.59 enables auth on the head only, and nodes fail to
join). Node IPs are SLURM's NodeAddr resolved to IPv4 (a hostname may resolve to 127.0.1.1). Ray is
stopped by process, never with `ray stop`, which stops every Ray of the user on the node. The shape
comes from SLURM, never the submit shell: SLURM_NNODES, SLURM_GPUS_ON_NODE (set under --gres too,
unlike SLURM_GPUS_PER_NODE), or without GPUs --ntasks-per-node CPU ranks. docs/clusters.md.
"""

from __future__ import annotations

import argparse
import ipaddress
import os
import re
import secrets
import shlex
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path

from logicrl.controller.ports import port_holder
from logicrl.faults import Faults

MAIN = Path(__file__).resolve().parents[2] / "main_ppo.py"
HEAD_FILE = "head"  # in the job dir: "ip:port" of the GCS, written once it answers
STEP_FILE = "step"  # in the job dir: "<job>.<step>" of the Ray nodes' srun, for `scancel --signal=TERM`
# In the job dir: written by the wrapper when the driver is done; each node's task then stops its own Ray and
# exits 0, so the step ends on its own. A step ended by a signal (scancel) makes slurmstepd print
# "error: *** STEP ... CANCELLED ***" into the job's output, which reads as a failure of a job that succeeded.
STOP_FILE = "nodes_done"
STOP_POLL_S = 0.5
TOKEN_FILE = "token"
# How long the batch step waits for the head's address and for every node to join; Ray nodes take
# 10-20 s each on a busy host, much longer when a container or a shared filesystem is cold.
WAIT_S = float(os.environ.get("LOGICRL_SLURM_WAIT_S", 600))
# After SIGTERM, seconds a node's `ray start --block` gets before what is left of it is SIGKILLed.
# The wrapper's SIGTERM reaches every process of the nodes' step at once (scancel --signal), and
# then Ray's own shutdown waits ~20 s on daemons that are already gone; the job is over, nothing
# is left to drain.
STOP_S = 5
# `ray start` runs on a node: a port taken between choice and bind is retried with others this often.
START_ATTEMPTS = 3
# After the head's GCS listens, how long its client server may take to bind (when it is missing, the
# head is published anyway: only its failing to bind a taken port makes `ray start` exit).
CLIENT_GRACE_S = 30


class LaunchError(Exception):
    """Something about the job or its nodes that stops the launch: one line, exit 1."""


# ---------------------------------------------------------------- shape
@dataclass(frozen=True)
class Shape:
    nnodes: int
    ranks_per_node: int
    cpus_per_node: int  # what each node's Ray offers: the fewest CPUs the job holds on any node
    gpus_per_node: int


def cpus_per_node(job_cpus: str) -> int:
    """The fewest CPUs on any node, from SLURM_JOB_CPUS_PER_NODE: "8", "8(x2)" or "8(x2),4"."""
    counts = [int(m.group(1)) for m in re.finditer(r"(\d+)(?:\(x\d+\))?", job_cpus)]
    if not counts:
        raise LaunchError(f"SLURM_JOB_CPUS_PER_NODE={job_cpus!r} is not a list of CPU counts")
    return min(counts)


def shape(env: Mapping[str, str]) -> Shape:
    """The run's shape from a batch step's environment."""
    try:
        nnodes = int(env["SLURM_NNODES"])
    except (KeyError, ValueError):
        raise LaunchError("SLURM_NNODES is not set: run this inside a SLURM job (sbatch slurm/train.sbatch)") from None
    cpus = cpus_per_node(env.get("SLURM_JOB_CPUS_PER_NODE") or env.get("SLURM_CPUS_ON_NODE") or "1")
    # SLURM_GPUS_ON_NODE is a count under --gpus-per-node, --gres=gpu:N and --gpus alike;
    # SLURM_GPUS_PER_NODE is empty under --gres (and may read "a100:4").
    gpus = int(env.get("SLURM_GPUS_ON_NODE") or 0)
    ranks = gpus or int(env.get("SLURM_NTASKS_PER_NODE") or 1)
    if not gpus and ranks > cpus:
        raise LaunchError(f"--ntasks-per-node={ranks} CPU ranks need a CPU each, but the job holds {cpus} per node: "
                          f"ask for --cpus-per-task={-(-cpus // ranks) if cpus >= ranks else 1} or more")
    return Shape(nnodes, ranks, cpus, gpus)


# ---------------------------------------------------------------- nodes
def node_addr(scontrol_line: str) -> str:
    """NodeAddr from one line of `scontrol show node NAME -o`."""
    match = re.search(r"(?:^|\s)NodeAddr=(\S+)", scontrol_line)
    if not match:
        raise LaunchError(f"no NodeAddr in scontrol's answer: {scontrol_line[:200]!r}")
    return match.group(1)


def ipv4(addr: str) -> str:
    """An IPv4 address for `addr` (an address already, or a name: `getent ahostsv4`'s first)."""
    try:
        return socket.getaddrinfo(addr, None, socket.AF_INET, socket.SOCK_STREAM)[0][4][0]
    except socket.gaierror as err:
        raise LaunchError(f"node address {addr!r} does not resolve to IPv4: {err.strerror}") from None


def address_in(network: str, addresses: list[str]) -> str:
    """The first of this node's `addresses` inside `network` (CIDR), for LOGICRL_NODE_NETWORK."""
    try:
        net = ipaddress.ip_network(network, strict=False)
    except ValueError:
        raise LaunchError(f"LOGICRL_NODE_NETWORK={network} is not a network (write it as 10.20.0.0/16)") from None
    for addr in addresses:
        try:
            if ipaddress.ip_address(addr) in net:
                return addr
        except ValueError:  # a link-local "fe80::1%eth0" and the like
            continue
    raise LaunchError(f"LOGICRL_NODE_NETWORK={network}: this node has no address in it "
                      f"(it has {', '.join(addresses) or 'none'})")


def node_ip(node: str, env: Mapping[str, str] | None = None) -> str:
    """This node's IP for Ray: its own address in LOGICRL_NODE_NETWORK when set (a site whose
    NodeAddr is on a network the nodes cannot talk over), else NodeAddr resolved to IPv4."""
    network = (env or os.environ).get("LOGICRL_NODE_NETWORK")
    if network:
        import psutil

        return address_in(network, [a.address for addrs in psutil.net_if_addrs().values() for a in addrs
                                    if a.family == socket.AF_INET])
    out = subprocess.run(["scontrol", "show", "node", node, "-o"], capture_output=True, text=True, timeout=60)
    if out.returncode:
        raise LaunchError(f"scontrol show node {node}: {out.stderr.strip()}")
    return ipv4(node_addr(out.stdout))


def free_ports(ip: str, n: int) -> list[int]:
    """n ports free on `ip` now, all distinct. Another process may take one before Ray binds it;
    the window is a second, and Ray then fails to start rather than joining the wrong cluster."""
    socks = [socket.socket() for _ in range(n)]
    try:
        for s in socks:
            s.bind((ip, 0))
        return [s.getsockname()[1] for s in socks]
    finally:
        for s in socks:
            s.close()


def ray_temp_dir(env: Mapping[str, str]) -> Path:
    """This job's Ray dir on this node. Short (Ray's unix socket paths may not pass 107 bytes), and
    named by job and node, so jobs sharing a node (or, in tests, a /tmp) never meet."""
    return Path(env.get("TMPDIR") or "/tmp") / f"ray-{env['SLURM_JOB_ID']}-{env['SLURMD_NODENAME']}"


# ---------------------------------------------------------------- the head's address, by file
def publish(path: Path, text: str) -> None:
    """Write atomically: a reader on another node sees the whole text or no file."""
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_text(text)
    tmp.replace(path)


def wait_for_file(path: Path, timeout: float, alive: Callable[[], bool] = lambda: True, poll: float = 0.5) -> str:
    """The text of `path` once it exists, or a LaunchError after `timeout` s or once `alive()` is false."""
    deadline = time.monotonic() + timeout
    while True:
        if path.exists():
            return path.read_text().strip()
        if not alive():
            raise LaunchError(f"gave up waiting for {path}: what should write it has ended")
        if time.monotonic() > deadline:
            raise LaunchError(f"{path} did not appear within {timeout:.0f} s")
        time.sleep(poll)


def answers(ip: str, port: int) -> bool:
    try:
        socket.create_connection((ip, port), timeout=2).close()
        return True
    except OSError:
        return False


# ---------------------------------------------------------------- steps
def job_dir(env: Mapping[str, str]) -> Path:
    """Shared by the job's nodes: the submit dir is on a filesystem they all see."""
    return Path(env["SLURM_SUBMIT_DIR"]) / f".ray-{env['SLURM_JOB_ID']}"


def prepare(env: Mapping[str, str]) -> str:
    """Make the job's dir with a fresh token (a requeued job starts clean); return shell assignments
    for the batch script: job_dir, cpus_per_node."""
    s = shape(env)
    path = job_dir(env)
    shutil.rmtree(path, ignore_errors=True)
    path.mkdir(mode=0o700)
    token = path / TOKEN_FILE
    token.touch(mode=0o600)
    token.write_text(secrets.token_hex(32))
    return f"job_dir={shlex.quote(str(path))}\ncpus_per_node={s.cpus_per_node}\n"


def ray_start_args(env: Mapping[str, str], ip: str) -> list[str]:
    ray = Path(sys.executable).with_name("ray")
    return [str(ray if ray.exists() else "ray"), "start", "--block", f"--node-ip-address={ip}",
            f"--num-cpus={env.get('SLURM_CPUS_ON_NODE') or 1}", f"--num-gpus={env.get('SLURM_GPUS_ON_NODE') or 0}",
            f"--temp-dir={ray_temp_dir(env)}", "--disable-usage-stats",
            # Workers' ports from the OS: ray start's default range (10002-19999) is shared by every job here.
            "--min-worker-port=0", "--max-worker-port=0"]


def run_node(directory: Path, env: Mapping[str, str]) -> int:
    """One srun task per node: start this node's Ray (the head on the step's first node, which is
    the batch step's), hold it until SIGTERM, then stop it and remove its temp dir. Its ports are
    free when chosen but bound by `ray start` a moment later: one another process took meanwhile
    makes `ray start` fail, and it is started again on other ports (START_ATTEMPTS in all)."""
    ip = node_ip(env["SLURMD_NODENAME"], env)
    head = env["SLURM_NODEID"] == "0"
    if head:
        publish(directory / STEP_FILE, f"{env['SLURM_JOB_ID']}.{env['SLURM_STEP_ID']}")
    running: list[subprocess.Popen] = []
    stopping: list[int] = []  # the signal that asked this node to stop: then no restart

    def stop(signum, frame):
        stopping.append(signum)
        for p in running:
            stop_tree(p)

    signal.signal(signal.SIGTERM, stop)
    signal.signal(signal.SIGINT, stop)
    threading.Thread(target=watch_stop_file, args=(directory / STOP_FILE, stop), daemon=True).start()
    restart = int(env.get("SLURM_RESTART_COUNT") or 0)
    taker = Faults.from_env().port_taken_due(restart) and head
    held: list[socket.socket] = []
    try:
        for attempt in range(1, START_ATTEMPTS + 1):
            cmd, ports = node_command(directory, env, ip, head)
            if taker and attempt == 1:
                held.append(listen_on(ports[1]))  # the client server's: what a requeued job once lost to another
            proc = subprocess.Popen(cmd + ["--log-color=false"], stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                    text=True)
            running[:] = [proc]
            threading.Thread(target=copy_warnings, args=(proc.stdout,), daemon=True).start()
            published = False
            if head:
                # Published once the GCS and the client server listen, and from this `ray start`'s own
                # processes: a port someone else took answers too, and would hand the job their server.
                wait_for_head(proc, ip, ports[:2])
                if proc.poll() is None:
                    publish(directory / HEAD_FILE, f"{ip}:{ports[0]}")
                    published = True
            code = proc.wait()
            stop_tree(proc)
            if stopping:  # asked to stop, and stopped: a success, whatever `ray start` exits with on SIGTERM
                return 0
            if code == 0 or published:
                return code
            taken = taken_ports(ip, ports)
            for sock in held:
                sock.close()
            if not taken:
                if head:
                    raise LaunchError(f"the Ray head on {ip} exited ({code}) before it answered")
                return code
            if attempt == START_ATTEMPTS:
                raise LaunchError(f"`ray start` on {ip} failed {START_ATTEMPTS} times on a port taken between choice "
                                  f"and bind; the last: port {taken[0]}, {port_holder(taken[0])}")
            print(f"logicrl.launch.slurm: port {taken[0]} on {ip} was taken before Ray bound it "
                  f"({port_holder(taken[0])}); starting Ray again on other ports", file=sys.stderr, flush=True)
        return 1
    finally:
        for sock in held:
            sock.close()
        for p in running:
            stop_tree(p)
        shutil.rmtree(ray_temp_dir(env), ignore_errors=True)


def listen_on(port: int) -> socket.socket:
    """A listening socket on `port` on every interface, as Ray's servers bind (LOGICRL_INJECT_FAULT=taken)."""
    sock = socket.socket()
    sock.bind(("0.0.0.0", port))
    sock.listen()
    return sock


def watch_stop_file(path: Path, stop) -> None:
    """Call stop() once `path` exists (the wrapper's request: STOP_FILE)."""
    while not path.exists():
        time.sleep(STOP_POLL_S)
    stop(0, None)


def node_command(directory: Path, env: Mapping[str, str], ip: str, head: bool) -> tuple[list[str], list[int]]:
    """`ray start` for this node, and the ports chosen for it (the GCS's first on the head)."""
    cmd = ray_start_args(env, ip)
    if head:
        # The dashboard and agent ports are fixed by default (8265, 52365): two jobs on a node clash.
        ports = free_ports(ip, 4)
        gcs, client, dashboard, agent = ports
        cmd += ["--head", f"--port={gcs}", f"--ray-client-server-port={client}", "--include-dashboard=false",
                f"--dashboard-port={dashboard}", f"--dashboard-agent-listen-port={agent}"]
    else:
        ports = free_ports(ip, 1)
        cmd += [f"--address={wait_for_file(directory / HEAD_FILE, WAIT_S)}",
                f"--dashboard-agent-listen-port={ports[0]}"]
    return cmd, ports


def wait_for_head(proc: subprocess.Popen, ip: str, ports: list[int]) -> None:
    """Until `proc` (the head's `ray start`) listens on the GCS port and, within CLIENT_GRACE_S more,
    the client server's, or has ended."""
    deadline, gcs_since = time.monotonic() + WAIT_S, None
    while proc.poll() is None:
        mine = ours_listening(proc, ports)
        if ports[0] in mine and answers(ip, ports[0]):
            gcs_since = gcs_since or time.monotonic()
            if ports[1] in mine or time.monotonic() - gcs_since > CLIENT_GRACE_S:
                return
        if time.monotonic() > deadline:
            raise LaunchError(f"the Ray head on {ip} did not listen on port {ports[0]} within {WAIT_S:.0f} s")
        time.sleep(0.5)


def ours_listening(proc: subprocess.Popen, ports: list[int]) -> set[int]:
    """Of `ports`, those a process of `proc`'s tree listens on."""
    import psutil

    try:
        tree = {proc.pid, *(p.pid for p in psutil.Process(proc.pid).children(recursive=True))}
        conns = psutil.net_connections(kind="tcp")
    except psutil.NoSuchProcess:
        return set()
    except psutil.AccessDenied:  # cannot tell whose: take the answer on the port for ours
        return set(ports)
    return {c.laddr.port for c in conns if c.status == psutil.CONN_LISTEN and c.pid in tree and c.laddr.port in ports}


def taken_ports(ip: str, ports: list[int]) -> list[int]:
    """Of `ports`, the ones another process listens on now (after our `ray start` and its tree ended)."""
    taken = []
    for port in ports:
        with socket.socket() as s:
            s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # a closed connection's TIME_WAIT is not a holder
            try:
                s.bind((ip, port))
            except OSError:
                taken.append(port)
    return taken


def copy_warnings(lines) -> None:
    """`ray start`'s output, less its INFO and SUCC banners (which also advise `ray stop`)."""
    for line in lines:
        if not re.match(r"\S+ \S+\s+(INFO|SUCC) ", line):
            sys.stderr.write(line)


def stop_tree(proc: subprocess.Popen) -> None:
    """SIGTERM to `ray start --block` (it stops its daemons), SIGKILL to whatever of its tree is left
    after STOP_S: its descendants are noted first, since the workers are orphaned once the raylet
    dies and have their own process groups."""
    import psutil

    try:
        tree = [psutil.Process(proc.pid), *psutil.Process(proc.pid).children(recursive=True)]
    except psutil.NoSuchProcess:
        tree = []
    if proc.poll() is None:
        proc.terminate()
    _, alive = psutil.wait_procs(tree, timeout=STOP_S)
    for p in alive:
        try:
            p.kill()
        except psutil.NoSuchProcess:
            pass
    psutil.wait_procs(alive, timeout=5)


def wait_for_nodes(address: str, nnodes: int, timeout: float, alive: Callable[[], bool]) -> list[str]:
    """The IPs of the cluster's alive nodes once there are `nnodes`: the driver must not start
    before every node has joined (it places its ranks on the nodes it sees)."""
    import ray

    ray.init(address=address, log_to_driver=False, logging_level="WARNING")
    try:
        deadline = time.monotonic() + timeout
        while True:
            ips = sorted(n["NodeManagerAddress"] for n in ray.nodes() if n["Alive"])
            if len(ips) >= nnodes:
                return ips
            if not alive():
                raise LaunchError(f"the Ray nodes' step ended with {len(ips)} of {nnodes} nodes joined")
            if time.monotonic() > deadline:
                raise LaunchError(f"{len(ips)} of {nnodes} Ray nodes joined {address} within {timeout:.0f} s")
            time.sleep(0.5)
    finally:
        ray.shutdown()


def run_dir_name(env: Mapping[str, str]) -> str:
    """Named by the job, so a requeued job (same id) writes to the same directory and metrics.jsonl."""
    if env.get("SLURM_ARRAY_JOB_ID"):
        return f"slurm-{env['SLURM_ARRAY_JOB_ID']}_{env['SLURM_ARRAY_TASK_ID']}"
    return f"slurm-{env['SLURM_JOB_ID']}"


def driver_argv(env: Mapping[str, str], address: str, user_args: list[str]) -> list[str]:
    """main_ppo's command line: the job's shape and cluster, then the user's overrides. A key the
    user gives is theirs: ours is left out, so the driver's command line shows one value per key."""
    s = shape(env)
    ours = {
        "trainer.nnodes": str(s.nnodes),
        "trainer.n_gpus_per_node": str(s.ranks_per_node),
        "trainer.ray_address": address,
        "hydra.run.dir": f"outputs/${{trainer.project_name}}/${{trainer.experiment_name}}/{run_dir_name(env)}",
    }
    given = {arg.split("=", 1)[0].lstrip("+~") for arg in user_args}
    return [sys.executable, str(MAIN), *(f"{k}={v}" for k, v in ours.items() if k not in given), *user_args]


def process_alive(pid: int) -> Callable[[], bool]:
    import psutil

    def alive() -> bool:
        try:
            return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
        except psutil.NoSuchProcess:
            return False

    return alive


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m logicrl.launch.slurm", description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="step", required=True)
    sub.add_parser("prepare", help="make the job's shared dir and token; print job_dir= and cpus_per_node=")
    node = sub.add_parser("node", help="this node's Ray, until SIGTERM (one srun task per node)")
    node.add_argument("job_dir", type=Path)
    driver = sub.add_parser("driver", help="wait for every node to join; print RAY_ADDRESS=... and main_ppo's "
                                                   "argv (overrides after --), one per line")
    driver.add_argument("job_dir", type=Path)
    driver.add_argument("--nodes-pid", type=int, required=True, help="the srun holding the Ray nodes")
    sub.add_parser("clean", help="remove this node's Ray dir (one srun task per node)")
    argv = sys.argv[1:] if argv is None else argv
    # Everything after "--" is main_ppo's, untouched (argparse would take "-m" or "--help" itself).
    cut = argv.index("--") if "--" in argv else len(argv)
    args = parser.parse_args(argv[:cut])
    overrides = argv[cut + 1:]
    env = os.environ
    try:
        if args.step == "prepare":
            print(prepare(env), end="")
        elif args.step == "node":
            return run_node(args.job_dir, env)
        elif args.step == "driver":
            alive = process_alive(args.nodes_pid)
            address = wait_for_file(args.job_dir / HEAD_FILE, WAIT_S, alive)
            ips = wait_for_nodes(address, shape(env).nnodes, WAIT_S, alive)
            print(f"logicrl.launch.slurm: Ray at {address}, {len(ips)} nodes: {' '.join(ips)}", file=sys.stderr)
            print("\n".join([f"RAY_ADDRESS={address}", *driver_argv(env, address, overrides)]))
        elif args.step == "clean":
            shutil.rmtree(ray_temp_dir(env), ignore_errors=True)
    except LaunchError as err:
        print(f"error: {err}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
