# toolsandbox_workspace.py: the keeper of a session workspace (policies/
# README.md, "sessions"; docs/ARCHITECTURE.md, "A workspace"). Run by the
# compiled session policy's tool mode as `python3 -I -S -B -c <this file>
# PROGRAM...`, the programs the policy's sessions may start; embedded into
# the daemon at build time, without this comment block.
#
# It is the sandbox's only long-lived process. Its stdin is a stream socket
# to the front end, which sends, for each session, one message: a 4-byte
# big-endian length, then JSON {"argv": [...], "env": {...}}, with the
# session's three pipe ends (stdin, stdout, stderr) attached as SCM_RIGHTS.
# It starts the command on them (argv[0] must be one of its own arguments),
# and when the command exits, or when the front end sends {"end": true}, it
# kills every other process of the sandbox (kill(-1): all but pid 1 and
# itself), reaps its own children, and checks that none is left, so no
# process of a session outlives it; then it answers with {"exit": N} or
# {"signal": N} and the session's CPU time ("cpu_ms"). While the command
# runs, {"signal": N} (one of FORWARDED) is delivered to it, as kill(2)
# would, and the session goes on. A session that changed what the keeper's
# children inherit (its resource limits, nice value, CPUs, scheduling and
# I/O priority: the command runs as its uid) ends the keeper, and with it
# the workspace: nothing of one session's settings reaches the next.
# A socket that closes (the daemon let the workspace go, or the session of
# a one-shot sandbox ended) ends it, and with it the sandbox: it then exits
# as the last command did (its status, or its signal), so that the
# sandbox's end says how a session in a sandbox of its own ended. Its own
# stdout and stderr are the sandbox's: the front end logs what it writes
# there (nothing, unless the protocol is broken).
import ctypes
import json
import os
import resource
import select
import signal
import socket
import sys
import time

ALLOWED = sys.argv[1:]
# Not dumpable: a session's command (the same uid) can neither read nor
# write this process's memory (/proc/PID/mem) nor open its descriptors
# (/proc/PID/fd), so none reaches the socket that starts the next session.
LIBC = ctypes.CDLL(None, use_errno=True)
if LIBC.prctl(4, 0, 0, 0, 0) != 0:  # PR_SET_DUMPABLE
    os.write(2, b"toolsandbox workspace: prctl(PR_SET_DUMPABLE) failed\n")
    os._exit(125)
MAX_MESSAGE = 1 << 20
# The signals a client may send a session's command (toolsandbox session
# forwards these); never one that stops it or that it cannot handle.
FORWARDED = {signal.SIGHUP, signal.SIGINT, signal.SIGQUIT, signal.SIGUSR1, signal.SIGUSR2, signal.SIGTERM,
             signal.SIGWINCH}
SELF = os.getpid()
sock = socket.socket(fileno=0)
wake_r, wake_w = os.pipe2(os.O_NONBLOCK | os.O_CLOEXEC)
signal.signal(signal.SIGCHLD, lambda signum, frame: None)
signal.set_wakeup_fd(wake_w)


def fail(why):
    os.write(2, ("toolsandbox workspace: %s\n" % why).encode("utf-8", "replace"))
    os._exit(125)


def receive():
    """The next message and the descriptors that came with it; (None, fds) at EOF."""
    fds, data = [], b""
    need = 4
    while len(data) < need:
        chunk, got, _, _ = socket.recv_fds(sock, need - len(data), 4)
        fds.extend(got)
        if not chunk:
            return None, fds
        data += chunk
        if need == 4 and len(data) == 4:
            need = 4 + int.from_bytes(data, "big")
            if need - 4 > MAX_MESSAGE:
                fail("a message of %d bytes" % (need - 4))
    try:
        return json.loads(data[4:]), fds
    except ValueError:
        fail("a message that is not JSON")


def send(message):
    body = json.dumps(message).encode()
    sock.sendall(len(body).to_bytes(4, "big") + body)


def others():
    return [p for p in os.listdir("/proc") if p.isdigit() and int(p) not in (1, SELF)]


def end_the_rest(command=None):
    """Kills every process but pid 1 and this one, reaps this one's children
    (a clone(CLONE_PARENT) child of a command is one), and returns the
    command's status if it was reaped here. Processes that remain after
    repeated kills end the keeper, and so the workspace."""
    status = None
    for _ in range(200):
        try:
            os.kill(-1, signal.SIGKILL)
        except ProcessLookupError:
            pass
        while True:
            try:
                pid, st = os.waitpid(-1, os.WNOHANG)
            except ChildProcessError:
                break
            if pid == 0:
                break
            if pid == command:
                status = st
        if not others():
            return status
        time.sleep(0.005)
    fail("processes of a session remain after it ended")


IOPRIO_GET = {"x86_64": 252, "aarch64": 31}.get(os.uname().machine)


