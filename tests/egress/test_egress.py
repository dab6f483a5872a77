"""Egress reachability: what a tool of network "egress" reaches through the
daemon's proxy, and everything it must not reach (docs/SECURITY.md, "Egress").

Runs only inside the outer guard with a network namespace of its own:

    tests/guard/run-guarded --net --ro <checkout> --ro <build> -- \\
        /usr/bin/python3 -m pytest -q -p no:cacheprovider tests/egress

(scripts/lib.sh: run_egress_tier). The guard's namespace has only lo; this
module adds two namespaces of its own, joined by one veth pair and routed
nowhere else:

    daemon  198.51.100.1/24 10.20.0.1/24 100.64.0.1/24 169.254.0.1/16
            2001:db8::1/64 fd00:20::1/64; toolsandboxd runs here, with this
            module's /etc/hosts (a static map: no resolver), and a
            "host-loopback service" listens on port 18080 of every address
            here (127.0.0.1, ::1, 198.51.100.1, ...)
    world   198.51.100.10 .11 (public), 2001:db8::10 (public), 10.20.0.10
            (private), 100.64.0.10 (CGNAT), 169.254.169.254 (metadata),
            fd00:20::10 (ULA); HTTP on 80, 22 and 8080, HTTPS on 443
            (tests/egress/world.py)

Every address in these tests is one of these; nothing else is ever a
target. The tools run with urllib, requests, curl and pip, unchanged: the
proxy variables are all they get. The world's HTTP servers are also a
package index (/simple/), from which the daemon builds per-tool venvs in a
build sandbox whose one way out is the proxy (VenvIndexTest).
"""

import json
import os
import pwd
import re
import shutil
import subprocess
import sys
import tempfile
import time
import unittest
import uuid

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.normpath(os.path.join(HERE, "..", ".."))
sys.path.insert(0, os.path.join(REPO, "tests", "python"))

import daemon_fixture as F  # noqa: E402
from wheels import make_wheel  # noqa: E402

ORG = "org-egress-tests"
NS_DAEMON = "tsbe-daemon-%d" % os.getpid()
NS_WORLD = "tsbe-world-%d" % os.getpid()
LOOPBACK_PORT = 18080
# The package index of the venv builds: a world host name and a port no
# other test's policy allows.
INDEX_HOST, INDEX_ADDRESS, INDEX_PORT = "pypi.test", "198.51.100.11", 8080
# A file the index lists for project "tsboffsite", on another world server:
# a build must never fetch it.
OFFSITE_URL = "http://api.public.test:8080/files/tsboffsite-1.0-py3-none-any.whl"

HOSTS = """\
127.0.0.1 localhost loop.test
::1 localhost
198.51.100.10 api.public.test
2001:db8::10 api.public.test
198.51.100.11 other.public.test pypi.test
198.51.100.10 www.wild.test
10.20.0.10 private.test
169.254.169.254 metadata.test
100.64.0.10 cgnat.test
fd00:20::10 ula.test
198.51.100.1 self.test
10.20.0.10 rebind.test
198.51.100.10 rebind.test
169.254.169.254 allprivate.test
10.20.0.10 allprivate.test
"""

# The tool: one sandbox run tries a list of things and reports each.
TOOL = r'''
def net(kind: str, targets: list, ca: str = "") -> list:
    import os, socket, ssl, subprocess, sys, time, urllib.error, urllib.request
    cafile = None
    if ca:
        cafile = "/tmp/ca.pem"
        with open(cafile, "w") as f:
            f.write(ca)
    results = []
    for t in targets:
        out = {"target": t}
        try:
            if kind == "urllib":
                ctx = ssl.create_default_context(cafile=cafile) if t.startswith("https") else None
                try:
                    with urllib.request.urlopen(t, timeout=20, context=ctx) as r:
                        out["status"] = r.status
                        out["body"] = r.read().decode(errors="replace")
                except urllib.error.HTTPError as e:
                    out["status"] = e.code
                    out["reason"] = e.reason
                    out["body"] = e.read().decode(errors="replace")
            elif kind == "requests":
                import requests
                r = requests.get(t, timeout=20, verify=cafile or True)
                out.update(status=r.status_code, reason=r.reason, body=r.text)
            elif kind == "proxy":
                # The proxy itself, by hand: every request names its target,
                # whatever NO_PROXY says for the sandbox's own localhost.
                s = socket.create_connection(("127.0.0.1", 3128), timeout=20)
                line = t if t.startswith("CONNECT ") else "GET " + t
                s.sendall((line + " HTTP/1.1\r\nHost: ignored.test\r\n\r\n").encode())
                data = b""
                while b"\r\n\r\n" not in data:
                    chunk = s.recv(65536)
                    if not chunk:
                        break
                    data += chunk
                s.close()
                head, _, body = data.partition(b"\r\n\r\n")
                first = head.split(b"\r\n", 1)[0].decode(errors="replace")
                out.update(status=int(first.split(" ")[1]) if first.startswith("HTTP/") else 0, head=first,
                           body=body.decode(errors="replace"))
            elif kind in ("bytes", "late"):
                # Bytes of the test's making to the proxy, then all it answers
                # until it closes. "late": the same again on the same
                # connection while the answer to the first is still coming.
                s = socket.create_connection(("127.0.0.1", 3128), timeout=20)
                s.sendall(t.encode("latin-1"))
                if kind == "late":
                    time.sleep(0.3)
                    s.sendall(t.encode("latin-1"))
                data = b""
                while True:
                    chunk = s.recv(65536)
                    if not chunk:
                        break
                    data += chunk
                s.close()
                out["answer"] = data.decode(errors="replace")
            elif kind == "upload+get":
                # An upload, then a GET in the same run: what the second
                # one is answered.
                up, get = t.split(" ")
                try:
                    with urllib.request.urlopen(urllib.request.Request(up, data=b"u" * (8 << 20), method="POST"),
                                                timeout=20):
                        pass
                except Exception:  # refused: its answer, or a reset once the cap stopped the drain
                    pass
                try:
                    with urllib.request.urlopen(get, timeout=20) as r:
                        out["status"] = r.status
                except urllib.error.HTTPError as e:
                    out.update(status=e.code, body=e.read().decode(errors="replace"))
            elif kind == "upload":
                req = urllib.request.Request(t, data=b"u" * (8 << 20), method="POST")
                try:
                    with urllib.request.urlopen(req, timeout=20) as r:
                        out["status"] = r.status
                except urllib.error.HTTPError as e:
                    out.update(status=e.code, body=e.read().decode(errors="replace"))
            elif kind == "curl":
                args = ["curl", "-sS", "-g", "--max-time", "20", "-w", "\n%{http_code}"]
                if cafile:
                    args += ["--cacert", cafile]
                p = subprocess.run(args + [t], capture_output=True, text=True)
                body, _, code = p.stdout.rpartition("\n")
                out.update(status=int(code or 0), body=body, rc=p.returncode, stderr=p.stderr[-500:])
            elif kind == "pip":
                index, project = t.split(" ")
                p = subprocess.run([sys.executable, "-m", "pip", "download", "--no-deps", "--no-cache-dir",
                                    "--disable-pip-version-check", "-d", "/tmp/dl", "--index-url", index,
                                    "--trusted-host", index.split("/")[2], project],
                                   capture_output=True, text=True, timeout=90)
                files = sorted(os.listdir("/tmp/dl")) if os.path.isdir("/tmp/dl") else []
                out.update(rc=p.returncode, files=files, stderr=p.stderr[-2000:])
                if files:
                    sys.path.insert(0, "/tmp/dl/" + files[0])
                    import tsbdemo
                    out["value"] = tsbdemo.VALUE
            elif kind == "tcp":
                host, port = t.rsplit(":", 1)
                s = socket.create_connection((host.strip("[]"), int(port)), timeout=5)
                out["connected"] = True
                s.close()
            elif kind == "udp":
                host, port = t.rsplit(":", 1)
                fam = socket.AF_INET6 if ":" in host else socket.AF_INET
                s = socket.socket(fam, socket.SOCK_DGRAM)
                s.sendto(b"x", (host.strip("[]"), int(port)))
                out["sent"] = True
            elif kind == "raw":
                socket.socket(socket.AF_INET, socket.SOCK_RAW, socket.IPPROTO_ICMP)
                out["opened"] = True
            elif kind == "resolve":
                out["addresses"] = sorted({a[4][0] for a in socket.getaddrinfo(t, 80)})
            elif kind == "env":
                out["env"] = {k: v for k, v in os.environ.items() if "proxy" in k.lower()}
        except Exception as e:
            out["error"] = "%s: %s" % (type(e).__name__, e)
            out["errno"] = getattr(e, "errno", None)
        if isinstance(out.get("body"), str):
            out["body"] = out["body"][:4000]
        results.append(out)
    return results
'''


