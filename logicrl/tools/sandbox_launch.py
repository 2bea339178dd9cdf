"""The sandbox's first process: run by path (`python -I -S sandbox_launch.py CONFIG_JSON`), standard
library only, never imported. It confines itself, then runs the model's code:

  launcher (new session): joins the pids cgroup; unshares net, mount, pid, ipc and uts namespaces,
    each where the kernel allows (a non-root user first enters a user namespace)
  --fork--> init, pid 1 of the new pid namespace: a minimal /dev, every filesystem read-only but
    the work directory, a fresh read-only /proc; reaps orphans
  --fork--> worker: rlimits, every capability dropped, exec `python -I main.py` in a fixed environment.

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
CLONE_NEWIPC, CLONE_NEWUTS, CLONE_NEWUSER = 0x08000000, 0x04000000, 0x10000000
MS_MOVE = 8192
PR_CAPBSET_DROP, PR_SET_CHILD_SUBREAPER, PR_SET_NO_NEW_PRIVS = 24, 36, 38
_DEVICES = ("null", "zero", "full", "random", "urandom")
MS_RDONLY, MS_NOSUID, MS_NODEV, MS_NOEXEC = 1, 2, 4, 8
MS_REMOUNT, MS_BIND, MS_REC, MS_PRIVATE = 32, 4096, 16384, 1 << 18
_FLAG_NAMES = {"nosuid": MS_NOSUID, "nodev": MS_NODEV, "noexec": MS_NOEXEC}

libc = ctypes.CDLL(None, use_errno=True)


def _mount(source, target, fstype, flags, data=None):
    enc = [None if x is None else x.encode() for x in (source, target, fstype, data)]
    return libc.mount(enc[0], enc[1], enc[2], ctypes.c_ulong(flags), enc[3]) == 0


def minimal_dev(workdir):
    """A fresh /dev with only null, zero, full, random, urandom and the fd links: root without
    capabilities still owns the disks' device nodes, so the host's /dev must not be visible. Built
    aside (in the work directory), the host's nodes bind-mounted in (mknod is refused in a user
    namespace; rootless containers do the same), then moved over /dev."""
    staging = os.path.join(workdir, ".dev")
    os.mkdir(staging)
    if not _mount("tmpfs", staging, "tmpfs", MS_NOSUID | MS_NOEXEC, "mode=755,size=64k"):
        os.rmdir(staging)
        return False
    for name in _DEVICES:
        open(os.path.join(staging, name), "w").close()
        if not _mount(f"/dev/{name}", os.path.join(staging, name), None, MS_BIND):
            return False
    for i, name in enumerate(("stdin", "stdout", "stderr")):
        os.symlink(f"/proc/self/fd/{i}", os.path.join(staging, name))
    os.symlink("/proc/self/fd", os.path.join(staging, "fd"))
    moved = _mount(staging, "/dev", None, MS_MOVE)
    os.rmdir(staging)
    return moved


def enter_user_namespace():
    """For a user other than root: a user namespace in which it is root, so the other namespaces
    and the mounts below are allowed (where the kernel permits unprivileged user namespaces)."""
    uid, gid = os.getuid(), os.getgid()
    if libc.unshare(CLONE_NEWUSER) != 0:
        return False
    for name, text in (("setgroups", "deny"), ("uid_map", f"0 {uid} 1"), ("gid_map", f"0 {gid} 1")):
        with open(f"/proc/self/{name}", "w") as f:
            f.write(text)
    return True


def drop_capabilities():
    """No capability survives the exec: the bounding set emptied, then this process's own sets,
    and no_new_privs so no setuid binary gives them back. Root without capabilities cannot mount,
    unmount, change limits upwards or leave its cgroup through a read-only /sys."""
    with open("/proc/sys/kernel/cap_last_cap") as f:
        last = int(f.read())
    for cap in range(last + 1):
        libc.prctl(PR_CAPBSET_DROP, cap, 0, 0, 0)
    header = (ctypes.c_uint32 * 2)(0x20080522, 0)  # _LINUX_CAPABILITY_VERSION_3, this process
    data = (ctypes.c_uint32 * 6)()  # effective, permitted, inheritable x 2 words, all zero
    ok = libc.capset(header, data) == 0
    return libc.prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) == 0 and ok


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
    """Every mount read-only in this (private) mount namespace, the work directory writable; whether
    that held, and the mount points that stayed writable.
    MS_BIND on every remount: a plain MS_REMOUNT|MS_RDONLY would change the filesystem itself,
    for the whole machine; a bind remount changes only this namespace's view."""
    if not _mount(workdir, workdir, None, MS_BIND | MS_REC):
        return False, []
    failed = []
    for point, keep in _mount_points():
        if point == workdir or not os.path.exists(point):  # a mount hidden under another (the old /dev/pts)
            continue
        if not _mount(None, point, None, MS_REMOUNT | MS_BIND | MS_RDONLY | keep):
            failed.append(point)
    return not failed, failed


