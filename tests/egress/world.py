"""The test's "internet": HTTP and HTTPS servers in a network namespace the
egress tests create (tests/egress/test_egress.py), never on a real network.

    python3 world.py --http PORT[,PORT...] [--https PORT --cert FILE --key FILE]
                     --log FILE --name NAME [--wheel FILE]... [--offsite URL]

Every server listens on all addresses of its namespace (IPv4 and IPv6) and
answers:
  /whoami            JSON: which server (--name), the address and port the
                     request arrived on, the Host field, the method
  /redirect?to=URL   302 to URL
  /bytes?n=N         N bytes of "x"
  /simple/...        a PEP 503 index holding each --wheel (any other project: 404;
                     with --offsite URL, project "tsboffsite" lists one
                     file, at URL: another server's, for a test to prove a
                     build never fetches it)
  /files/NAME        a wheel
  /latest/meta-data  a stand-in for instance credentials ("SECRET-...")
  anything else      JSON as /whoami
Each request is appended to --log as one JSON line, so a test can prove a
server was never reached. Prints "ready" once every socket listens.
"""

import argparse
import json
import os
import re
import socket
import ssl
import sys
import threading
import time
import urllib.parse
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

SECRET = "SECRET-INSTANCE-CREDENTIALS"


class Server(ThreadingHTTPServer):
    address_family = socket.AF_INET6
    daemon_threads = True
    allow_reuse_address = True

    def server_bind(self):
        self.socket.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 0)
        super().server_bind()


def handler_for(args, log_lock):
    wheels = {os.path.basename(w): w for w in args.wheel or []}

    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def log_message(self, fmt, *a):  # quiet
            pass

        def _log(self):
            local = self.connection.getsockname()
            entry = {"server": args.name, "local": local[0].removeprefix("::ffff:"), "port": local[1],
                     "path": self.path, "host": self.headers.get("Host"), "method": self.command}
            with log_lock, open(args.log, "a") as f:
                f.write(json.dumps(entry) + "\n")
            return entry

        def _send(self, code, body, ctype="application/json", extra=()):
            if isinstance(body, str):
                body = body.encode()
            self.send_response(code)
            self.send_header("Content-Type", ctype)
            self.send_header("Content-Length", str(len(body)))
            for k, v in extra:
                self.send_header(k, v)
            self.end_headers()
            if self.command != "HEAD":
                self.wfile.write(body)

        def do_GET(self):
            entry = self._log()
            url = urllib.parse.urlsplit(self.path)
            q = urllib.parse.parse_qs(url.query)
            if url.path == "/redirect":
                return self._send(302, "", "text/plain", [("Location", q["to"][0])])
            if url.path == "/bytes":
                return self._send(200, "x" * int(q["n"][0]), "application/octet-stream")
            if url.path == "/raw":
                # Answers written by hand, for the proxy's reading of
                # response heads: interim heads, a head too large, a head
                # cut off, a folded field.
                kind, n = q["kind"][0], int(q.get("n", ["1"])[0])
                raw = {
                    "interim": b"HTTP/1.1 103 Early Hints\r\nLink: </a>\r\n\r\n" * n
                    + b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok",
                    "big-head": b"HTTP/1.1 200 OK\r\nX-Big: " + b"a" * 40000 + b"\r\n\r\n",
                    "half-head": b"HTTP/1.1 200 OK\r\nX-Half: cut",
                    "fold": b"HTTP/1.1 200 OK\r\nConnection: keep-alive,\r\n X-Forged: yes\r\n"
                    b"Content-Length: 2\r\n\r\nok",
                    "slow": b"HTTP/1.1 200 OK\r\nContent-Length: 20\r\n\r\n",
                }[kind]
                self.wfile.write(raw)
                if kind == "slow":  # the body over a second, 2 bytes at a time
                    for _ in range(10):
                        self.wfile.flush()
                        time.sleep(0.1)
                        self.wfile.write(b"sl")
                self.wfile.flush()
                self.close_connection = True
                return None
            if url.path == "/latest/meta-data":
                return self._send(200, SECRET, "text/plain")
            if url.path.startswith("/simple") and wheels:
                projects = {w.split("-")[0].replace("_", "-").lower(): "/files/" + w for w in wheels}
                if args.offsite:
                    projects["tsboffsite"] = args.offsite
                parts = [p for p in url.path.split("/") if p]
                if len(parts) == 1:
                    return self._send(200, "".join('<a href="/simple/%s/">%s</a>' % (p, p) for p in projects),
                                      "text/html")
                link = projects.get(re.sub(r"[-_.]+", "-", parts[1]).lower())
                if link is None:
                    return self._send(404, "no such project", "text/plain")
                name = link.rsplit("/", 1)[1]
                return self._send(200, '<a href="%s">%s</a>' % (link, name), "text/html")
            if url.path.startswith("/files/") and url.path[len("/files/"):] in wheels:
                with open(wheels[url.path[len("/files/"):]], "rb") as f:
                    return self._send(200, f.read(), "application/octet-stream")
            return self._send(200, json.dumps(entry))

        def do_POST(self):
            entry = self._log()
            n = int(self.headers.get("Content-Length", "0"))
            entry["body_bytes"] = len(self.rfile.read(n))
            return self._send(200, json.dumps(entry))

        do_HEAD = do_GET

    return Handler


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--http", default="")
    ap.add_argument("--https", type=int)
    ap.add_argument("--cert")
    ap.add_argument("--key")
    ap.add_argument("--log", required=True)
    ap.add_argument("--name", required=True)
    ap.add_argument("--wheel", action="append")
    ap.add_argument("--offsite")
    args = ap.parse_args()
    lock = threading.Lock()
    servers = []
    for port in filter(None, args.http.split(",")):
        servers.append(Server(("::", int(port)), handler_for(args, lock)))
    if args.https:
        s = Server(("::", args.https), handler_for(args, lock))
        ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        ctx.load_cert_chain(args.cert, args.key)
        s.socket = ctx.wrap_socket(s.socket, server_side=True)
        servers.append(s)
    for s in servers:
        threading.Thread(target=s.serve_forever, daemon=True).start()
    print("ready", flush=True)
    sys.stdin.read()  # until the test closes our stdin (or kills us)


if __name__ == "__main__":
    main()
