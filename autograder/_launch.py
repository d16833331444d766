"""Start a learner's process inside its sandbox: ``python _launch.py SPEC.json -- CMD...``.

Run as a script, never imported by the grader, and kept to the standard library so that it
starts fast. When the grader runs as root it is started by ``unshare`` in new network,
mount, PID and IPC namespaces; then it caps the new IPC namespace's shared memory, brings up the loopback interface (the namespace's only
one), builds a new root file system that holds only what the
learner's code needs (system libraries, the Python installation and virtual environment,
the course package (or the view of it that the spec lays over it), the course data, and the sandbox folder), mounts a fresh ``/proc``,
``/tmp`` and ``/dev``, and drops to an unprivileged user. In every case it sets the
resource limits, closes inherited file descriptors, and replaces the environment with the
spec's before it executes the command. It only lowers limits, so it also starts where
raising one is not allowed (an ordinary user, root in a container).
"""
import ctypes
import fcntl
import json
import os
import resource
import signal
import socket
import struct
import sys

MS_RDONLY, MS_NOSUID, MS_NODEV, MS_NOEXEC = 1, 2, 4, 8
MS_REMOUNT, MS_BIND, MS_REC, MS_PRIVATE = 32, 4096, 16384, 1 << 18
PR_SET_NO_NEW_PRIVS, PR_SET_PDEATHSIG = 38, 1
SIOCGIFFLAGS, SIOCSIFFLAGS, IFF_UP = 0x8913, 0x8914, 0x1
DEVICES = ("null", "zero", "full", "random", "urandom")
IPC_OBJECTS = 64  # System V segments and message queues a sandbox may hold at once

libc = ctypes.CDLL(None, use_errno=True)


def mount(source, target, fstype, flags, data=None):
    encode = lambda s: None if s is None else str(s).encode()  # noqa: E731
    if libc.mount(encode(source), encode(target), encode(fstype), ctypes.c_ulong(flags), encode(data)) != 0:
        error = ctypes.get_errno()
        raise OSError(error, f"mount {source} on {target}: {os.strerror(error)}")


def bind(path, root, writable=False, device=False, at=None):
    """Bind ``path`` at the same place under ``root``, or at ``at`` (symbolic links are recreated)."""
    target = root + (at or path)
    if os.path.islink(path):
        os.makedirs(os.path.dirname(target), exist_ok=True)
        if not os.path.lexists(target):
            os.symlink(os.readlink(path), target)
        return
    if not os.path.exists(path):
        return
    if os.path.isdir(path):
        os.makedirs(target, exist_ok=True)
    else:
        os.makedirs(os.path.dirname(target), exist_ok=True)
        open(target, "a").close()
    mount(path, target, None, MS_BIND | MS_REC)
    flags = MS_REMOUNT | MS_BIND | MS_NOSUID | (0 if device else MS_NODEV) | (0 if writable else MS_RDONLY)
    mount(None, target, None, flags)


def loopback_up():
    """Bring up ``lo``, the only interface of the new network namespace: the learner's code
    can then talk to itself on 127.0.0.1 (a gloo process group, a local server) and reach
    nothing else."""
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as sock:
        request = struct.pack("16sH14x", b"lo", 0)
        flags = struct.unpack("16sH14x", fcntl.ioctl(sock, SIOCGIFFLAGS, request))[1]
        fcntl.ioctl(sock, SIOCSIFFLAGS, struct.pack("16sH14x", b"lo", flags | IFF_UP))


