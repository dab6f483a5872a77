#!/usr/bin/python3
"""The README is a test: its commands, run as a newcomer types them.

    tests/readme/check_readme.py [--keep] [--skip-systemd]

In a fresh clone of this checkout's HEAD, under /tmp, with none of the
project's TSB_* variables set:

1. the README's start command (`./scripts/start.sh`: the set-up, the build
   of the programs, the daemon in the foreground on its embedded defaults,
   with no --config and no configuration file) runs in the background;
2. once the daemon answers, every `console` block of the README runs in
   order from the clone's top, a command every two seconds (a person
   typing in another terminal: warm sandboxes get the time they get in
   use), and each answer is checked against the lines the README shows;
3. Ctrl-C (SIGINT) stops the daemon: it must exit 0 and remove its socket;
4. the systemd section's commands that can run without booting: its build
   as written, its install into a DESTDIR, sysusers and tmpfiles applied to
   that root, then tests/systemd/verify.sh on that build (systemd-analyze
   verify, the installed configuration checked). The rest of the section
   changes the host (systemctl, usermod); the VM lane boots it
   (tests/vm/systemd-lane.sh).

A console block is lines of `$ COMMAND` each followed by the output the
README promises (stdout, then stderr). In an expected line, `…` stands for
any text; a line that is only `…` for any number of lines; a last line
`(exit status N...)` for the command's exit status, which is otherwise 0.
A block with no expected lines checks the exit status only.

Needs root (the start command installs, builds and creates namespaces).
The daemon uses the README's default socket, cgroup parent and uid range:
another toolsandboxd on this host must not be running.
"""

import argparse
import os
import re
import shlex
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.normpath(os.path.join(HERE, "..", ".."))
SOCKET = "/run/toolsandboxd/toolsandboxd.sock"
TYPING_GAP = 2.0         # seconds between two commands
START_TIMEOUT = 40 * 60  # the start command builds the programs first

failures = []


def log(msg):
    print("check_readme: " + msg, flush=True)


def fail(msg):
    failures.append(msg)
    log("FAIL: " + msg)


def blocks(readme):
    """[(heading, lang, [lines])] of the README's fenced code blocks, their
    indentation removed."""
    out, heading, block, lang, indent = [], "", None, "", 0
    for line in readme.splitlines():
        stripped = line.lstrip()
        if block is None:
            if line.startswith("## "):
                heading = line[3:].strip()
            elif stripped.startswith("```"):
                block, lang, indent = [], stripped[3:].strip(), len(line) - len(stripped)
        elif stripped.startswith("```"):
            out.append((heading, lang, block))
            block = None
        else:
            block.append(line[indent:] if line[:indent].strip() == "" else line)
    return out


def console_commands(lines):
    """[(command, [expected lines])] of a console block."""
    cmds = []
    for line in lines:
        if line.startswith("$ "):
            cmds.append((line[2:], []))
        elif cmds:
            cmds[-1][1].append(line)
        elif line.strip():
            raise ValueError("a console block must start with a '$ ' command: %r" % line)
    return cmds


def line_pattern(expected):
    return re.compile("".join(".*" if part == "…" else re.escape(part)
                              for part in re.split("(…)", expected)) + r"\Z", re.S)


def matches(expected, actual):
    """Whether the actual lines are what the expected lines promise."""
    def at(i, j):
        if i == len(expected):
            return j == len(actual)
        if expected[i] == "…":
            return any(at(i + 1, k) for k in range(j, len(actual) + 1))
        return j < len(actual) and line_pattern(expected[i]).match(actual[j]) is not None and at(i + 1, j + 1)
    return at(0, 0)


def newcomer_env():
    env = {k: v for k, v in os.environ.items() if not k.startswith("TSB_")}
    env.pop("PYTHONPATH", None)
    return env