def sh(*cmd, check=True):
    return subprocess.run(list(cmd), check=check, capture_output=True, text=True)


def in_ns(ns, *cmd):
    """A command in namespace `ns` (network only: the mounts stay the test's)."""
    return ["nsenter", "--net=/run/netns/" + ns, *cmd]


def unready_reason():
    """Why this host cannot run these tests here, or None."""
    if os.geteuid() != 0:
        return "the egress tests need root (network namespaces, a real daemon)"
    if os.environ.get("TSB_GUARD") != "1":
        return "not inside the outer guard: run tests/guard/run-guarded --net ... (scripts/lib.sh run_egress_tier)"
    links = sh("ip", "-o", "link", "show").stdout.splitlines()
    names = {l.split(":")[1].strip().split("@")[0] for l in links if l.strip()}
    if names != {"lo"}:
        return "the guard's network namespace has %s: run-guarded --net gives one with only lo" % sorted(names)
    for tool in ("ip", "nsenter", "unshare", "openssl", "curl"):
        if shutil.which(tool) is None:
            return "%s is missing (scripts/lib.sh installs it)" % tool
    return None


class Topology:
    """The two namespaces, their servers and the daemon's resolver files."""

    def __init__(self, tmp):
        self.tmp = tmp
        self.procs = []
        self.world_log = os.path.join(tmp, "world.log")
        self.loopback_log = os.path.join(tmp, "loopback.log")

    def up(self):
        sh("ip", "netns", "add", NS_DAEMON)
        sh("ip", "netns", "add", NS_WORLD)
        sh("ip", "link", "add", "tsbe-d", "netns", NS_DAEMON, "type", "veth", "peer", "name", "tsbe-w", "netns", NS_WORLD)
        for ns, dev, addrs in (
            (NS_DAEMON, "tsbe-d", ["198.51.100.1/24", "10.20.0.1/24", "100.64.0.1/24", "169.254.0.1/16",
                                   "2001:db8::1/64", "fd00:20::1/64"]),
            (NS_WORLD, "tsbe-w", ["198.51.100.10/24", "198.51.100.11/24", "10.20.0.10/24", "100.64.0.10/24",
                                  "169.254.169.254/16", "2001:db8::10/64", "fd00:20::10/64"]),
        ):
            sh("ip", "-n", ns, "link", "set", "lo", "up")
            for a in addrs:
                sh("ip", "-n", ns, "addr", "add", a, "dev", dev, *(["nodad"] if ":" in a else []))
            sh("ip", "-n", ns, "link", "set", dev, "up")
        # An address the daemon's namespace takes as its own through a
        # `local` route only (no interface has it): the proxy must still
        # see it as the host's.
        sh("ip", "-n", NS_DAEMON, "route", "add", "local", "198.51.100.200/32", "dev", "lo", "table", "local")
        # The same for IPv6 (a whole range), which a bind() test missed.
        sh("ip", "-n", NS_DAEMON, "-6", "route", "add", "local", "2001:db8:77::/64", "dev", "lo", "table", "local")
        # A host where a socket may bind to any IPv4 address: the proxy must
        # still tell its own addresses from the others (it asks the routing
        # table), or every test here that reaches the world fails.
        sh("ip", "netns", "exec", NS_DAEMON, "sh", "-c", "echo 1 > /proc/sys/net/ipv4/ip_nonlocal_bind")
        nonlocal_bind = sh("ip", "netns", "exec", NS_DAEMON, "cat", "/proc/sys/net/ipv4/ip_nonlocal_bind").stdout.strip()
        assert nonlocal_bind == "1", "ip_nonlocal_bind in %s: %r" % (NS_DAEMON, nonlocal_bind)
        # No default route anywhere: only the subnets above exist.
        for ns in (NS_DAEMON, NS_WORLD):
            routes = sh("ip", "-n", ns, "route", "show", "default").stdout.strip()
            assert routes == "", "a default route in %s: %s" % (ns, routes)

        self.cert = os.path.join(self.tmp, "cert.pem")
        key = os.path.join(self.tmp, "key.pem")
        sh("openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-keyout", key, "-out", self.cert, "-days", "2",
           "-subj", "/CN=api.public.test",
           "-addext", "subjectAltName=DNS:api.public.test,DNS:www.wild.test,DNS:rebind.test")
        with open(self.cert) as f:
            self.ca = f.read()
        wheel = make_wheel(self.tmp)
        noisy = make_wheel(self.tmp, "tsbnoisy", modules={"tsbnoisy_hook.py": NOISY_HOOK,
                                                          "tsbnoisy.pth": "import tsbnoisy_hook\n"})
        world = os.path.join(HERE, "world.py")
        self.start(in_ns(NS_WORLD, sys.executable, world, "--http", "80,22,8080", "--https", "443", "--cert", self.cert,
                         "--key", key, "--log", self.world_log, "--name", "world", "--wheel", wheel,
                         "--wheel", noisy, "--offsite", OFFSITE_URL))
        self.start(in_ns(NS_DAEMON, sys.executable, world, "--http", str(LOOPBACK_PORT), "--log", self.loopback_log,
                         "--name", "daemon-host"))

        # The daemon's resolver: this map and nothing else.
        self.etc = {}
        # ... then a name server of the test's own on the daemon's
        # 127.0.0.1, with a search domain the daemon must never append.
        self.dns_log = os.path.join(self.tmp, "dns.log")
        self.start(in_ns(NS_DAEMON, sys.executable, os.path.join(HERE, "dns.py"), "--log", self.dns_log))
        for name, text in (("hosts", HOSTS), ("nsswitch.conf", "hosts: files dns\npasswd: files\ngroup: files\n"),
                           ("host.conf", "multi on\n"),
                           ("resolv.conf", "nameserver 127.0.0.1\nsearch corp.test\noptions ndots:5 attempts:1 timeout:1\n")):
            path = os.path.join(self.tmp, "etc-" + name)
            with open(path, "w") as f:
                f.write(text)
            os.chmod(path, 0o644)
            self.etc["/etc/" + name] = path

    def start(self, cmd):
        p = subprocess.Popen(cmd, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        self.procs.append(p)
        line = p.stdout.readline()
        if line.strip() != "ready":
            raise RuntimeError("%s did not start: %s%s" % (cmd, line, p.stdout.read()))

    def daemon_wrap(self):
        """The daemon's command prefix: its own mount namespace with the map
        above over /etc, then the daemon namespace's network."""
        binds = " && ".join('mount --bind "%s" "%s"' % (src, dst) for dst, src in self.etc.items()
                            if os.path.lexists(dst))
        return ["unshare", "--mount", "--propagation", "private", "--", "sh", "-c",
                binds + ' && exec nsenter --net=/run/netns/%s "$@"' % NS_DAEMON, "sh"]

    def down(self):
        for p in self.procs:
            try:
                p.stdin.close()
            except OSError:
                pass
            p.kill()
            p.wait()
        for ns in (NS_DAEMON, NS_WORLD):
            sh("ip", "netns", "del", ns, check=False)


def read_text(path):
    """A server's request log (none yet: no request reached it)."""
    try:
        with open(path) as f:
            return f.read()
    except FileNotFoundError:
        return ""


def world_requests():
    return [json.loads(l) for l in read_text(T.world_log).splitlines() if l.strip()]


T = None  # the topology, once up


def setUpModule():
    global T
    reason = unready_reason()
    if reason:
        if F.must_run():
            raise AssertionError(reason + "; CI=true or TOOLSANDBOXD_TESTS_MUST_RUN=root forbids skipping")
        raise unittest.SkipTest(reason)
    tmp = tempfile.mkdtemp(prefix="tsb-egress-")
    os.chmod(tmp, 0o755)
    T = Topology(tmp)
    try:
        T.up()
    except Exception:
        T.down()
        raise


def tearDownModule():
    if T is not None:
        T.down()
        if os.environ.get("TSB_TEST_KEEP") != "1":
            shutil.rmtree(T.tmp, ignore_errors=True)


def write_policies(directory, extra=None):
    """The policies every test class uses, and `extra` ({name: keys over the
    base}) besides."""
    os.makedirs(directory)
    shutil.copy(os.path.join(REPO, "policies", "default.json"), directory)
    shutil.copytree(os.path.join(REPO, "policies", "seccomp"), os.path.join(directory, "seccomp"))
    # No venv, so no packages (default.json's need one): "packages": null
    # drops them. VenvIndexTest's policies name packages of their own.
    base = {"version": 1, "include": "default.json", "filesystem": {"venv": None}, "packages": None,
            "interpreter": "/usr/bin/python3", "limits": {"wall_timeout": "60s", "cpu_time": "60s", "pids": 128}}
    policies = {
        "egress": {"network": "egress",
                   "egress": {"allow": [{"hosts": ["api.public.test", "pypi.test", "*.wild.test", "rebind.test"],
                                         "ports": [80, 443]}]}},
        "public": {"network": "egress", "egress": {"public": {"ports": [80, 443, LOOPBACK_PORT]}, "max_connections": 1024}},
        "caps": {"network": "egress",
                 "egress": {"public": {"ports": [80]}, "max_connections": 3, "max_bytes": "64KiB"}},
        "none": {"network": "none"},
        **(extra or {}),
    }
    for name, over in policies.items():
        with open(os.path.join(directory, name + ".json"), "w") as f:
            json.dump({**base, **over}, f, indent=2)
    with open(os.path.join(directory, "organizations.json"), "w") as f:
        json.dump({"version": 1, "default": {"privileged": True, "policy": "egress",
                                             "allowed_policies": sorted(policies)}, "organizations": {}}, f)
    for root, dirs, files in os.walk(directory):
        for d in dirs:
            os.chmod(os.path.join(root, d), 0o755)
        for fn in files:
            os.chmod(os.path.join(root, fn), 0o644)


class EgressTest(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        policies = os.path.join(T.tmp, "policies")
        write_policies(policies)
        cls.daemon = F.Daemon(wrap=T.daemon_wrap(), policies_dir=policies,
                              organizations=os.path.join(policies, "organizations.json"))
        cls.addClassCleanup(cls.daemon.stop)
        cls.daemon.start()

    def run_net(self, policy, kind, targets, ca=""):
        r = self.daemon.client(timeout=120).run_tool(TOOL, tool_name="net", args={"kind": kind, "targets": targets, "ca": ca},
                                                     organization_id=ORG, policy=policy)
        self.assertEqual(r.status, "success", "the tool failed: %s %s %s" % (r.func_return, r.stderr, r.record))
        return r.func_return, r.record

    def marked(self, url):
        """`url` with a marker no other request carries, to look for in the servers' logs."""
        self.marker = uuid.uuid4().hex
        return url + ("&" if "?" in url else "?") + "m=" + self.marker

    # --- what is allowed -----------------------------------------------------

    def test_allowed_name_and_port_with_urllib_requests_and_curl(self):
        for kind in ("urllib", "requests", "curl"):
            url = self.marked("http://api.public.test/whoami")
            results, record = self.run_net("egress", kind, [url, "https://api.public.test/whoami"], ca=T.ca)
            for res in results:
                self.assertEqual(res.get("status"), 200, "%s: %s" % (kind, res))
                body = json.loads(res["body"])
                self.assertEqual(body["server"], "world")
                self.assertIn(body["local"], ("198.51.100.10", "2001:db8::10"), res)
            self.assertTrue(any(self.marker in e["path"] for e in world_requests()))
            self.assertTrue(record["egress"]["listener"], record)
            self.assertEqual(record["egress"]["allowed"], 2, record)
            self.assertGreater(record["egress"]["bytes_received"], 0, record)

    def test_pip_downloads_from_an_allowed_index(self):
        results, _ = self.run_net("egress", "pip", ["http://pypi.test/simple/ tsbdemo"])
        self.assertEqual(results[0].get("rc"), 0, results[0])
        self.assertEqual(results[0].get("value"), "tsbdemo-from-the-test-index", results[0])

    def test_the_tool_sees_the_proxy_variables_and_nothing_resolves_inside(self):
        results, _ = self.run_net("egress", "env", ["-"])
        env = results[0]["env"]
        for k in ("HTTP_PROXY", "HTTPS_PROXY", "ALL_PROXY", "http_proxy", "https_proxy", "all_proxy"):
            self.assertEqual(env.get(k), "http://127.0.0.1:3128", env)
        self.assertEqual(env.get("NO_PROXY"), "localhost,127.0.0.1,::1")
        resolved, _ = self.run_net("egress", "resolve", ["api.public.test"])
        self.assertIn("error", resolved[0], "names are the daemon's to resolve: %s" % resolved[0])

    def test_a_name_with_public_and_private_addresses_reaches_only_the_public_one(self):
        for _ in range(3):
            results, record = self.run_net("public", "requests", ["http://rebind.test/whoami"])
            self.assertEqual(results[0].get("status"), 200, results[0])
            self.assertEqual(json.loads(results[0]["body"])["local"], "198.51.100.10")
        self.assertRegex(self.daemon.log(), r'egress run_id=%s .*host="rebind.test" port=80 address=198\.51\.100\.10 '
                                            r'verdict=allowed' % re.escape(record["run_id"]))

    def test_public_ipv6_address(self):
        results, _ = self.run_net("public", "urllib", ["http://[2001:db8::10]/whoami"])
        self.assertEqual(results[0].get("status"), 200, results[0])
        self.assertEqual(json.loads(results[0]["body"])["local"], "2001:db8::10")

    # --- what is refused -----------------------------------------------------

    def test_names_and_ports_outside_the_rules_are_refused(self):
        urls = [self.marked("http://other.public.test/whoami"), "http://api.public.test:8080/whoami",
                "http://api.public.test:22/whoami", "http://198.51.100.10/whoami", "https://other.public.test/"]
        marker = self.marker
        results, record = self.run_net("egress", "requests", urls, ca=T.ca)
        for res in results[:4]:
            self.assertEqual(res.get("status"), 403, res)
            self.assertIn("not allowed by the policy" if "198.51" not in res["target"] else "\"public\"", res["body"])
        self.assertIn("403", results[4].get("error", ""), results[4])
        self.assertFalse(any(marker in e["path"] for e in world_requests()))
        self.assertEqual(record["egress"]["allowed"], 0, record)
        self.assertEqual(record["egress"]["refused"], 5, record)

    def test_every_denied_range_by_address_spelling_and_name(self):
        lp = LOOPBACK_PORT
        urls = {
            "loopback": ["http://127.0.0.1:%d/" % lp, "http://[::1]:%d/" % lp, "http://2130706433:%d/" % lp,
                         "http://0x7f.1:%d/" % lp, "http://0177.0.0.1:%d/" % lp, "http://127.1:%d/" % lp,
                         "http://[::ffff:127.0.0.1]:%d/" % lp, "http://loop.test:%d/" % lp,
                         "http://localhost:%d/" % lp],
            "private": ["http://10.20.0.10/", "http://169082890/", "http://0x0a14000a/", "http://[::ffff:10.20.0.10]/",
                        "http://[::ffff:a14:a]/", "http://private.test/", "http://allprivate.test/"],
            "metadata": ["http://169.254.169.254/latest/meta-data", "http://0xa9fea9fe/latest/meta-data",
                         "http://2852039166/latest/meta-data", "http://[::ffff:169.254.169.254]/latest/meta-data",
                         "http://metadata.test/latest/meta-data", "http://[64:ff9b::a9fe:a9fe]/latest/meta-data"],
            "cgnat": ["http://100.64.0.10/", "http://cgnat.test/"],
            "ula": ["http://[fd00:20::10]/", "http://ula.test/"],
            "own": ["http://198.51.100.1:%d/" % lp, "http://self.test:%d/" % lp, "http://[2001:db8::1]:%d/" % lp],
            "unspecified": ["http://0.0.0.0:%d/" % lp, "http://0:%d/" % lp, "http://[::]:%d/" % lp],
            "multicast": ["http://224.0.0.1/", "http://[ff02::1]/"],
        }
        marker = uuid.uuid4().hex
        flat = [u + ("&" if "?" in u else "?") + "m=" + marker for group in urls.values() for u in group]
        # The proxy, asked directly for each, in both forms.
        connects = ["CONNECT " + re.match(r"http://([^/]+?)(?::\d+)?/", u).group(1) + ":443" for u in flat]
        results, record = self.run_net("public", "proxy", flat + connects)
        for res in results:
            self.assertEqual(res.get("status"), 403, res)
            self.assertIn("toolsandboxd egress", res.get("body", ""), res)
        self.assertEqual(record["egress"]["allowed"], 0, record)
        self.assertEqual(record["egress"]["refused"], len(flat) + len(connects), record)
        # As tools send them. A loopback target NO_PROXY covers (curl
        # normalises 2130706433 to 127.0.0.1 first) goes to the sandbox's
        # own lo, where nothing listens: refused either way.
        loopback = set(urls["loopback"])
        for kind in ("urllib", "curl"):
            results, record = self.run_net("public", kind, flat)
            for res in results:
                direct = res["target"].split("?m=")[0] in loopback
                if direct and res.get("status") != 403:
                    self.assertTrue(res.get("error") or res.get("rc") == 7, "%s: %s" % (kind, res))
                else:
                    self.assertEqual(res.get("status"), 403, "%s: %s" % (kind, res))
                    self.assertIn("toolsandboxd egress", res.get("body", ""), res)
                self.assertNotIn("SECRET", res.get("body", ""))
            self.assertEqual(record["egress"]["allowed"], 0, record)
        # Through CONNECT, as requests sends HTTPS.
        tunnels = ["https://10.20.0.10/", "https://metadata.test/", "https://loop.test:%d/" % lp,
                   "https://[::ffff:169.254.169.254]/", "https://self.test/"]
        results, _ = self.run_net("public", "requests", tunnels, ca=T.ca)
        for res in results:
            self.assertIn("Tunnel connection failed: 403", res.get("error", ""), res)
        for log in (T.world_log, T.loopback_log):
            self.assertNotIn(marker, read_text(log), "a denied server was reached")
        self.assertRegex(self.daemon.log(), r'egress run_id=\S+ .*host="169.254.169.254" port=80 address=- '
                                            r'verdict=refused reason="denied: 169.254.169.254 is link-local')

    def test_a_redirect_to_a_denied_address_is_refused(self):
        for target in ("http://169.254.169.254/latest/meta-data", "http://metadata.test/latest/meta-data",
                       "http://loop.test:%d/" % LOOPBACK_PORT, "http://[::ffff:10.20.0.10]/"):
            url = "http://api.public.test/redirect?to=" + target
            results, record = self.run_net("public", "requests", [url])
            self.assertEqual(results[0].get("status"), 403, results[0])
            self.assertNotIn("SECRET", results[0].get("body", ""))
            self.assertEqual(record["egress"]["allowed"], 1, "the redirect itself, then the refusal: %s" % record)
        self.assertFalse(any(e["path"].startswith("/latest") for e in world_requests()))

    def test_the_denied_servers_are_really_there(self):
        # The refusals above are the proxy's: from the daemon's namespace,
        # without it, every one of these servers answers.
        for url in ("http://10.20.0.10/whoami", "http://169.254.169.254/whoami", "http://100.64.0.10/whoami",
                    "http://[fd00:20::10]/whoami", "http://127.0.0.1:%d/whoami" % LOOPBACK_PORT,
                    "http://198.51.100.1:%d/whoami" % LOOPBACK_PORT):
            p = sh(*in_ns(NS_DAEMON, "curl", "-sS", "--noproxy", "*", "--max-time", "10", url), check=False)
            self.assertEqual(p.returncode, 0, "%s: %s" % (url, p.stderr))
            self.assertIn('"server"', p.stdout)

    def test_no_way_out_but_the_proxy(self):
        results, record = self.run_net("egress", "tcp", ["198.51.100.10:80", "[2001:db8::10]:80", "10.20.0.10:80"])
        # Two walls: Landlock refuses a TCP connect to any port but the
        # proxy's (EACCES) where the kernel has its net layer; the namespace
        # has no route (ENETUNREACH) behind it.
        tcp_errno = 13 if ":" in record.get("landlock", "") and "net" in record["landlock"] else 101
        for res in results:
            self.assertNotIn("connected", res, res)
            self.assertEqual(res.get("errno"), tcp_errno, res)
        results, _ = self.run_net("egress", "udp", ["198.51.100.10:53", "[2001:db8::10]:53", "169.254.169.254:53"])
        for res in results:
            self.assertNotIn("sent", res, res)
            self.assertEqual(res.get("errno"), 101, res)
        results, _ = self.run_net("egress", "raw", ["-"])
        self.assertNotIn("opened", results[0], results[0])
        self.assertIn("PermissionError", results[0].get("error", ""), results[0])

    def test_none_has_no_route_and_no_proxy(self):
        env, _ = self.run_net("none", "env", ["-"])
        self.assertEqual(env[0]["env"], {})
        results, record = self.run_net("none", "tcp", ["127.0.0.1:3128", "198.51.100.10:80"])
        self.assertEqual(results[0].get("errno"), 111, results[0])  # ECONNREFUSED: nothing listens
        self.assertEqual(results[1].get("errno"), 101, results[1])
        self.assertNotIn("egress", record)

    # --- caps, audit, status ---------------------------------------------------

    def test_plain_http_carries_one_request_and_its_body_only(self):
        m1, m2 = uuid.uuid4().hex, uuid.uuid4().hex
        pipelined = ("GET http://api.public.test/whoami?m=%s HTTP/1.1\r\n\r\n"
                     "GET http://api.public.test/whoami?m=%s HTTP/1.1\r\n\r\n" % (m1, m2))
        smuggled = ("POST http://api.public.test/post?m=%s HTTP/1.1\r\nContent-Length: 5\r\n"
                    "Connection: Content-Length\r\n\r\nhelloGET /admin?m=%s HTTP/1.1\r\nHost: internal.test\r\n\r\n"
                    % (m1, m2))
        results, _ = self.run_net("egress", "bytes", [pipelined, smuggled])
        for r in results:
            self.assertEqual(r["answer"].count("HTTP/1.1 200"), 1, r)
            # The answer says the connection carries no second request.
            head = r["answer"].split("\r\n\r\n", 1)[0]
            self.assertEqual(re.findall(r"(?im)^connection:.*$", head), ["Connection: close"], head)
        seen = [e for e in world_requests() if m1 in e["path"] or m2 in e["path"]]
        self.assertEqual([(e["method"], m1 in e["path"]) for e in seen], [("GET", True), ("POST", True)], seen)
        self.assertEqual(json.loads(results[1]["answer"].split("\r\n\r\n", 1)[1])["body_bytes"], 5)
        chunked, _ = self.run_net("egress", "bytes", ["POST http://api.public.test/post HTTP/1.1\r\n"
                                                      "Transfer-Encoding: chunked\r\n\r\n5\r\nhello\r\n0\r\n\r\n"])
        self.assertIn("HTTP/1.1 400", chunked[0]["answer"])
        self.assertIn("Transfer-Encoding", chunked[0]["answer"])

    def test_response_heads_interim_oversized_cut_off_and_folded(self):
        """The proxy passes a few interim (1xx) heads, answers 502 with a
        reason to too many of them, to a head too large and to one cut off
        (never half a head), and drops a folded line with the Connection
        field it continues."""
        get = "GET http://api.public.test/raw?kind=%s HTTP/1.1\r\n\r\n"
        results, _ = self.run_net("egress", "bytes", [get % "interim&n=3", get % "interim&n=9", get % "big-head",
                                                      get % "half-head", get % "fold"])
        few, many, big, half, fold = (r["answer"] for r in results)
        self.assertEqual(few.count("HTTP/1.1 103 Early Hints"), 3, few)
        self.assertIn("HTTP/1.1 200 OK", few)
        self.assertTrue(few.endswith("\r\n\r\nok"), few)
        self.assertEqual(many.count("HTTP/1.1 103"), 8, many)
        self.assertIn("HTTP/1.1 502 the server sent more than 8 interim (1xx) response heads", many)
        self.assertTrue(big.startswith("HTTP/1.1 502 the server's response head is larger than"), big[:200])
        self.assertNotIn("X-Big", big)
        self.assertTrue(half.startswith("HTTP/1.1 502 the server closed within its response head"), half)
        self.assertNotIn("X-Half", half)
        head = fold.split("\r\n\r\n", 1)[0]
        self.assertTrue(head.startswith("HTTP/1.1 200 OK"), fold)
        self.assertNotIn("X-Forged", head)
        self.assertEqual(re.findall(r"(?im)^connection:.*$", head), ["Connection: close"], head)

    def test_a_name_written_with_its_root_dot_is_the_same_name(self):
        # "api.public.test." is the absolute form of the name the policy
        # allows: allowed, resolved and reached like it.
        results, _ = self.run_net("egress", "proxy", ["http://api.public.test./whoami", "CONNECT api.public.test.:443"])
        self.assertEqual([r["status"] for r in results], [200, 200], results)

    def test_a_second_request_during_an_answer_does_not_cut_the_answer(self):
        results, _ = self.run_net("egress", "late", ["GET http://api.public.test/raw?kind=slow HTTP/1.1\r\n\r\n"])
        answer = results[0]["answer"]
        self.assertEqual(answer.count("HTTP/1.1 200"), 1, answer)
        self.assertTrue(answer.endswith("\r\n\r\n" + "sl" * 10), answer)

    def test_a_refused_upload_gets_its_answer_not_a_reset(self):
        results, _ = self.run_net("public", "upload", ["http://private.test/", "http://10.20.0.10/"])
        for r in results:
            self.assertEqual(r.get("status"), 403, r)
            self.assertIn("toolsandboxd egress", r["body"])

    def test_addresses_the_host_takes_as_its_own_and_cloud_platform_services(self):
        results, _ = self.run_net("public", "proxy", ["CONNECT 198.51.100.200:443", "CONNECT 168.63.129.16:80",
                                                      "CONNECT [::ffff:0:a14:a]:80", "CONNECT [2001:db8:77::5]:443"])
        self.assertEqual([r["status"] for r in results], [403, 403, 403, 403], results)
        self.assertIn("local route", results[0]["body"])
        self.assertIn("WireServer", results[1]["body"])
        self.assertIn("IPv4-translated", results[2]["body"])
        self.assertIn("local route", results[3]["body"])

    def test_names_are_looked_up_as_written_never_with_a_search_domain(self):
        before = read_text(T.dns_log)
        results, _ = self.run_net("public", "proxy", ["http://nosuch.public.test/", "CONNECT nosuch2.public.test:443"])
        self.assertEqual([r["status"] for r in results], [502, 502], results)
        self.assertIn("cannot resolve nosuch.public.test", results[0]["body"])
        asked = read_text(T.dns_log)[len(before):].split()
        self.assertIn("nosuch.public.test", asked)
        self.assertIn("nosuch2.public.test", asked)
        self.assertFalse([q for q in asked if "corp.test" in q], asked)

    def test_connection_cap(self):
        results, record = self.run_net("caps", "urllib", ["http://api.public.test/whoami"] * 12)
        self.assertEqual([r.get("status") for r in results[:4]], [200, 200, 200, 403], results)
        self.assertIn("connection cap (3)", results[3]["body"])
        # Past the cap the proxy's listener is closed: the sandbox's own
        # kernel refuses the rest, with no work and no audit line each.
        for r in results[4:]:
            self.assertIn("Connection refused", r.get("error", ""), r)
        self.assertEqual(record["egress"]["connections"], 4, record)
        lines = re.findall(r"egress run_id=%s " % re.escape(record["run_id"]), self.daemon.log())
        self.assertEqual(len(lines), 4)

    def test_byte_cap(self):
        results, record = self.run_net("caps", "urllib", ["http://api.public.test/bytes?n=1000000",
                                                          "http://api.public.test/whoami"])
        self.assertLess(len(results[0].get("body", "")), 65536, results[0].get("error"))
        self.assertLessEqual(record["egress"]["bytes_sent"] + record["egress"]["bytes_received"], 65536, record)
        self.assertEqual(results[1].get("status"), 403, results[1])
        self.assertIn("byte cap", results[1]["body"])
        self.assertIn('reason="the run\'s byte cap (64 KiB) was reached"', self.daemon.log())

    def test_what_a_refusal_drains_counts_toward_the_byte_cap(self):
        # An 8 MiB upload to a denied host is refused; what the proxy reads
        # and drops of its body meanwhile is the run's traffic too, so the
        # 64 KiB cap is spent and the next allowed request is refused.
        results, _ = self.run_net("caps", "upload", ["http://private.test/"])
        self.assertNotEqual(results[0].get("status"), 200, results[0])
        after, _ = self.run_net("caps", "urllib", ["http://api.public.test/whoami"])
        self.assertEqual(after[0].get("status"), 200, "a new run has its own cap: %s" % after[0])
        both, _ = self.run_net("caps", "upload+get", ["http://private.test/ http://api.public.test/whoami"])
        self.assertEqual(both[0].get("status"), 403, both[0])
        self.assertIn("byte cap", both[0].get("body", ""), both[0])

    def test_audit_line_per_connection_and_status_counters(self):
        before = self.daemon.status()["egress"]
        results, record = self.run_net("egress", "urllib", ["http://api.public.test/whoami", "http://private.test/"])
        rid = re.escape(record["run_id"])
        log = self.daemon.log()
        allowed = re.search(r'egress run_id=%s request_id="[^"]+" org="%s" tool="net" host="api.public.test" port=80 '
                            r'address=(?:198\.51\.100\.10|2001:db8::10) verdict=allowed reason=- sent=(\d+) '
                            r'received=(\d+)' % (rid, ORG),
                            log)
        self.assertIsNotNone(allowed, log[-3000:])
        self.assertGreater(int(allowed.group(1)), 0)
        self.assertGreater(int(allowed.group(2)), 0)
        self.assertRegex(log, r'egress run_id=%s .*host="private.test" port=80 address=- verdict=refused '
                              r'reason="private.test is not allowed by the policy"' % rid)
        self.assertRegex(log, r'audit run_id=%s .* egress_connections=2 egress_refused=1' % rid)
        after = self.daemon.status()["egress"]
        self.assertGreaterEqual(after["allowed"], before["allowed"] + 1)
        self.assertGreaterEqual(after["refused"], before["refused"] + 1)
        self.assertGreater(after["runs"], before["runs"])
        self.assertEqual(after["open"], 0)

    def test_the_cgroup_hierarchy_is_the_one_expected(self):
        # The VM lane sets TSB_EXPECT_CGROUP=v2: these tests then prove the
        # mode on cgroup v2. Elsewhere: the host's own (v2 when
        # /sys/fs/cgroup is the unified hierarchy, v1 on a hybrid host).
        unified = os.path.exists("/sys/fs/cgroup/cgroup.controllers")
        expected = os.environ.get("TSB_EXPECT_CGROUP") or ("v2" if unified else "v1")
        self.assertEqual(self.daemon.status()["cgroup_mode"], expected)


# --- per-tool venvs built from a package index ---------------------------------

# A package whose .pth file, run by the build's `pip freeze`, asks the
# build's egress proxy for a host written with a C1 control (U+009B, a
# terminal's CSI), a bidirectional control and a byte that is not UTF-8,
# then fails the freeze: the build fails, and its error names the proxy's
# refusal, escaped.
NOISY_TARGET = b"evil\xc2\x9b2J\xe2\x80\xae.test\xff:443"
NOISY_HOOK = (
    "import os, socket\n"
    "s = socket.create_connection(('127.0.0.1', 3128), timeout=10)\n"
    "s.sendall(b'CONNECT ' + %r + b' HTTP/1.1\\r\\n\\r\\n')\n"
    "s.recv(4096)\n"
    "s.close()\n"
    "os._exit(1)\n" % NOISY_TARGET)

# The tool of the venv tests: it imports the index's wheel.
IMPORT_TOOL = (
    "import sys\n\n"
    "def imp() -> dict:\n"
    "    import tsbdemo\n"
    "    return {'value': tsbdemo.VALUE, 'prefix': sys.prefix, 'file': tsbdemo.__file__}\n"
)


def packages_policy(index):
    """A policy whose runs get venvs built from `index`; the runs themselves
    have no network (the build's is its own: the proxy, to the index only)."""
    # A policy with "packages" needs a venv of its own (default.json's) and
    # its interpreter in /venv.
    return {"network": "none", "filesystem": {"venv": "/var/lib/toolsandbox/venv"}, "interpreter": "/venv/bin/python3",
            "packages": {"allow": ["tsb*"], "wheels": None, "index": index, "build": {"wall_timeout": "120s", "memory": "1GiB"}}}


class VenvIndexTest(unittest.TestCase):
    """Venv builds from a package index (policies/README.md, "packages"): the
    build sandbox's one way out is the daemon's proxy, to the index and
    nothing else, the deny list included."""

    @classmethod
    def setUpClass(cls):
        try:
            user = pwd.getpwnam("toolsandboxd")  # the daemon's front end, whose the cache is
        except KeyError:
            reason = "no toolsandboxd user (the set-up of scripts/start.sh or scripts/test.sh creates it)"
            if F.must_run():
                raise AssertionError(reason)
            raise unittest.SkipTest(reason)
        cls.cache = os.path.join(T.tmp, "venvs")
        os.mkdir(cls.cache)
        os.chmod(cls.cache, 0o755)
        os.chown(cls.cache, user.pw_uid, user.pw_gid)
        policies = os.path.join(T.tmp, "policies-venvs")
        write_policies(policies, {
            "pkgs": packages_policy("http://%s:%d/simple" % (INDEX_HOST, INDEX_PORT)),
            "pkgs-private": packages_policy("http://private.test/simple"),
            "pkgs-metadata": packages_policy("http://metadata.test/simple"),
            "pkgs-loopback": packages_policy("http://loop.test:%d/simple" % LOOPBACK_PORT),
        })
        cls.daemon = F.Daemon(wrap=T.daemon_wrap(), policies_dir=policies,
                              organizations=os.path.join(policies, "organizations.json"),
                              venvs={"cache_dir": cls.cache})
        cls.addClassCleanup(cls.daemon.stop)
        cls.daemon.start()

    def run_imp(self, policy, reqs):
        return self.daemon.client(timeout=300).run_tool(IMPORT_TOOL, tool_name="imp", args={}, organization_id=ORG,
                                                        policy=policy, pip_requirements=reqs)

    def keys(self):
        return sorted(n for n in os.listdir(self.cache) if len(n) == 64)

    def assert_build_failed(self, r, requirement):
        self.assertEqual(r.status, "error", "%s %s %s" % (r.func_return, r.stderr, r.record))
        self.assertEqual(r.record["detail"], "venv_build_failed", r.record)
        self.assertEqual(r.record["end_reason"], "setup_failed", r.record)
        self.assertEqual(r.record["setup_stage"], "venv-build", r.record)
        self.assertIn("Error executing function imp: RuntimeError", r.func_return)
        self.assertIn(requirement, r.func_return)
        v = r.record["venv"]
        self.assertFalse(v["built"], v)
        self.assertEqual(v["requirements"], [requirement])
        self.assertTrue(v["build_run_id"], v)
        self.assertNotIn(v["key"], self.keys())
        self.assertFalse([n for n in os.listdir(self.cache) if n.startswith(".tmp-")])
        return v["build_run_id"]

    def test_a_venv_is_built_from_the_index_through_the_proxy_then_reused(self):
        mark = len(world_requests())
        r = self.run_imp("pkgs", ["tsbdemo"])
        self.assertEqual(r.status, "success", "%s %s %s" % (r.func_return, r.stderr, r.record))
        self.assertEqual(r.func_return["value"], "tsbdemo-from-the-test-index")
        self.assertEqual(r.func_return["prefix"], "/venv")
        self.assertTrue(r.func_return["file"].startswith("/venv/lib/"), r.func_return)
        v = r.record["venv"]
        self.assertTrue(v["built"], v)
        self.assertEqual(v["requirements"], ["tsbdemo"])
        self.assertGreater(v["build_ms"], 0)
        self.assertTrue(v["build_run_id"], v)
        self.assertNotEqual(v["build_run_id"], r.record["run_id"])
        self.assertNotIn("egress", r.record, "the tool's own run has no network")
        key = v["key"]
        self.assertIn(key, self.keys())
        with open(os.path.join(self.cache, key + ".json")) as f:
            manifest = json.load(f)
        self.assertIn("tsbdemo==1.0", manifest["freeze"])
        self.assertEqual(manifest["policy"], "pkgs")
        # The build asked the index for the project, then for its wheel:
        # the index server, by the name the policy gives, and nothing else.
        seen = world_requests()[mark:]
        self.assertEqual({(e["local"], e["port"], e["host"]) for e in seen},
                         {(INDEX_ADDRESS, INDEX_PORT, "%s:%d" % (INDEX_HOST, INDEX_PORT))}, seen)
        paths = [e["path"] for e in seen]
        self.assertIn("/simple/tsbdemo/", paths)
        self.assertIn("/files/tsbdemo-1.0-py3-none-any.whl", paths)
        self.assertRegex(self.daemon.log(), r'egress run_id=%s request_id="[^"]+/venv" org="%s" tool="imp" host="%s" '
                                            r'port=%d address=%s verdict=allowed'
                         % (re.escape(v["build_run_id"]), ORG, INDEX_HOST, INDEX_PORT, re.escape(INDEX_ADDRESS)))
        # Again: the same venv, from the cache; the index is not asked.
        mark = len(world_requests())
        r2 = self.run_imp("pkgs", ["tsbdemo"])
        self.assertEqual(r2.status, "success", "%s %s %s" % (r2.func_return, r2.stderr, r2.record))
        self.assertEqual(r2.func_return["value"], "tsbdemo-from-the-test-index")
        self.assertFalse(r2.record["venv"]["built"], r2.record["venv"])
        self.assertEqual(r2.record["venv"]["key"], key)
        self.assertIsNone(r2.record["venv"]["build_run_id"])
        self.assertEqual(world_requests()[mark:], [])

    def test_a_venv_build_reaches_the_index_and_nothing_else(self):
        before = self.keys()
        loopback = len(read_text(T.loopback_log))
        mark = len(world_requests())
        # Not on the index: the index says so, the build fails.
        r = self.run_imp("pkgs", ["tsbmissing"])
        self.assert_build_failed(r, "tsbmissing")
        self.assertIn("tsbmissing", "\n".join(r.stderr), "pip's last lines")
        # On the index, but its file is on another world server: the proxy
        # refuses it, the build fails, that server never sees the request.
        r = self.run_imp("pkgs", ["tsboffsite"])
        offsite_run = self.assert_build_failed(r, "tsboffsite")
        seen = world_requests()[mark:]
        paths = [e["path"] for e in seen]
        self.assertIn("/simple/tsbmissing/", paths)
        self.assertIn("/simple/tsboffsite/", paths)
        self.assertEqual({(e["local"], e["port"]) for e in seen}, {(INDEX_ADDRESS, INDEX_PORT)}, seen)
        self.assertFalse([p for p in paths if "tsboffsite-1.0" in p], seen)
        self.assertEqual(read_text(T.loopback_log)[loopback:], "")
        self.assertRegex(self.daemon.log(), r'egress run_id=%s .*host="api.public.test" port=8080 address=- '
                                            r'verdict=refused reason="api.public.test is not allowed by the policy"'
                         % re.escape(offsite_run))
        self.assertEqual(self.keys(), before)

    def test_a_refusal_that_fails_the_build_is_named_escaped(self):
        r = self.run_imp("pkgs", ["tsbnoisy"])
        build_run = self.assert_build_failed(r, "tsbnoisy")
        error = r.record["error"]
        # The build's error names the proxy's refusal, after pip's failure.
        self.assertIn("pip failed; the egress proxy refused a request: not a host name or an address: "
                      '"evil\\u009B2J\\u202E.test\\xFF"', error)
        self.assertIn("the egress proxy refused a request", r.func_return)
        for text in (error, r.func_return):
            self.assertFalse([c for c in text if ord(c) < 0x20 or 0x7f <= ord(c) <= 0x9f or c in "\u202e\ufffd"], text)
        # The daemon's log: the refusal's audit line and the build's
        # failure, each one line, escaped.
        with open(self.daemon.log_path, "rb") as f:
            log = f.read()
        for raw in (b"\xc2\x9b", b"\xe2\x80\xae", b"\xff", b"\x1b"):
            self.assertNotIn(raw, log)
        # (A request the proxy cannot read is "failed", not "refused".)
        self.assertRegex(log.decode(), r'egress run_id=%s .*verdict=failed reason="not a host name or an address: '
                                       r'\\"evil\\\\u009B2J\\\\u202E.test\\\\xFF\\""' % re.escape(build_run))
        self.assertRegex(log.decode(), r"venv [0-9a-f]{12}: build failed \(run %s[,)].*: pip failed; the egress proxy refused a request: "
                                       r'not a host name or an address: "evil\\u009B2J\\u202E.test\\xFF"' % re.escape(build_run))

    def test_an_index_at_a_denied_address_fails_the_build_and_is_never_reached(self):
        before = self.keys()
        loopback = len(read_text(T.loopback_log))
        mark = len(world_requests())
        for policy, host, port, address in (("pkgs-private", "private.test", 80, "10.20.0.10"),
                                            ("pkgs-metadata", "metadata.test", 80, "169.254.169.254"),
                                            ("pkgs-loopback", "loop.test", LOOPBACK_PORT, "127.0.0.1")):
            with self.subTest(policy=policy):
                r = self.run_imp(policy, ["tsbdemo"])
                build_run = self.assert_build_failed(r, "tsbdemo")
                # pip's last lines name the index it was given.
                self.assertIn("Looking in indexes: http://%s%s/simple" % (host, "" if port == 80 else ":%d" % port),
                              "\n".join(r.stderr))
                # The proxy refused it by the deny list (the build's rules
                # allow the name and port), and let nothing through.
                self.assertRegex(self.daemon.log(),
                                 r'egress run_id=%s .*host="%s" port=%d address=- verdict=refused '
                                 r'reason="%s resolves only to denied addresses \(%s is '
                                 % (re.escape(build_run), re.escape(host), port, re.escape(host), re.escape(address)))
                self.assertNotRegex(self.daemon.log(), r'egress run_id=%s .*verdict=allowed' % re.escape(build_run))
                # The run's error says so (pip alone reports a missing package).
                self.assertIn("the egress proxy refused %s:%d: %s resolves only to denied addresses" % (host, port, host),
                              r.record["error"])
        self.assertEqual(world_requests()[mark:], [], "a denied server was reached")
        self.assertEqual(read_text(T.loopback_log)[loopback:], "", "the daemon's host-loopback service was reached")
        self.assertEqual(self.keys(), before)


if __name__ == "__main__":
    unittest.main()
