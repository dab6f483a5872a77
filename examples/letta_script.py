# A script in the shape letta-server generates for its local sandbox: the
# tool, the call, and the result written as Letta's binary frame on stdout.
import hashlib
import json
import struct
import sys


def greet(name: str) -> str:
    return f"hello {name}"


_result = greet(name="world")
_payload = json.dumps({"results": _result, "agent_state": None}).encode("utf-8")
sys.stdout.buffer.write(bytes.fromhex("92c8e49843d35fb3919da69eb3e5c5c6") + struct.pack(">I", len(_payload))
                        + hashlib.md5(_payload).hexdigest().encode("ascii") + _payload)
sys.stdout.buffer.flush()