def run_console(cmd, expected, cwd):
    status = 0
    if expected and re.match(r"\(exit status (\d+)", expected[-1]):
        status = int(re.match(r"\(exit status (\d+)", expected[-1]).group(1))
        expected = expected[:-1]
    p = subprocess.run(["bash", "-c", cmd], cwd=cwd, env=newcomer_env(), capture_output=True, timeout=300,
                       stdin=subprocess.DEVNULL)
    out = (p.stdout + p.stderr).decode("utf-8", "replace")
    actual = out.splitlines()
    ok = p.returncode == status and (not expected or matches(expected, actual))
    log("%s $ %s" % ("ok  " if ok else "FAIL", cmd))
    if not ok:
        fail("`%s` exited %d (README: %d) and printed:\n%s\n-- the README shows:\n%s"
             % (cmd, p.returncode, status, out.rstrip(), "\n".join(expected)))


def answers():
    try:
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as s:
            s.settimeout(5)
            s.connect(SOCKET)
            s.sendall(b'{"v":1,"id":"readme","type":"status"}\n')
            return b'"ok":true' in s.recv(1 << 16)
    except OSError:
        return False


def start_and_use(clone, start_cmd, consoles, logdir):
    if os.path.exists(SOCKET) and answers():
        fail("a toolsandboxd already answers on %s: stop it first (the README's start uses that socket)" % SOCKET)
        return
    log("$ %s   (in the background; its output: %s/start.log)" % (start_cmd, logdir))
    with open(os.path.join(logdir, "start.log"), "wb") as out:
        proc = subprocess.Popen(shlex.split(start_cmd), cwd=clone, env=newcomer_env(), stdin=subprocess.DEVNULL,
                                stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
    try:
        deadline = time.monotonic() + START_TIMEOUT
        while not answers():
            if proc.poll() is not None:
                fail("`%s` exited with %s before it served:\n%s" % (start_cmd, proc.returncode, tail(logdir)))
                return
            if time.monotonic() > deadline:
                fail("`%s` did not serve within %d s:\n%s" % (start_cmd, START_TIMEOUT, tail(logdir)))
                return
            time.sleep(1)
        log("the daemon answers on %s" % SOCKET)
        for heading, cmds in consoles:
            log("-- %s" % heading)
            for cmd, expected in cmds:
                time.sleep(TYPING_GAP)
                run_console(cmd, expected, clone)
        # Ctrl-C in its terminal: SIGINT to the foreground process group.
        os.killpg(proc.pid, signal.SIGINT)
        try:
            rc = proc.wait(timeout=90)
        except subprocess.TimeoutExpired:
            rc = None
        if rc != 0:
            fail("Ctrl-C: `%s` ended with %s, not 0:\n%s" % (start_cmd, rc, tail(logdir)))
        elif os.path.exists(SOCKET):
            fail("the daemon stopped and left its socket %s" % SOCKET)
        else:
            log("ok   Ctrl-C stopped the daemon (exit 0, socket removed)")
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()


def tail(logdir, n=40):
    with open(os.path.join(logdir, "start.log"), errors="replace") as f:
        return "".join(f.readlines()[-n:])


def systemd_section(clone, lines):
    """The commands of the systemd section that run without booting."""
    cmds = [l.split("  #")[0].strip() for l in lines if l.strip() and not l.startswith("#")]
    build = [c for c in cmds if c.startswith("cmake -S")]
    install = [c for c in cmds if c.startswith("cmake --install")]
    users = [c for c in cmds if c.startswith("systemd-sysusers")]
    if len(build) != 1 or len(install) != 1 or len(users) != 1:
        fail("the systemd section no longer has one build, one install and one sysusers/tmpfiles line: %r" % cmds)
        return
    dest = tempfile.mkdtemp(prefix="tsb-readme-destdir-", dir="/tmp")
    try:
        env = newcomer_env()
        env["DESTDIR"] = dest
        steps = [(build[0], None), (install[0], env),
                 (users[0].replace("systemd-sysusers ", "systemd-sysusers --root=%s " % dest)
                  .replace("systemd-tmpfiles ", "systemd-tmpfiles --root=%s " % dest), None)]
        for cmd, e in steps:
            log("$ %s%s" % ("DESTDIR=%s " % dest if e else "", cmd))
            p = subprocess.run(["bash", "-c", cmd], cwd=clone, env=e or newcomer_env(), stdin=subprocess.DEVNULL,
                               stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
            if p.returncode != 0:
                fail("`%s` exited %d:\n%s" % (cmd, p.returncode, p.stdout.decode(errors="replace")[-4000:]))
                return
        tree = re.search(r"-B\s+(\S+)", build[0]).group(1)
        for path in ("usr/sbin/toolsandboxd", "usr/bin/toolsandbox", "etc/toolsandboxd/toolsandboxd.json",
                     "etc/toolsandboxd/policies/default.json", "usr/libexec/toolsandbox/toolsandbox-init"):
            if not os.path.exists(os.path.join(dest, path)):
                fail("the README's install did not put /%s in place" % path)
        p = subprocess.run([os.path.join(clone, "tests", "systemd", "verify.sh"), os.path.join(clone, tree)],
                           cwd=clone, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
        out = p.stdout.decode(errors="replace")
        if p.returncode != 0:
            fail("tests/systemd/verify.sh on the README's build exited %d:\n%s" % (p.returncode, out))
        else:
            log("ok   the systemd section: built, installed into a DESTDIR, verified (%d checks)"
                % out.count("ok:"))
        log("not run here (they change the host; tests/vm/systemd-lane.sh boots them): %s"
            % "; ".join(c for c in cmds if c not in build + install + users))
    finally:
        shutil.rmtree(dest, ignore_errors=True)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--keep", action="store_true", help="keep the clone (its path is printed)")
    ap.add_argument("--skip-systemd", action="store_true", help="leave out the systemd section")
    args = ap.parse_args()
    if os.geteuid() != 0:
        log("FAIL: needs root (the README's start command installs, builds and creates namespaces)")
        return 1
    with open(os.path.join(REPO, "README.md")) as f:
        readme = f.read()
    found = blocks(readme)
    if not found or found[0][1] != "sh":
        log("FAIL: the README does not start with its commands in a sh block")
        return 1
    first = [l.split("#")[0].strip() for l in found[0][2] if l.strip()]
    starts = [c for c in first if c.endswith("scripts/start.sh")]
    if len(first) != 2 or len(starts) != 1:
        log("FAIL: the README's first block must hold two commands, one of them scripts/start.sh: %r" % first)
        return 1
    consoles = [(h, console_commands(lines)) for h, lang, lines in found if lang == "console"]
    if not consoles:
        log("FAIL: the README has no console block")
        return 1
    systemd = [lines for h, lang, lines in found if h.startswith("Installing as a systemd service") and lang == "sh"]
    if subprocess.run(["git", "-C", REPO, "status", "--porcelain"], capture_output=True).stdout.strip():
        log("note: this checkout has uncommitted changes; the clone (and this test) has only what is committed")
    top = tempfile.mkdtemp(prefix="tsb-readme-", dir="/tmp")
    clone = os.path.join(top, "toolsandboxd")
    try:
        subprocess.run(["git", "clone", "--quiet", "--no-hardlinks", REPO, clone], check=True)
        log("a fresh clone at %s" % clone)
        start_and_use(clone, starts[0], consoles, top)
        if args.skip_systemd:
            log("the systemd section: left out (--skip-systemd)")
        elif len(systemd) != 1:
            fail("the README has no single sh block under 'Installing as a systemd service'")
        elif not failures:
            systemd_section(clone, systemd[0])
    finally:
        if args.keep or failures:
            log("kept %s" % top)
        else:
            shutil.rmtree(top, ignore_errors=True)
    ran = sum(len(c) for _, c in consoles)
    print("%d passed, %d failed" % (ran + 2 - min(len(failures), ran + 2), len(failures)))
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