def limit_ipc(memory):
    """Cap System V IPC in the sandbox's new IPC namespace (these settings are its own): no
    segment, and no sum of segments, above ``memory`` bytes, the kernel's memory limit."""
    page = os.sysconf("SC_PAGE_SIZE")
    settings = {"shmmax": memory, "shmall": memory // page, "shmmni": IPC_OBJECTS, "msgmni": IPC_OBJECTS}
    for name, value in settings.items():
        with open("/proc/sys/kernel/" + name, "w") as stream:
            stream.write(str(value))


def build_root(spec):
    root = spec["root"]
    mount(None, "/", None, MS_REC | MS_PRIVATE)
    mount("tmpfs", root, "tmpfs", MS_NOSUID | MS_NODEV, "size=16m,mode=755")
    os.makedirs(root + "/tmp", exist_ok=True)
    mount("tmpfs", root + "/tmp", "tmpfs", MS_NOSUID | MS_NODEV, f"size={spec['tmp_bytes']},mode=1777")
    for path in spec["read_only"]:
        bind(path, root)
    for path, at in spec.get("overlays", ()):
        bind(path, root, at=at)
    for path in spec["writable"]:
        bind(path, root, writable=True)
    os.makedirs(root + "/dev", exist_ok=True)
    mount("tmpfs", root + "/dev", "tmpfs", MS_NOSUID, "size=64k,mode=755")
    for name in DEVICES:
        bind("/dev/" + name, root, writable=True, device=True)
    # POSIX shared memory lives in a folder of the sandbox's /tmp, so it counts within /tmp's size.
    shm = root + "/tmp/.shm"
    os.mkdir(shm)
    os.chmod(shm, 0o1777)
    os.makedirs(root + "/dev/shm", exist_ok=True)
    mount(shm, root + "/dev/shm", None, MS_BIND)
    os.makedirs(root + "/proc", exist_ok=True)
    mount("proc", root + "/proc", "proc", MS_NOSUID | MS_NODEV | MS_NOEXEC)
    os.chroot(root)


def set_limit(limit, value):
    """Lower ``limit`` to ``value`` (soft and hard), never above the hard limit in force: raising
    a hard limit needs CAP_SYS_RESOURCE, which an ordinary user and a container's root lack.
    ``None`` asks for no limit, so the one in force stays."""
    if value is None:
        return
    _, hard = resource.getrlimit(limit)
    value = int(value) if hard == resource.RLIM_INFINITY else min(int(value), hard)
    resource.setrlimit(limit, (value, value))


def main(argv):
    spec_path, separator, command = argv[1], argv[2], argv[3:]
    if separator != "--" or not command:
        raise SystemExit("usage: _launch.py SPEC.json -- COMMAND...")
    with open(spec_path) as stream:
        spec = json.load(stream)
    uid, gid = spec.get("uid"), spec.get("gid")
    if spec.get("connection_file") and uid is not None:
        os.chown(spec["connection_file"], uid, gid)
    if spec.get("pidns_file"):
        # Root's note of the PID namespace this sandbox runs in: the grader kills exactly
        # the processes in it, never other processes of the same user id.
        with open(spec["pidns_file"], "w") as stream:
            stream.write(os.readlink("/proc/self/ns/pid"))
    if spec.get("cgroup"):
        # The sandbox's own cgroup, of the same CPU weight as every other sandbox's.
        with open(os.path.join(spec["cgroup"], "cgroup.procs"), "w") as stream:
            stream.write(str(os.getpid()))
    if spec.get("shm_bytes"):
        limit_ipc(spec["shm_bytes"])
    if spec.get("loopback"):
        loopback_up()
    if spec.get("isolate_files"):
        build_root(spec)
    os.chdir(spec["cwd"])
    for name, value in spec["rlimits"].items():
        set_limit(getattr(resource, "RLIMIT_" + name), value)
    libc.prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0)
    if uid is not None:
        os.setgroups([])
        os.setgid(gid)
        os.setuid(uid)
        libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)  # changing user cleared it
    os.umask(0o077)
    quiet = os.open("/dev/null", os.O_WRONLY)
    os.dup2(quiet, 1)
    os.dup2(quiet, 2)
    os.closerange(3, 65536)
    os.execve(command[0], command, spec["env"])


if __name__ == "__main__":
    main(sys.argv)
