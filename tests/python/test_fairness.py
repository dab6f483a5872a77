"""Per-peer fairness (docs/SECURITY.md, "Per-peer fairness"): a hostile
client of another uid at its limits (many connections, request lines left
unfinished, many queued runs) beside a well-behaved client, whose runs all
succeed, none answered `busy`. Needs root (see daemon_fixture.py): the
hostile client is a forked child that becomes uid 65534 and reaches the
socket through its group (mode 0660, group of gid 65534), as the peer
rules of docs/SECURITY.md allow when `allowed_uids` names it.

    /usr/bin/python3 -m unittest tests/python/test_fairness.py -v
"""

import concurrent.futures
import grp
import json
import os
import select
import socket
import sys
import time
import unittest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import daemon_fixture as F  # noqa: E402

ORG = "org-client-tests"
ADD_TOOL = "def add(a: int, b: int) -> int:\n    return a + b\n"
HOSTILE_UID = 65534
KIB = 1024
MIB = 1024 * KIB


def _nogroup():
    try:
        return grp.getgrgid(HOSTILE_UID).gr_name
    except KeyError:
        return None


def hostile_client(socket_path, runs, lines, line_bytes, idle, report, release):
    """Runs in a forked child as uid 65534: opens `runs` connections each
    sending a long run, `lines` connections each sending `line_bytes` of a
    request line with no end, and `idle` connections sending nothing; says
    what it got through on `report` and holds everything until `release`
    is closed. Never returns."""
    code = 0
    try:
        os.setgroups([])
        os.setgid(HOSTILE_UID)
        os.setuid(HOSTILE_UID)
        socks, sent = [], {"runs": 0, "lines": 0, "idle": 0}

        def connect():
            s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            s.settimeout(10)
            s.connect(socket_path)
            socks.append(s)
            return s

        for i in range(runs):
            try:
                connect().sendall(json.dumps(F.sleep_request(60, "hostile-%d" % i)).encode() + b"\n")
                sent["runs"] += 1
            except OSError:
                pass
        head = b'{"v":1,"id":"partial","type":"execute","organization_id":"x","script":"'
        for _ in range(lines):
            try:
                connect().sendall(head + b"#" * (line_bytes - len(head)))  # no newline, ever
                sent["lines"] += 1
            except OSError:
                pass
        for _ in range(idle):
            try:
                connect()
                sent["idle"] += 1
            except OSError:
                pass
        os.write(report, (json.dumps(sent) + "\n").encode())
        select.select([release], [], [])  # until the test is done
    except BaseException as e:  # noqa: B902 - the child must never return into the test runner
        try:
            os.write(report, (json.dumps({"error": repr(e)}) + "\n").encode())
        except OSError:
            pass
        code = 1
    os._exit(code)


@unittest.skipUnless(_nogroup(), "no group with gid 65534 on this host")
class Fairness(unittest.TestCase):
    def daemon(self):
        F.require_daemon()
        d = F.Daemon(socket={"group": _nogroup(), "mode": "0660"}, allowed_uids=[0, HOSTILE_UID],
                     max_concurrent_runs=4, max_queued_runs=8, max_frame_bytes="1MiB", max_buffered_bytes="4MiB",
                     max_connections=24, request_timeout="60s")
        self.addCleanup(d.stop)
        return d.start()

    def start_hostile(self, daemon, **kw):
        report_r, report_w = os.pipe()
        release_r, release_w = os.pipe()
        pid = os.fork()
        if pid == 0:
            os.close(report_r)
            os.close(release_w)
            hostile_client(daemon.socket_path, report=report_w, release=release_r, **kw)
        os.close(report_w)
        os.close(release_r)

        def stop():
            os.close(release_w)
            os.waitpid(pid, 0)

        self.addCleanup(stop)
        ready, _, _ = select.select([report_r], [], [], 120)
        self.assertTrue(ready, "the hostile client did not report")
        with os.fdopen(report_r) as f:
            sent = json.loads(f.readline())
        self.assertNotIn("error", sent, sent)
        return sent

    def well_behaved_runs(self, daemon, n=6):
        """n small runs at once, each on a connection of its own, and one
        request line of 900 KiB (beyond the 64 KiB a connection may hold
        without drawing on max_buffered_bytes): every one must succeed."""
        def small(i):
            t0 = time.monotonic()
            r = daemon.client().run_tool(ADD_TOOL, tool_name="add", args={"a": i, "b": 1}, organization_id=ORG)
            return r.func_return, time.monotonic() - t0

        with concurrent.futures.ThreadPoolExecutor(n) as pool:
            results = list(pool.map(small, range(n)))
        self.assertEqual([r for r, _ in results], [i + 1 for i in range(n)])
        big = "x = 7\n" + "#" * (900 * KIB) + "\nprint(x * 6)\n"
        r = daemon.client().execute(big, tool_name="big", organization_id=ORG)
        self.assertEqual(r.status, "success", r)
        self.assertEqual("".join(r.stdout), "42\n", r)
        return max(t for _, t in results)

    def test_hostile_peer_beside_a_connected_client(self):
        """The well-behaved client is connected (as letta-server keeps its
        connections) when the hostile one fills what it can: the run slots,
        the queue and the request budget, on fewer connections than
        max_connections (the next test takes those)."""
        d = self.daemon()
        standing = d.raw()  # this peer's connection, open throughout
        self.addCleanup(standing.close)
        sent = self.start_hostile(d, runs=14, lines=6, line_bytes=900 * KIB, idle=0)
        self.assertEqual(sent["runs"], 14, sent)
        d.wait_for(lambda s: s["runs_in_flight"] >= 2 and s["runs_queued"] >= 4, 30, "the hostile runs to queue")
        self.well_behaved_runs(d)
        st = standing.request({"v": 1, "id": "s", "type": "status"})["status"]
        # The hostile peer held its shares throughout: 2 of 4 slots, 4 of 8
        # queue places, 2 MiB of the 4 MiB budget; the rest was refused.
        self.assertEqual(st["runs_in_flight"], 2, st)
        self.assertEqual(st["runs_queued"], 4, st)
        self.assertLessEqual(st["buffered_bytes"], 2 * MIB + 24 * 64 * KIB, st)
        self.assertEqual(st["fairness"]["peers"], 2, st)

    def test_hostile_peer_first_gives_way(self):
        """The hostile client is alone when it takes every connection and
        the whole request budget with unfinished lines; a client that
        connects afterwards is served all the same: the hostile peer, now
        over its share, gives up a connection and a line."""
        d = self.daemon()
        sent = self.start_hostile(d, runs=0, lines=5, line_bytes=900 * KIB, idle=24)
        d.wait_for(lambda s: s["buffered_bytes"] >= 3 * MIB, 30, "the hostile lines to be held")
        self.assertGreaterEqual(sent["lines"], 4, sent)
        d.wait_for(lambda s: s["connections_open"] >= 23, 30, "the hostile connections to fill max_connections")
        self.well_behaved_runs(d)
        st = d.status()
        self.assertGreaterEqual(st["fairness"]["given_up"]["connections"], 1, st)
        self.assertGreaterEqual(st["fairness"]["given_up"]["request_lines"], 1, st)


if __name__ == "__main__":
    unittest.main()
