"""toolsandboxd's venv builder: runs inside a build sandbox.

Reads one JSON request on stdin:

    {"requirements": ["numpy==1.26.4", "requests[socks]<3,>=2"],
     "find_links": "/wheels" | null,       # a local wheel directory: no index
     "index_url": "https://..." | null,    # else this index (through the proxy)
     "trusted_host": "host" | null,        # an http:// index's host
     "source_builds": false,               # true: sdists may be built
     "venv": "/venv"}

makes a venv at `venv` (an empty, writable directory of the sandbox's own),
installs the requirements into it with the system's pip (argv, never a
shell; `--` before the requirements, which the daemon checked and put in
canonical form), and writes the venv to stdout as a venv archive
(daemon/venv/archive.h), with a manifest: the requirements, `pip freeze`,
the Python version. pyvenv.cfg, lib64 and bin/'s interpreter links and
._pth files are left out: the daemon writes those itself (they decide which
interpreter starts), and refuses an archive that has them. pip's own output goes to stderr; on failure the exit
status is 2 (pip failed: its last lines are on stderr) or 3 (anything
else), and stdout holds no archive end.

`--archive DIR` writes DIR as an archive with an empty manifest (tests).
"""

import json
import os
import stat
import struct
import subprocess
import sys

MAGIC = b"TSBVENV1"


def record(out, kind, path, mode, payload):
    p = path.encode("utf-8", "surrogateescape")
    out.write(kind + struct.pack(">H", len(p)) + p + struct.pack(">HQ", mode, len(payload)))
    out.write(payload)


def file_record(out, path, full, mode):
    size = os.path.getsize(full)
    p = path.encode("utf-8", "surrogateescape")
    out.write(b"f" + struct.pack(">H", len(p)) + p + struct.pack(">HQ", mode, size))
    with open(full, "rb") as f:
        left = size
        while left:
            chunk = f.read(min(left, 1 << 20))
            if not chunk:
                raise RuntimeError("%s shrank while it was archived" % path)
            out.write(chunk)
            left -= len(chunk)


def reserved(path):
    """The paths the daemon writes itself (archive.h, reserved_path)."""
    if path in ("pyvenv.cfg", "lib64"):
        return True
    if not path.startswith("bin/") or "/" in path[4:]:
        return False
    name = path[4:]
    return (name in ("pyvenv.cfg", "python", "python3") or name.endswith("._pth")
            or (name.startswith("python3.") and name[8:].isdigit() and name[8:].isascii()))


def write_archive(root, out, manifest):
    out.write(MAGIC)
    if manifest is not None:
        record(out, b"m", "", 0, json.dumps(manifest, sort_keys=True).encode())
    for dirpath, dirnames, filenames in os.walk(root, topdown=True, followlinks=False):
        rel = os.path.relpath(dirpath, root)
        dirnames.sort()
        for name in sorted(dirnames + filenames):
            full = os.path.join(dirpath, name)
            path = name if rel == "." else rel + "/" + name
            if reserved(path):
                if name in dirnames:
                    dirnames.remove(name)  # not descended into either
                continue
            st = os.lstat(full)
            if stat.S_ISLNK(st.st_mode):
                record(out, b"l", path, 0, os.fsencode(os.readlink(full)))
            elif stat.S_ISDIR(st.st_mode):
                record(out, b"d", path, 0o755, b"")
            elif stat.S_ISREG(st.st_mode):
                file_record(out, path, full, 0o755 if st.st_mode & 0o111 else 0o644)
            else:
                raise RuntimeError("%s is neither a file, a directory nor a link" % path)
    record(out, b"e", "", 0, b"")
    out.flush()


def pip(args, venv, env):
    cmd = [sys.executable, "-m", "pip", "--python", os.path.join(venv, "bin", "python3")] + args
    return subprocess.run(cmd, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, env=env)


def build(req):
    venv = req.get("venv") or "/venv"
    requirements = req["requirements"]
    if not isinstance(requirements, list) or not all(isinstance(r, str) and r and not r.startswith("-")
                                                      for r in requirements):
        raise ValueError("requirements must be a list of requirement strings")
    args = ["install", "--no-input", "--disable-pip-version-check", "--no-cache-dir", "--no-warn-script-location"]
    if not req.get("source_builds"):
        args.append("--only-binary=:all:")
    if req.get("find_links"):
        args += ["--no-index", "--find-links", req["find_links"]]
    elif req.get("index_url"):
        args += ["--index-url", req["index_url"]]
        if req.get("trusted_host"):  # a plain-http index the policy names
            args += ["--trusted-host", req["trusted_host"]]
    else:
        raise ValueError("neither find_links nor index_url")
    env = {"PATH": "/usr/bin:/bin", "HOME": "/tmp", "PIP_NO_CACHE_DIR": "1", "PIP_DISABLE_PIP_VERSION_CHECK": "1",
           "PIP_CONFIG_FILE": os.devnull,  # no configuration file at all
           "PIP_NO_INPUT": "1", "PYTHONNOUSERSITE": "1", "LANG": "C.UTF-8"}
    for name in ("HTTP_PROXY", "HTTPS_PROXY", "ALL_PROXY", "NO_PROXY", "http_proxy", "https_proxy", "all_proxy",
                 "no_proxy"):
        if name in os.environ:
            env[name] = os.environ[name]
    made = subprocess.run([sys.executable, "-m", "venv", "--without-pip", venv], stdin=subprocess.DEVNULL,
                          stdout=sys.stderr, stderr=sys.stderr, env=env)
    if made.returncode != 0:
        raise RuntimeError("python3 -m venv failed with status %d" % made.returncode)
    installed = pip(args + ["--"] + requirements, venv, env)
    sys.stderr.buffer.write(installed.stdout)
    sys.stderr.flush()
    if installed.returncode != 0:
        return 2, None
    frozen = pip(["freeze", "--all"], venv, env)
    if frozen.returncode != 0:
        sys.stderr.buffer.write(frozen.stdout)
        return 2, None
    manifest = {
        "requirements": requirements,
        "freeze": frozen.stdout.decode("utf-8", "replace").splitlines(),
        "python": "%d.%d.%d" % sys.version_info[:3],
    }
    return 0, manifest


def main(argv):
    if len(argv) == 3 and argv[1] == "--archive":
        write_archive(argv[2], sys.stdout.buffer, {})
        return 0
    try:
        req = json.loads(sys.stdin.buffer.read())
        status, manifest = build(req)
    except Exception as e:  # the daemon reports it with stderr's last lines
        print("venv build failed: %s: %s" % (type(e).__name__, e), file=sys.stderr)
        return 3
    if status != 0:
        return status
    write_archive(req.get("venv") or "/venv", sys.stdout.buffer, manifest)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