def set_limits(limits):
    for name, value in limits.items():
        resource.setrlimit(getattr(resource, name), (value, value + 1 if name == "RLIMIT_CPU" else value))


def run_worker(cfg):
    os.chdir(cfg["workdir"])
    set_limits(cfg["rlimits"])
    if cfg["drop_capabilities"] and not drop_capabilities():
        sys.exit("sandbox: dropping capabilities failed")
    os.execve(cfg["python"], [cfg["python"], *cfg["python_flags"], "main.py"], cfg["env"])


def init(cfg, status):
    """pid 1 of the namespace (or, without one, a subreaper in this session): confine the filesystem,
    start the worker, reap until it ends. Without a pid namespace nothing kills what is left when
    init exits, so init kills it: orphans, setsid() or not, are re-parented to a subreaper."""
    if status["mount_ns"]:
        if _mount(None, "/", None, MS_REC | MS_PRIVATE):  # else a mount could propagate to the host: none
            status["minimal_dev"] = minimal_dev(cfg["workdir"])
            status["read_only_fs"], status["writable_mounts"] = read_only_except(cfg["workdir"])
            if status["pid_ns"]:
                status["private_proc"] = _mount("proc", "/proc", "proc",
                                                MS_NOSUID | MS_NODEV | MS_NOEXEC | MS_RDONLY)
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
            if not status["pid_ns"]:
                _kill_children()
            os._exit(os.waitstatus_to_exitcode(code) if code & 0x7F == 0 else 128 + (code & 0x7F))


def _kill_children():
    """SIGKILL and reap this process's children until none is left (a dying child's own children
    are re-parented here, so this loops)."""
    me = str(os.getpid()).encode()
    for _ in range(1000):
        children = []
        for entry in os.listdir("/proc"):
            try:
                with open(f"/proc/{entry}/stat", "rb") as f:
                    stat = f.read()
            except (OSError, ValueError):
                continue
            if stat[stat.rfind(b")") + 2:].split()[1:2] == [me]:
                children.append(int(entry))
        if not children:
            return
        for pid in children:
            try:
                os.kill(pid, 9)
            except ProcessLookupError:
                pass
        for _ in children:
            try:
                os.wait()
            except ChildProcessError:
                break


def _report(cfg, status):
    os.write(cfg["status_fd"], (json.dumps(status) + "\n").encode())
    os.close(cfg["status_fd"])


def main():
    cfg = json.loads(sys.argv[1])
    status = {"cgroup": False, "user_ns": False, "net_ns": False, "mount_ns": False, "pid_ns": False,
              "ipc_uts_ns": False, "read_only_fs": False, "minimal_dev": False, "private_proc": False,
              "no_capabilities": cfg["drop_capabilities"]}
    if cfg["cgroup"]:
        # First thing: every process forked from here on is counted against pids.max.
        try:
            with open(os.path.join(cfg["cgroup"], "cgroup.procs"), "w") as f:
                f.write(str(os.getpid()))
            status["cgroup"] = True
        except OSError:
            pass  # reported: the parent's watchdog counts processes instead
    if os.getuid() != 0 and cfg["namespaces"]:
        status["user_ns"] = enter_user_namespace()
    wanted = [(CLONE_NEWNET, "net_ns")] if cfg["isolate_network"] else []
    wanted += [(CLONE_NEWNS, "mount_ns")] if cfg["read_only_fs"] else []
    wanted += [(CLONE_NEWPID, "pid_ns"), (CLONE_NEWIPC | CLONE_NEWUTS, "ipc_uts_ns")]
    wanted = wanted if cfg["namespaces"] else []
    for flag, name in wanted:  # one at a time: a kernel refusing one still grants the others
        status[name] = libc.unshare(flag) == 0
    if not status["pid_ns"]:  # no namespace to die with: this process reaps and ends what is left
        libc.prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0)
        init(cfg, status)
    child = os.fork()
    if child == 0:
        init(cfg, status)
    os.close(cfg["status_fd"])
    _, code = os.waitpid(child, 0)
    sys.exit(os.waitstatus_to_exitcode(code) if code & 0x7F == 0 else 128 + (code & 0x7F))


if __name__ == "__main__":
    main()
