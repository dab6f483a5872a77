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
interpreter starts), and refuses an archive that has them. pip's own
output goes to stderr; on failure the exit status is 2 (pip failed: its
last lines are on stderr) or 3 (anything else, the walk's refusals
below included: one line on stderr, "venv build failed: ..."), and stdout
holds no archive end.

The walk trusts nothing in the tree: `pip freeze` starts the new venv's
interpreter, a package's .pth file runs there, and a process it leaves
behind can change /venv while it is archived, with names that are any
bytes. So the walk resolves no path below the root: each directory is
opened from its parent's descriptor (O_DIRECTORY|O_NOFOLLOW), listed from
its own, and each entry examined where it is listed (fstatat, no follow).
A link is recorded with its target (readlinkat), never followed. A file
is opened beside its listing (O_NOFOLLOW|O_NONBLOCK: a FIFO put in its
place cannot make the open wait), and archived only when the descriptor
is the inode listed, still a regular file, of the same size and times
once its bytes were read; a directory is descended only when its
descriptor is the directory listed. Every entry must still be at its
name once it was archived. When the tree moved (an entry replaced, gone,
of another type or inode between the steps), or holds a FIFO, a socket
or a device (an archive has no record for them), or is deeper than an
archive path may be (64 components), the archive is refused: status 3,
its end record never written. Names are data: an archive holds them as
they are, and a message shows them escaped (ascii(): no newline, ESC or
other control character reaches stderr). The walk holds a descriptor per
level it is in (at most 65, the root's included); the records come in
os.walk's order, top down, sorted: a directory's entries, then each of
its subdirectories' in turn.

`--archive DIR` writes DIR as an archive with an empty manifest (tests).

The same builder makes a TypeScript tool's node_modules, for a request of
kind "npm":

    {"kind": "npm",
     "requirements": ["left-pad@^1.3.0", "@scope/x"],
     "tarballs": "/tarballs" | null,       # a local directory of .tgz files
     "registry": "https://..." | null,     # else this registry (through the proxy)
     "install_scripts": false,             # true: npm runs packages' scripts
     "build": "/build"}

It runs the host's npm with Node (`node NPM-CLI install --no-audit
--no-fund --omit=dev --no-package-lock --ignore-scripts ... -- REQS`,
argv, never a shell) in `build` (an empty, writable directory of the
sandbox's own), with no configuration file, its cache in /tmp; for a
tarball directory it first serves a minimal npm registry on the sandbox's
own loopback (packuments made from each tarball's package.json, the
tarballs themselves), so packages that depend on one another resolve with
no network. build/node_modules comes out as the same archive, its
manifest naming every package of the tree (name@version) and Node's
version. npm's output goes to stderr; the exit statuses are a venv
build's.
"""

import json
import os
import stat
import struct
import subprocess
import sys

MAGIC = b"TSBVENV1"
DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
FILE_FLAGS = os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NONBLOCK  # a FIFO opens at once
MAX_DEPTH = 64  # components of an archive path (archive.h)
CHUNK = 1 << 20


class Refused(Exception):
    """The venv cannot be archived as it is: the build fails (status 3).
    The message names paths with ascii(): no control character in it."""


class Moved(Refused):
    """The tree changed while it was walked (a process the build started,
    by a package's .pth file during `pip freeze`, still at work): no
    archive of a mix of states. `what`: which change, the path in ascii()."""

    def __init__(self, what):
        super().__init__("the venv changed while it was archived (a process of the build still at work?): %s; "
                         "the archive is refused" % what)


def printable(text):
    """`text` with every character outside printable ASCII escaped as
    ascii() does (newline, ESC, C1 and bidirectional controls, non-ASCII):
    one line, nothing a terminal or a log reader would act on."""
    return "".join(c if " " <= c <= "~" else ascii(c)[1:-1] for c in text)


def kind_of(mode):
    return {stat.S_IFDIR: "a directory", stat.S_IFREG: "a regular file", stat.S_IFLNK: "a symbolic link",
            stat.S_IFIFO: "a FIFO", stat.S_IFSOCK: "a socket", stat.S_IFCHR: "a character device",
            stat.S_IFBLK: "a block device"}.get(stat.S_IFMT(mode), "of an unknown type")


def same(a, b):
    """Whether two stat results are of one inode, of one type."""
    return (a.st_dev, a.st_ino, stat.S_IFMT(a.st_mode)) == (b.st_dev, b.st_ino, stat.S_IFMT(b.st_mode))


def moved(path, listed, now, when="when opened"):
    """`path` was `listed` and is `now` (an os.stat_result, or None: gone)."""
    if now is None:
        then = "gone"
    elif stat.S_IFMT(now.st_mode) != stat.S_IFMT(listed.st_mode):
        then = kind_of(now.st_mode)
    else:
        then = "another inode"
    return Moved("%s was %s when listed and %s %s" % (ascii(path), kind_of(listed.st_mode), then, when))


def now_at(dir_fd, name):
    """What `name` in the directory open at `dir_fd` is now (None: gone)."""
    try:
        return os.stat(name, dir_fd=dir_fd, follow_symlinks=False)
    except FileNotFoundError:
        return None


def still_there(dir_fd, name, path, listed):
    """After an entry was archived: Moved unless `name` is still the inode
    that was listed (it was not replaced or moved while it was read)."""
    now = now_at(dir_fd, name)
    if now is None or not same(now, listed):
        raise moved(path, listed, now, "once it was archived")


def header(out, kind, path, mode, size):
    p = path.encode("utf-8", "surrogateescape")
    out.write(kind + struct.pack(">H", len(p)) + p + struct.pack(">HQ", mode, size))


def record(out, kind, path, mode, payload):
    header(out, kind, path, mode, len(payload))
    out.write(payload)


def open_listed(dir_fd, name, path, listed, flags):
    """`name` in the directory open at `dir_fd`, opened with `flags` (which
    hold O_NOFOLLOW: a link is never followed), and its fstat; Moved unless
    it is the inode that was listed, of the type listed."""
    try:
        fd = os.open(name, flags, dir_fd=dir_fd)
    except OSError as e:
        now = now_at(dir_fd, name)
        if now is None or not same(now, listed):
            raise moved(path, listed, now) from None
        raise Refused("cannot open %s: %s" % (ascii(path), e.strerror)) from None
    try:
        st = os.fstat(fd)
        if not same(st, listed):
            raise moved(path, listed, st)
        return fd, st
    except BaseException:
        os.close(fd)
        raise


def file_record(out, dir_fd, name, path, listed):
    """A regular file's record: its bytes read from the inode listed, opened
    beside it (never through a path, never a FIFO's open that waits)."""
    fd, st = open_listed(dir_fd, name, path, listed, FILE_FLAGS)
    try:
        size = st.st_size
        mode = 0o755 if st.st_mode & 0o111 else 0o644
        header(out, b"f", path, mode, size)
        left = size
        while left:
            chunk = os.read(fd, min(left, CHUNK))
            if not chunk:
                break
            out.write(chunk)
            left -= len(chunk)
        after = os.fstat(fd)
        if left or (after.st_size, after.st_mtime_ns, after.st_ctime_ns) != (size, st.st_mtime_ns, st.st_ctime_ns):
            raise Moved("%s changed while its bytes were read (%d bytes, then %d)" % (ascii(path), size, after.st_size))
    finally:
        os.close(fd)
    still_there(dir_fd, name, path, listed)


def link_record(out, dir_fd, name, path, listed):
    """A symbolic link's record: its target, read beside it; never followed."""
    try:
        target = os.readlink(name, dir_fd=dir_fd)
    except OSError:  # gone, or no longer a link
        raise moved(path, listed, now_at(dir_fd, name), "when read") from None
    still_there(dir_fd, name, path, listed)  # the target read is the listed link's
    record(out, b"l", path, 0, os.fsencode(target))


def reserved(path):
    """The paths the daemon writes itself (archive.h, reserved_path)."""
    if path in ("pyvenv.cfg", "lib64"):
        return True
    if not path.startswith("bin/") or "/" in path[4:]:
        return False
    name = path[4:]
    return (name in ("pyvenv.cfg", "python", "python3") or name.endswith("._pth")
            or (name.startswith("python3.") and name[8:].isdigit() and name[8:].isascii()))


def entries(dir_fd, prefix):
    """What the directory open at `dir_fd` (the archive path `prefix`: ""
    for the root, else ending in "/") holds, sorted by name: [(name, path,
    st)], the reserved paths left out (never examined), `st` from
    fstatat(dir_fd, name, AT_SYMLINK_NOFOLLOW): each entry examined where it
    was listed, never through a path."""
    found = []
    for name in sorted(os.listdir(dir_fd)):
        path = prefix + name
        if reserved(path):
            continue
        try:
            st = os.stat(name, dir_fd=dir_fd, follow_symlinks=False)
        except FileNotFoundError:
            raise Moved("%s was listed and gone when examined" % ascii(path)) from None
        found.append((name, path, st))
    return found


def write_tree(out, dir_fd, prefix):
    """The records of the directory open at `dir_fd` (archive path
    `prefix`), then of each of its directories, opened from `dir_fd` in
    turn: a directory's entries, then its subdirectories' (os.walk's order,
    top down, sorted)."""
    subdirs = []
    for name, path, st in entries(dir_fd, prefix):
        if path.count("/") >= MAX_DEPTH:
            raise Refused("%s is deeper than an archive path may be (%d components)" % (ascii(path), MAX_DEPTH))
        if stat.S_ISLNK(st.st_mode):
            link_record(out, dir_fd, name, path, st)
        elif stat.S_ISDIR(st.st_mode):
            record(out, b"d", path, 0o755, b"")
            subdirs.append((name, path, st))
        elif stat.S_ISREG(st.st_mode):
            file_record(out, dir_fd, name, path, st)
        else:
            raise Refused("%s is %s: neither a file, a directory nor a link" % (ascii(path), kind_of(st.st_mode)))
    for name, path, st in subdirs:
        fd, _ = open_listed(dir_fd, name, path, st, DIR_FLAGS)
        try:
            write_tree(out, fd, path + "/")
        finally:
            os.close(fd)
        still_there(dir_fd, name, path, st)


def write_archive(root, out, manifest):
    """`root` as a venv archive on `out`, with `manifest` (None: none).
    Raises Refused (and writes no end record) when the tree holds what an
    archive cannot or moves under the walk; OSError on a failed read."""
    root_fd = os.open(root, DIR_FLAGS)  # the one path resolved: the sandbox's own mount
    try:
        out.write(MAGIC)
        if manifest is not None:
            record(out, b"m", "", 0, json.dumps(manifest, sort_keys=True).encode())
        write_tree(out, root_fd, "")
    finally:
        os.close(root_fd)
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


NPM_CLIS = ("/usr/lib/node_modules/npm/bin/npm-cli.js",  # nodesource's nodejs
            "/usr/share/nodejs/npm/bin/npm-cli.js")   # Debian's npm package
MAX_PACKAGE_JSON = 1 << 20
KIND = ["venv"]  # what the build makes, for its failure line


def tarball_package_json(path):
    """The package.json of an npm tarball (package/package.json, or the
    one file named package.json one level down, as npm packs it), parsed;
    None when it has none or it is not an object with a name and version."""
    import tarfile
    try:
        with tarfile.open(path, "r:gz") as t:
            for m in t:
                parts = m.name.split("/")
                if len(parts) == 2 and parts[1] == "package.json" and m.isfile() and m.size <= MAX_PACKAGE_JSON:
                    doc = json.loads(t.extractfile(m).read().decode("utf-8"))
                    if isinstance(doc, dict) and isinstance(doc.get("name"), str) and isinstance(doc.get("version"), str):
                        return doc
                    return None
    except (OSError, ValueError, EOFError, tarfile.TarError):
        return None
    return None


def version_order(v):
    """A sort key for semver text: releases above prereleases, numbers as numbers."""
    core, _, pre = v.partition("-")
    nums = []
    for x in core.split("+")[0].split("."):
        nums.append(int(x) if x.isdigit() else -1)
    return (nums, not pre, pre)


def local_registry(directory):
    """A minimal npm registry of the tarballs in `directory`, served on
    127.0.0.1 (the sandbox's own loopback) from a thread; its URL."""
    import base64
    import hashlib
    import http.server
    import threading
    import urllib.parse
    files, packuments = {}, {}
    names = sorted(os.listdir(directory)) if os.path.isdir(directory) else []
    for i, f in enumerate(n for n in names if n.endswith(".tgz")):
        path = os.path.join(directory, f)
        doc = tarball_package_json(path)
        if doc is None:
            print("npm build: %s is not an npm tarball with a package.json; skipped" % ascii(f), file=sys.stderr)
            continue
        with open(path, "rb") as fh:
            data = fh.read()
        tag = "%d.tgz" % i
        files[tag] = data
        doc = dict(doc)
        doc["dist"] = {"tarball": "/-/" + tag,  # made absolute below
                       "shasum": hashlib.sha1(data).hexdigest(),
                       "integrity": "sha512-" + base64.b64encode(hashlib.sha512(data).digest()).decode()}
        pk = packuments.setdefault(doc["name"], {"name": doc["name"], "versions": {}})
        pk["versions"][doc["version"]] = doc

    class Handler(http.server.BaseHTTPRequestHandler):
        def log_message(self, *a):
            pass

        def do_GET(self):
            path = urllib.parse.unquote(self.path.split("?")[0])
            if path.startswith("/-/") and path[3:] in files:
                body, kind = files[path[3:]], "application/octet-stream"
            elif path[1:] in packuments:
                pk = packuments[path[1:]]
                base = "http://127.0.0.1:%d" % self.server.server_address[1]
                versions = {}
                for v, d in pk["versions"].items():
                    d = dict(d)
                    d["dist"] = dict(d["dist"], tarball=base + d["dist"]["tarball"])
                    versions[v] = d
                releases = [v for v in versions if "-" not in v] or list(versions)
                latest = max(releases, key=version_order)
                body = json.dumps({"name": pk["name"], "dist-tags": {"latest": latest}, "versions": versions}).encode()
                kind = "application/json"
            else:
                body, kind = b'{"error":"Not found"}', "application/json"
                self.send_response(404)
                self.send_header("Content-Type", kind)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)
                return
            self.send_response(200)
            self.send_header("Content-Type", kind)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return "http://127.0.0.1:%d/" % server.server_address[1]


def tree_packages(node_modules):
    """name@version of every package in the tree (nested ones too), read
    from each package.json without following a link; sorted."""
    found = set()

    def walk(nm, depth):
        if depth > 32:
            return
        try:
            entries = sorted(os.scandir(nm), key=lambda e: e.name)
        except OSError:
            return
        for e in entries:
            if e.name.startswith(".") or not e.is_dir(follow_symlinks=False):
                continue
            dirs = [e.path]
            if e.name.startswith("@"):
                try:
                    dirs = [x.path for x in sorted(os.scandir(e.path), key=lambda x: x.name)
                            if x.is_dir(follow_symlinks=False)]
                except OSError:
                    dirs = []
            for d in dirs:
                try:
                    fd = os.open(os.path.join(d, "package.json"), FILE_FLAGS)
                    with os.fdopen(fd, "rb") as fh:
                        doc = json.loads(fh.read(MAX_PACKAGE_JSON).decode("utf-8", "replace"))
                    if isinstance(doc, dict) and isinstance(doc.get("name"), str) and isinstance(doc.get("version"), str):
                        found.add("%s@%s" % (doc["name"][:214], doc["version"][:256]))
                except (OSError, ValueError):
                    pass
                walk(os.path.join(d, "node_modules"), depth + 1)

    walk(node_modules, 0)
    return sorted(found)


def build_npm(req):
    build_dir = req.get("build") or "/build"
    requirements = req["requirements"]
    if not isinstance(requirements, list) or not requirements or not all(
            isinstance(r, str) and r and not r.startswith("-") for r in requirements):
        raise ValueError("requirements must be a list of npm requirement strings")
    cli = next((c for c in NPM_CLIS if os.path.isfile(c)), None)
    if cli is None:
        raise RuntimeError("npm is not installed on this host (looked for %s)" % ", ".join(NPM_CLIS))
    if req.get("tarballs"):
        registry = local_registry(req["tarballs"])
    elif req.get("registry"):
        registry = req["registry"]
    else:
        raise ValueError("neither tarballs nor registry")
    env = {"PATH": "/usr/bin:/bin", "HOME": "/tmp", "LANG": "C.UTF-8", "NODE_OPTIONS": "",
           "npm_config_userconfig": "/tmp/npmrc-none", "npm_config_globalconfig": "/tmp/npmrc-global-none",
           "npm_config_update_notifier": "false", "npm_config_cache": "/tmp/npm-cache"}
    for name in ("HTTP_PROXY", "HTTPS_PROXY", "ALL_PROXY", "NO_PROXY", "http_proxy", "https_proxy", "all_proxy",
                 "no_proxy"):
        if name in os.environ:
            env[name] = os.environ[name]
    if req.get("registry") and "HTTPS_PROXY" in os.environ:
        env["npm_config_proxy"] = env["npm_config_https_proxy"] = os.environ["HTTPS_PROXY"]
    with open(os.path.join(build_dir, "package.json"), "x") as f:
        f.write('{"name": "toolsandbox-node-modules", "version": "0.0.0", "private": true}\n')
    args = ["/usr/bin/node", cli, "install", "--no-audit", "--no-fund", "--omit=dev", "--no-package-lock",
            "--no-update-notifier", "--no-progress", "--prefix", build_dir, "--registry", registry]
    if not req.get("install_scripts"):
        args.append("--ignore-scripts")
    installed = subprocess.run(args + ["--"] + requirements, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                               stderr=subprocess.STDOUT, env=env, cwd=build_dir)
    sys.stderr.buffer.write(installed.stdout)
    sys.stderr.flush()
    if installed.returncode != 0:
        return 2, None
    version = subprocess.run(["/usr/bin/node", "--version"], stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                             stderr=subprocess.DEVNULL, env=env)
    manifest = {
        "requirements": requirements,
        "packages": tree_packages(os.path.join(build_dir, "node_modules")),
        "node": version.stdout.decode("ascii", "replace").strip().lstrip("v")[:64],
    }
    return 0, manifest


def main(argv):
    try:
        if len(argv) == 3 and argv[1] == "--archive":
            write_archive(argv[2], sys.stdout.buffer, {})
            return 0
        req = json.loads(sys.stdin.buffer.read())
        npm = req.get("kind") == "npm"
        KIND[0] = "node_modules" if npm else "venv"
        status, manifest = build_npm(req) if npm else build(req)
        if status != 0:
            return status
        root = os.path.join(req.get("build") or "/build", "node_modules") if npm else req.get("venv") or "/venv"
        write_archive(root, sys.stdout.buffer, manifest)
        return 0
    except Exception as e:  # the daemon reports it with stderr's last lines
        why = str(e) if isinstance(e, Refused) else "%s: %s" % (type(e).__name__, e)
        print("%s build failed: %s" % (KIND[0], printable(why)), file=sys.stderr)
        return 3


if __name__ == "__main__":
    sys.exit(main(sys.argv))
