"""A name server of the egress tests: listens on 127.0.0.1:53 in the
daemon's namespace, answers every query "no such name" (NXDOMAIN), and logs
each query name to --log, so that a test sees what the daemon asked."""

import argparse
import socket


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--log", required=True)
    args = ap.parse_args()
    s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    s.bind(("127.0.0.1", 53))
    print("ready", flush=True)
    with open(args.log, "a") as log:
        while True:
            data, peer = s.recvfrom(4096)
            if len(data) < 17:
                continue
            i, labels = 12, []
            while i < len(data) and data[i]:
                n = data[i]
                labels.append(data[i + 1:i + 1 + n].decode("ascii", "replace"))
                i += n + 1
            log.write(".".join(labels) + "\n")
            log.flush()
            # The question back, flagged: a response, recursion available, NXDOMAIN.
            s.sendto(data[:2] + b"\x81\x83" + data[4:6] + b"\0\0\0\0\0\0" + data[12:i + 5], peer)


if __name__ == "__main__":
    main()