def settings():
    """What a command (the same uid) can change of this process and its
    children would inherit: the resource limits, the nice value, the CPUs,
    the scheduling policy and priority, the I/O priority."""
    limits = [(name, resource.getrlimit(getattr(resource, name))) for name in sorted(dir(resource))
              if name.startswith("RLIMIT_")]
    io = LIBC.syscall(IOPRIO_GET, 1, 0) if IOPRIO_GET else None  # IOPRIO_WHO_PROCESS, itself
    return (limits, os.getpriority(os.PRIO_PROCESS, 0), sorted(os.sched_getaffinity(0)), os.sched_getscheduler(0),
            os.sched_getparam(0).sched_priority, io)


def start(argv, env, fds):
    pid = os.fork()
    if pid:
        return pid
    try:
        signal.set_wakeup_fd(-1)
        # Every signal as the engine gives it to a sandbox's first process:
        # default, unblocked (Python ignores SIGPIPE and SIGXFSZ, and an
        # ignored signal stays ignored across execve).
        for number in range(1, signal.NSIG):
            if number not in (signal.SIGKILL, signal.SIGSTOP):
                try:
                    signal.signal(number, signal.SIG_DFL)
                except (OSError, ValueError):
                    pass  # (numbers no signal has)
        signal.pthread_sigmask(signal.SIG_SETMASK, [])
        for number, fd in enumerate(fds):
            os.dup2(fd, number)
        os.closerange(3, os.sysconf("SC_OPEN_MAX"))
        os.execve(argv[0], argv, env)
    except OSError as e:
        os.write(2, ("toolsandbox session: cannot start %s: %s\n" % (argv[0], e.strerror)).encode("utf-8", "replace"))
    except BaseException:  # never back into the keeper's loop: this is the child
        os.write(2, ("toolsandbox session: cannot start %s\n" % argv[0]).encode("utf-8", "replace"))
    os._exit(127)


def exit_as(status):
    """Ends this process as `status` (a wait status) says: its exit code, or
    its signal; 0 for none."""
    end_the_rest()
    if status is not None and os.WIFSIGNALED(status):
        sig = os.WTERMSIG(status)
        try:
            if sig != signal.SIGKILL:  # (which has no handler to reset)
                signal.signal(sig, signal.SIG_DFL)
            os.kill(SELF, sig)
        except (OSError, ValueError):
            pass
        os._exit(128 + sig)
    os._exit(os.WEXITSTATUS(status) if status is not None and os.WIFEXITED(status) else 0)


def cpu_ms():
    r = resource.getrusage(resource.RUSAGE_CHILDREN)
    return (r.ru_utime + r.ru_stime) * 1000.0


def session(request, fds):
    argv = request.get("argv")
    env = dict(os.environ)
    env.update(request.get("env") or {})
    if not isinstance(argv, list) or not argv or not all(isinstance(a, str) for a in argv) or len(fds) != 3:
        fail("a session message without a command and three descriptors")
    if argv[0] not in ALLOWED:
        os.write(fds[2], b"toolsandbox session: this command is not one the policy allows\n")
        for fd in fds:
            os.close(fd)
        return {"exit": 126, "cpu_ms": 0.0}, 126 << 8
    before = cpu_ms()
    pid = start(argv, env, fds)
    for fd in fds:
        os.close(fd)
    status = None
    while status is None:
        done, st = os.waitpid(pid, os.WNOHANG)
        if done:
            status = st
            break
        ready, _, _ = select.select([sock, wake_r], [], [])
        if wake_r in ready:
            try:
                os.read(wake_r, 512)
            except BlockingIOError:
                pass
        if sock in ready:
            message, extra = receive()
            for fd in extra:
                os.close(fd)
            sig = message.get("signal") if isinstance(message, dict) else None
            if type(sig) is int and sig in FORWARDED:
                try:
                    os.kill(pid, sig)
                except ProcessLookupError:
                    pass
                continue
            status = end_the_rest(pid)
            if status is None:
                _, status = os.waitpid(pid, 0)
            if message is None:
                exit_as(status)
    end_the_rest()
    result = {"exit": os.WEXITSTATUS(status)} if os.WIFEXITED(status) else {"signal": os.WTERMSIG(status)}
    result["cpu_ms"] = max(0.0, cpu_ms() - before)
    return result, status


SETTINGS = settings()
last = None  # the last command's wait status
while True:
    message, descriptors = receive()
    if message is None:
        exit_as(last)
    if "argv" not in message:
        for fd in descriptors:
            os.close(fd)
        continue  # an end that came after the command's own: nothing runs
    answer, last = session(message, descriptors)
    send(answer)
    if settings() != SETTINGS:  # after the session's answer: it ended as it did
        fail("a session changed the keeper's limits, nice value, CPUs, scheduling or I/O priority: the workspace ends")
