"""The sandbox's first process: run by path (`python -I -S sandbox_launch.py CONFIG_JSON`), standard
library only, never imported. It confines itself, then runs the model's code:

  launcher (new session) -- joins the pids cgroup, unshares net/mount/pid namespaces (each where the
    kernel allows) --fork--> init (pid 1 of the new pid namespace: remounts every filesystem read-only
    but the work directory, mounts a fresh read-only /proc, reaps orphans) --fork--> worker (rlimits,
    then exec `python -I main.py` with an empty environment).

When init exits the kernel kills everything left in the namespace, however it detached itself
(setsid, double fork), so nothing the code started outlives the call. A single JSON status line
(what was applied) goes to the status fd before the code runs. Done here rather than in a
`preexec_fn`, which is unsafe in a threaded parent.
"""

import ctypes
import json
import os
import resource
import sys

CLONE_NEWNS, CLONE_NEWNET, CLONE_NEWPID = 0x00020000, 0x40000000, 0x20000000
MS_RDONLY, MS_NOSUID, MS_NODEV, MS_NOEXEC = 1, 2, 4, 8
MS_REMOUNT, MS_BIND, MS_REC, MS_PRIVATE = 32, 4096, 16384, 1 << 18
_FLAG_NAMES = {"nosuid": MS_NOSUID, "nodev": MS_NODEV, "noexec": MS_NOEXEC}

libc = ctypes.CDLL(None, use_errno=True)


def _mount(source, target, fstype, flags):
    enc = [None if x is None else x.encode() for x in (source, target, fstype)]
    return libc.mount(enc[0], enc[1], enc[2], ctypes.c_ulong(flags), None) == 0


def _mount_points():
    points = []
    with open("/proc/self/mountinfo") as f:
        for line in f:
            fields = line.split()
            opts = fields[5].split(",")
            keep = sum(flag for name, flag in _FLAG_NAMES.items() if name in opts)
            points.append((fields[4].replace("\\040", " "), keep))
    return points


def read_only_except(workdir):
    """Every mount read-only in this (private) mount namespace, the work directory writable.
    MS_BIND on every remount: a plain MS_REMOUNT|MS_RDONLY would change the filesystem itself,
    for the whole machine; a bind remount changes only this namespace's view."""
    if not _mount(None, "/", None, MS_REC | MS_PRIVATE):
        return False  # without a private tree, remounts could propagate to the host: do none
    if not _mount(workdir, workdir, None, MS_BIND | MS_REC):
        return False
    failed = 0
    for point, keep in _mount_points():
        if point == workdir:
            continue
        if not _mount(None, point, None, MS_REMOUNT | MS_BIND | MS_RDONLY | keep):
            failed += 1
    return failed == 0


def set_limits(limits):
    for name, value in limits.items():
        resource.setrlimit(getattr(resource, name), (value, value + 1 if name == "RLIMIT_CPU" else value))


def run_worker(cfg):
    os.chdir(cfg["workdir"])
    set_limits(cfg["rlimits"])
    os.execve(cfg["python"], [cfg["python"], *cfg["python_flags"], "main.py"], {})


def init(cfg, status):
    """pid 1 of the namespace: confine the filesystem, start the worker, reap until it ends."""
    if status["mount_ns"]:
        status["read_only_fs"] = read_only_except(cfg["workdir"])
        if status["pid_ns"]:
            status["private_proc"] = _mount("proc", "/proc", "proc", MS_NOSUID | MS_NODEV | MS_NOEXEC | MS_RDONLY)
    _report(cfg, status)
    worker = os.fork()
    if worker == 0:
        run_worker(cfg)
    while True:
        try:
            pid, code = os.wait()
        except ChildProcessError:
            os._exit(111)
        if pid == worker:
            os._exit(os.waitstatus_to_exitcode(code) if code & 0x7F == 0 else 128 + (code & 0x7F))


def _report(cfg, status):
    os.write(cfg["status_fd"], (json.dumps(status) + "\n").encode())
    os.close(cfg["status_fd"])


def main():
    cfg = json.loads(sys.argv[1])
    status = {"cgroup": False, "net_ns": False, "mount_ns": False, "pid_ns": False, "read_only_fs": False,
              "private_proc": False}
    if cfg["cgroup"]:
        # First thing: every process forked from here on is counted against pids.max.
        with open(os.path.join(cfg["cgroup"], "cgroup.procs"), "w") as f:
            f.write(str(os.getpid()))
        status["cgroup"] = True
    wanted = [(CLONE_NEWNET, "net_ns")] if cfg["isolate_network"] else []
    wanted += [(CLONE_NEWNS, "mount_ns")] if cfg["read_only_fs"] else []
    wanted += [(CLONE_NEWPID, "pid_ns")]
    for flag, name in wanted:  # one at a time: a kernel refusing one still grants the others
        status[name] = libc.unshare(flag) == 0
    if not status["pid_ns"]:  # no namespace to die with: run the worker directly in this session
        if status["mount_ns"]:
            status["read_only_fs"] = read_only_except(cfg["workdir"])
        _report(cfg, status)
        run_worker(cfg)
    child = os.fork()
    if child == 0:
        init(cfg, status)
    os.close(cfg["status_fd"])
    _, code = os.waitpid(child, 0)
    sys.exit(os.waitstatus_to_exitcode(code) if code & 0x7F == 0 else 128 + (code & 0x7F))


if __name__ == "__main__":
    main()
