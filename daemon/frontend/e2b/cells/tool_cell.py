# The E2B backend's tool-mode cell (daemon/frontend/e2b/e2b.cc), sent to the
# sandbox's Jupyter kernel as it is, with @BLOB@ replaced by one base64
# literal: the runner's source and its package's (written into a directory
# of their own, the runner run as a script from there), its request (with
# the nonce), the tool's environment, the timeout and the heartbeat text.
# Nothing of the request ever becomes code: the base64 alphabet cannot end
# the string literal.
# Embedded into the daemon at build time (daemon/cmake/embed_text.cmake).
def _tsb_tool_cell(blob):
    import base64, json, os, shutil, subprocess, sys, tempfile, time
    spec = json.loads(base64.b64decode(blob).decode("utf-8"))
    env = {
        "PATH": "/usr/local/bin:/usr/bin:/bin",
        "HOME": os.path.expanduser("~"),
        "LANG": "C.UTF-8",
        "PYTHONWARNINGS": "ignore",
        "PYTHONDONTWRITEBYTECODE": "1",
        "NO_COLOR": "1",
        "TERM": "dumb",
    }
    env.update(spec["env"])
    top = tempfile.mkdtemp(prefix="tsb-runner-")
    path = os.path.join(top, "toolsandbox_runner.py")
    try:
        files = dict(spec.get("package") or {})
        files["toolsandbox_runner.py"] = spec["runner"]
        for name, text in files.items():
            target = os.path.join(top, name)
            os.makedirs(os.path.dirname(target), exist_ok=True)
            with open(target, "w", encoding="utf-8") as f:
                f.write(text)
        proc = subprocess.Popen(
            [sys.executable, "-I", "-S", "-B", "-u", "-X", "utf8", path],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
            env=env, cwd=os.path.dirname(top), start_new_session=True)
        data = spec["request"].encode("utf-8")
        deadline = time.monotonic() + spec["timeout"]
        while True:
            try:
                out, err = proc.communicate(data, timeout=spec["heartbeat"])
                break
            except subprocess.TimeoutExpired:
                data = None
                if time.monotonic() >= deadline:
                    try:
                        os.killpg(proc.pid, 9)
                    except OSError:
                        pass
                    try:
                        out, err = proc.communicate(timeout=2)
                    except subprocess.TimeoutExpired:
                        out, err = b"", b""
                    break
                sys.stderr.write(spec["beat"])
                sys.stderr.flush()
    finally:
        shutil.rmtree(top, ignore_errors=True)
    sys.stdout.write(out.decode("utf-8", "replace"))
    sys.stdout.flush()
    sys.stderr.write(err.decode("utf-8", "replace"))
    sys.stderr.flush()
    return proc.returncode
_tsb_tool_cell("@BLOB@")
