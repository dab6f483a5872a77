#!/usr/bin/python3
"""Writes the seed corpora of the fuzz targets into tests/fuzz/corpus/.

    /usr/bin/python3 tests/fuzz/make_seeds.py

The seeds are checked in; this script says where each comes from and
rewrites them after a format change (review the diff like code). It is
deterministic: the same tree gives the same files.

  request/       every request of protocol/PROTOCOL.md, one of each type with
                 every field, and lines each decoder check refuses;
  policy/        the shipped policies and organizations file, the golden
                 corpus of tests/policies/ (bad/, lint/), a policy with an
                 inline seccomp profile;
  letta_legacy/  stdout with Letta's legacy text frame, as letta-server's
                 scripts print it (and the prefix/payload/suffix form the
                 target reassembles, see letta_legacy_fuzzer.cc);
  letta_binary/  stdout with Letta's binary frame: good, bad md5, truncated,
                 pickle payload, and the reassembled form;
  shape_result/  inputs laid out as shape_result_fuzzer.cc reads them;
  spawn_wire/    the root spawner's inputs (daemon/wire/compiled.h): run
                 orders, kills, notifications, a compiled set, and broken
                 forms of each, behind the selector byte of spawn_wire_fuzzer.cc;
  venv_archive/  venv archives (daemon/venv/archive.h) as the venv builder
                 writes them (its own write_archive, run on a small tree), and
                 hostile ones: escaping paths, the daemon's frame, duplicates,
                 links in the way, cut short; behind the piece-size byte of
                 venv_archive_fuzzer.cc;
  venv_manifest/ the builder's manifest as it writes it, the cache's as
                 publish writes it, and one past each limit of
                 daemon/venv/manifest.h.
"""

import base64
import hashlib
import importlib.util
import io
import json
import os
import shutil
import struct
import tempfile
import uuid

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.normpath(os.path.join(HERE, "..", ".."))
CORPUS = os.path.join(HERE, "corpus")

LEGACY_START = str(uuid.uuid5(uuid.NAMESPACE_DNS, "local-sandbox-result-start-marker")).encode()
LEGACY_END = str(uuid.uuid5(uuid.NAMESPACE_DNS, "local-sandbox-result-end-marker")).encode()
BINARY_MARKER = uuid.uuid5(uuid.NAMESPACE_DNS, "local-sandbox-result-start-marker").bytes
NONCE = b"00112233445566778899aabbccddeeff"  # shape_result_fuzzer.cc's
ORG = "org-00000000-0000-4000-8000-000000000000"


def reset(target):
    d = os.path.join(CORPUS, target)
    shutil.rmtree(d, ignore_errors=True)
    os.makedirs(d)
    return d


def write(d, name, data):
    if isinstance(data, str):
        data = data.encode()
    with open(os.path.join(d, name), "wb") as f:
        f.write(data)


def line(obj):
    return json.dumps(obj, separators=(",", ":"), ensure_ascii=False)


# --- FuzzedDataProvider layouts ------------------------------------------------
# ConsumeRandomLengthString(max): bytes up to a lone backslash; "\\\\" is a
# literal backslash; the backslash and the byte after it end the string.
# ConsumeBool/ConsumeIntegral* take bytes from the END of the data.

def fdp_string(b):
    return b.replace(b"\\", b"\\\\") + b"\\x"


def legacy_frame(payload):
    return LEGACY_START + base64.b64encode(payload) + LEGACY_END


def binary_frame(payload, md5=None):
    digest = (md5 or hashlib.md5(payload).hexdigest()).encode()
    return BINARY_MARKER + struct.pack(">I", len(payload)) + digest + payload


def requests():
    d = reset("request")
    n = 0
    with open(os.path.join(REPO, "protocol", "PROTOCOL.md"), encoding="utf-8") as f:
        for text in f:
            if text.startswith("\u2192 {"):
                n += 1
                write(d, "protocol-md-%02d.json" % n, text[2:].rstrip("\n"))
    common = {"v": 1, "id": "seed-1", "tool_name": "add", "organization_id": ORG, "policy": "default",
              "env": {"API_KEY": "s3cr3t", "TOOL_MODE": "x"}, "timeout": 12.5,
              "sandbox_config": {"type": "local", "config": {"sandbox_dir": "/tmp", "use_venv": False}},
              "agent_id": "agent-1", "project_id": "project-1"}
    write(d, "execute-all-fields.json", line(dict(common, type="execute", script="print(1)\n")))
    write(d, "run_tool-all-fields.json", line(dict(
        common, type="run_tool", source_code="def add(a: int, b: int) -> int:\n    return a + b\n",
        args={"a": 2, "b": 123456789012345678901234567890, "c": [1.5e300, None, True, "\u00e9\u2028"]},
        json_schema={"name": "add", "parameters": {"type": "object", "properties": {"a": {"type": "integer"}}}},
        agent_state={"id": "agent-1", "memory": {"blocks": []}},
        pip_requirements=["numpy==1.26.0", "requests"])))
    write(d, "status.json", line({"v": 1, "id": "s", "type": "status"}))
    refused = {
        "bad-version.json": '{"v":2,"id":"a","type":"status"}',
        "version-float.json": '{"v":1.0,"id":"a","type":"status"}',
        "duplicate-key.json": '{"v":1,"id":"a","id":"b","type":"status"}',
        "unknown-field.json": '{"v":1,"id":"a","type":"status","extra":1}',
        "unknown-type.json": '{"v":1,"id":"a","type":"exec"}',
        "not-an-object.json": '[{"v":1}]',
        "deep.json": '{"v":1,"id":"a","type":"run_tool","args":{"a":' + "[" * 80 + "]" * 80 + "}}",
        "bom.json": "\ufeff" + '{"v":1,"id":"a","type":"status"}',
        "escapes.json": '{"v":1,"id":"\\u00e9\\ud83d\\ude00","type":"status"}',
        "lone-surrogate.json": '{"v":1,"id":"\\ud800","type":"status"}',
        "bad-env-name.json": line(dict(common, type="execute", script="x", env={"1BAD": "v"})),
        "bad-tool-name.json": line(dict(common, type="execute", script="x", tool_name="class")),
        "long-id.json": line({"v": 1, "id": "x" * 129, "type": "status"}),
        "empty-id.json": line({"v": 1, "id": "", "type": "status"}),
        "nul-byte.json": '{"v":1,"id":"a\x00","type":"status"}',
    }
    for name, text in refused.items():
        write(d, name, text)
    write(d, "invalid-utf8.json", b'{"v":1,"id":"\xff\xfe","type":"status"}')


def policies():
    d = reset("policy")
    shipped = os.path.join(REPO, "policies")
    for name in ("default.json", "privileged.json", "organizations.json"):
        shutil.copy(os.path.join(shipped, name), os.path.join(d, "shipped-" + name))
    for sub in ("bad", "lint"):
        src = os.path.join(REPO, "tests", "policies", sub)
        for name in sorted(os.listdir(src)):
            if name.endswith(".json"):
                shutil.copy(os.path.join(src, name), os.path.join(d, "%s-%s" % (sub, name)))
    write(d, "inline-seccomp.json", json.dumps({
        "version": 1, "description": "inline profile",
        "limits": {"memory": "256MiB", "wall_timeout": "1.5s", "pids": 32, "cpus": 0.5},
        "filesystem": {"venv": None, "binds": [{"source": "/srv/tools/data", "target": "/data", "optional": True}]},
        "environment": {"set": {"LANG": "C.UTF-8"}, "allow": ["TOOL_*", "API_KEY"]},
        "seccomp": {"inline": {
            "defaultAction": "SCMP_ACT_ERRNO", "defaultErrnoRet": 1, "architectures": ["SCMP_ARCH_X86"],
            "syscalls": [
                {"names": ["read", "write", "exit", "exit_group", "execve", "brk", "mmap"], "action": "SCMP_ACT_ALLOW"},
                {"names": ["socket"], "action": "SCMP_ACT_ALLOW",
                 "args": [{"index": 0, "value": 1, "op": "SCMP_CMP_EQ"}]},
                {"names": ["personality"], "action": "SCMP_ACT_ALLOW",
                 "args": [{"index": 0, "value": 4294967295, "valueTwo": 8, "op": "SCMP_CMP_MASKED_EQ"}],
                 "includes": {"arches": ["amd64"], "minKernel": "4.8"}},
                {"names": ["ptrace"], "action": "SCMP_ACT_ERRNO", "errnoRet": 38},
            ]}},
        "user": {"uid": 1000, "gid": 1000}, "hostname": "tool-box",
    }, indent=2))
    write(d, "include-default.json", '{\n  // starts from the shipped default\n  "version": 1,\n'
                                     '  "include": "default.json",\n  "limits": { "pids": 16 }\n}\n')
    write(d, "profile-file.json", '{ "version": 1, "seccomp": { "profile": "seccomp/default.json" } }\n')
    write(d, "organizations-full.json", json.dumps({
        "version": 1, "default": {"privileged": False, "policy": "default", "allowed_policies": ["default"]},
        "organizations": {ORG: {"privileged": True, "policy": "privileged", "allowed_policies": ["default"]}}}))


def letta_legacy():
    d = reset("letta_legacy")
    payload = json.dumps({"results": 5, "agent_state": None}).encode()
    write(d, "frame.txt", b"adding 2 3\n" + legacy_frame(payload))
    write(d, "frame-text-after.txt", b"before\n" + legacy_frame(payload) + b"after\n")
    write(d, "end-before-start.txt", b"x" + LEGACY_END + b"y" + legacy_frame(payload))
    write(d, "nan.txt", legacy_frame(b'{"results": [NaN, Infinity, -Infinity, "\\ud800"]}'))
    write(d, "bad-base64.txt", LEGACY_START + b"not*base64" + LEGACY_END)
    write(d, "padding-after-quad.txt", LEGACY_START + b"QUFB=" + LEGACY_END)
    write(d, "empty-payload.txt", LEGACY_START + LEGACY_END)
    write(d, "no-end.txt", LEGACY_START + base64.b64encode(payload))
    write(d, "pickle.txt", legacy_frame(b"\x80\x04\x95\x10\x00\x00\x00\x00\x00\x00\x00}\x94\x8c\x07results\x94K\x05s."))
    write(d, "invalid-utf8.txt", b"\xff\xfe bad\n" + legacy_frame(payload))
    write(d, "both-framings.txt", binary_frame(payload) + legacy_frame(payload))
    write(d, "stderr-like.txt", b'Traceback (most recent call last):\n  File "x", line 1\nZeroDivisionError: division by zero\n')
    # The reassembled form: prefix, payload, suffix (letta_legacy_fuzzer.cc).
    write(d, "split-object.bin", fdp_string(b"hello\n") + fdp_string(payload) + b"tail\n")
    write(d, "split-agent-state.bin", fdp_string(b"") + fdp_string(
        json.dumps({"results": {"a": [1, 2]}, "agent_state": {"id": "agent-1"}}).encode()) + b"")
    write(d, "split-nul-after-object.bin", fdp_string(b"") + fdp_string(b'{"results": 1}\x00junk') + b"")


def letta_binary():
    d = reset("letta_binary")
    payload = json.dumps({"results": 5, "agent_state": None}).encode()
    write(d, "frame.bin", b"adding 2 3\n" + binary_frame(payload))
    write(d, "frame-text-after.bin", b"before\n" + binary_frame(payload) + b"after\n")
    write(d, "bad-md5.bin", binary_frame(payload, md5="0" * 32))
    write(d, "truncated-header.bin", binary_frame(payload)[:30])
    write(d, "truncated-payload.bin", binary_frame(payload)[:-5])
    write(d, "length-too-big.bin", BINARY_MARKER + struct.pack(">I", 0xFFFFFFFF) + b"0" * 32 + payload)
    write(d, "empty-payload.bin", binary_frame(b""))
    write(d, "pickle.bin", binary_frame(b"\x80\x04\x95\x10\x00\x00\x00\x00\x00\x00\x00}\x94\x8c\x07results\x94K\x05s."))
    write(d, "not-json.bin", binary_frame(b"{results: 5}"))
    write(d, "two-frames.bin", binary_frame(payload) + binary_frame(b'{"results": 6}'))
    write(d, "legacy-first.bin", legacy_frame(payload) + binary_frame(payload))
    # The reassembled form: prefix, payload, suffix (letta_binary_fuzzer.cc).
    write(d, "split-object.bin", fdp_string(b"out\n") + fdp_string(payload) + b"")
    write(d, "split-array-results.bin", fdp_string(b"") + fdp_string(b'{"results": [1, "two", {"three": 3.0}]}') + b"x")
    # nlohmann takes a NUL for the end of its input; json.loads refuses it.
    write(d, "split-nul-after-object.bin", fdp_string(b"out\n") + fdp_string(b'{"results": 1}\x00junk') + b"")


def shape_result():
    d = reset("shape_result")
    # The fixed-size fields come from the end of the data (FuzzedDataProvider
    # takes integers and booleans from there), roughly: tool_mode, timeout,
    # fingerprint?, memory_limit, pids_limit, reason, exit_code, signal,
    # stage, errno, truncations, peak memory, with_frame. The strings come
    # from the front: tool name, error, stderr, stdout prefix, (frame
    # payload), the rest of stdout. Mutation fixes up what "roughly" misses.
    def tail(tool_mode, reason, exit_code, with_frame):
        fields = [bytes([tool_mode]), b"\x40" * 8, b"\x01", b"\x00\x00\x00\x20\x00\x00\x00\x00", b"\x40" + b"\x00" * 7,
                  bytes([reason]), bytes([exit_code + 1]), b"\x00", b"\x00", b"\x00", b"\x00", b"\x00", b"\x00" * 8,
                  bytes([with_frame])]
        return b"".join(reversed(fields))
    letta = json.dumps({"results": 5, "agent_state": None}).encode()
    ok = json.dumps({"results": {"sum": 5}, "agent_state": None}).encode()
    err = json.dumps({"results": None, "agent_state": None,
                      "error": {"kind": "tool", "name": "ZeroDivisionError", "message": "division by zero"}}).encode()
    stderr = b'Traceback (most recent call last):\nZeroDivisionError: division by zero\n'
    script = [("script-binary", binary_frame(letta), 0), ("script-legacy", legacy_frame(letta), 0),
              ("script-exit-1", b"no frame", 1), ("script-bad-md5", binary_frame(letta, md5="1" * 32), 0)]
    for name, stdout, code in script:
        write(d, name + ".bin", fdp_string(b"add") + fdp_string(b"") + fdp_string(stderr) + fdp_string(stdout)
              + tail(0, 0, code, 0))
    tool = [("tool-success", ok, 0), ("tool-error", err, 1), ("tool-not-json", b"{]", 0)]
    for name, payload, code in tool:
        write(d, name + ".bin", fdp_string(b"add") + fdp_string(b"") + fdp_string(b"") + fdp_string(b"printed\n")
              + fdp_string(payload) + b"after" + tail(1, 0, code, 1))
    forged = (b"\n<<TSB-RESULT-" + NONCE + b">>" + base64.b64encode(ok) + b"<<TSB-END-" + NONCE + b">>\n")
    write(d, "tool-two-frames.bin", fdp_string(b"add") + fdp_string(b"") + fdp_string(b"") + fdp_string(forged)
          + fdp_string(ok) + b"" + tail(1, 0, 0, 1))
    for reason in range(9):
        write(d, "reason-%d.bin" % reason, fdp_string(b"slow") + fdp_string(b"mount failed") + fdp_string(stderr)
              + fdp_string(b"partial") + tail(reason % 2, reason, 137 if reason else 0, 0))


# The spawner's closed formats, little-endian (daemon/wire/wire.h).
def u8(v): return struct.pack("<B", v)
def u32(v): return struct.pack("<I", v)
def u64(v): return struct.pack("<Q", v)
def wstr(b): return u32(len(b)) + b
def wmap(m): return u32(len(m)) + b"".join(wstr(k) + wstr(v) for k, v in sorted(m.items()))
def wstrs(v): return u32(len(v)) + b"".join(wstr(x) for x in v)


def run_order(id_, policy, fp, mode, env, timeout_ms, venv=b"", warm=0, node_modules=b""):
    return (u8(2) + u64(id_) + wstr(policy) + wstr(fp) + u8(mode) + wmap(env) + u64(timeout_ms) + wstr(venv) + u8(warm)
            + wstr(node_modules))


def program(name, insns):
    # a sock_filter array as the kernel takes it: u16 code, u8 jt, u8 jf, u32 k (`name` only says which)
    return wstr(b"".join(struct.pack("<HBBI", c, jt, jf, k) for c, jt, jf, k in insns))


def fs_row(kind, stage, path, source=b"", data=b"", size=0, inodes=0, mode=0o755, flags=0):
    # isolate/engine/fs.h: FsEntry::Kind, isolate/engine/stage.h: Stage; flags 1 tool_owned, 2 noexec, 4 optional, 8 keyed
    return u8(kind) + u8(stage) + u8(flags) + wstr(path) + wstr(source) + wstr(data) + u64(size) + u32(inodes) + u32(mode)


def fs_table(runner):
    rows = [fs_row(0, 5, b"/", size=1 << 20, inodes=4096),                      # kRoot, mount-root
            fs_row(1, 7, b"/usr"),                                               # kSystem, mount-bind
            fs_row(9, 6, b"/etc/hostname", data=b"sandbox\n", mode=0o644),       # kFile, mount-skeleton
            fs_row(2, 7, b"/venv", b"/var/lib/toolsandbox/venv", b"/var/cache/toolsandbox/venvs", flags=8),  # kHost, keyed
            fs_row(4, 8, b"/tmp", size=64 << 20, inodes=16384, mode=0o1777, flags=2),  # kTmpfs, mount-tmpfs
            fs_row(3, 7, b"/data", b"/srv/data", flags=4),                        # kBind, optional
            fs_row(11, 9, b"/proc", mode=0o555),                                  # kProc, mount-proc
            fs_row(12, 10, b"/proc/kcore", b"/.masked"),                          # kMask, mask-proc
            fs_row(5, 11, b"/dev", size=64 << 10, inodes=64, flags=2),           # kDev, mount-dev
            fs_row(6, 11, b"/dev/null", b"/dev/null")]                            # kDevNode
    if runner:
        rows.append(fs_row(2, 7, b"/opt/toolsandbox/runner/toolsandbox_runner.py", runner))
    return u32(len(rows)) + b"".join(rows)


def compiled_set():
    allow = [(0x06, 0, 0, 0x7fff0000)]  # BPF_RET | BPF_K, SECCOMP_RET_ALLOW
    limits = u64(512 << 20) + u64(64) + u32(1000) + u64(60000) + u64(60000) + b"".join(u64(64 << 20) for _ in range(3)) \
        + u64(256) + u64(1 << 20) + u64(1 << 20)
    runner = b"/usr/share/toolsandbox/runner/toolsandbox_runner.py"
    policy = (wstr(b"default") + wstr(b"sha256:" + b"ab" * 32) + u8(1) + limits + wstr(b"/work") + wstr(b"sandbox")
              + u8(0) + wmap({b"PATH": b"/venv/bin:/usr/bin", b"HOME": b"/work"}) + wstrs([b"LETTA_*", b"TZ"])
              + program(b"seccomp/default.json", allow) + u32(1000) + u32(1000)
              + wstrs([b"/venv/bin/python3", b"-c", b"pass"]) + wstrs([b"/venv/bin/python3", b"-c", b"pooled"])
              + u8(1) + fs_table(runner)
              + wstrs([b"/venv/bin/python3", b"-I", b"/opt/toolsandbox/runner/toolsandbox_runner.py"])
              + wstrs([b"/venv/bin/python3", b"-I", b"-c", b"run_pooled()"]) + u8(0) + fs_table(runner)
              + u8(4) + u8(1) + u64(300000))  # warm_pool: max, min, idle
    placement = (u8(1) + wstr(b"/toolsandbox") + u32(2) + wstr(b"memory") + wstr(b"/sys/fs/cgroup/memory/toolsandbox")
                 + wstr(b"pids") + wstr(b"/sys/fs/cgroup/pids/toolsandbox")
                 + wstrs([b"/sys/fs/cgroup/memory/toolsandbox", b"/sys/fs/cgroup/pids/toolsandbox"]) + wstr(b"") + wstrs([]))
    return (b"TSBSET4\n" + placement + wstr(b"/run/toolsandbox") + u32(1 << 30) + u32(1024)
            + wstr(b"/usr/libexec/toolsandbox/toolsandbox-init") + wstr(b"run") + wstrs([b"run.4242.00c0ffee-7"]) + u8(1) + u8(1) + u32(1000)
            + program(b"<sandbox init filter>", allow)
            + wstr(b"/run/toolsandboxd/toolsandboxd.sock") + u32(0o660) + u32(995) + wstr(b"toolsandboxd") + u32(999)
            + u32(995) + wstr(b"") + u32(8) + u64(30000) + u32(1) + policy)


def spawn_wire():
    d = reset("spawn_wire")
    fp = b"sha256:" + b"ab" * 32
    good = run_order(1, b"default", fp, 0, {}, 60000)
    write(d, "run-script.bin", b"\x01" + good)
    write(d, "run-tool-env.bin", b"\x01" + run_order(7, b"default", fp, 1, {b"LETTA_AGENT_ID": b"agent-1", b"TZ": b"UTC"},
                                                     1500))
    write(d, "run-duplicate-env.bin", b"\x01" + u8(2) + u64(3) + wstr(b"default") + wstr(fp) + u8(0) + u32(2)
          + wstr(b"A") + wstr(b"1") + wstr(b"A") + wstr(b"2") + u64(1000) + wstr(b"") + u8(0) + wstr(b""))
    write(d, "run-venv.bin", b"\x01" + run_order(8, b"default", fp, 1, {}, 1500, b"0123456789abcdef" * 4, warm=1))
    write(d, "run-node-modules.bin", b"\x01" + run_order(10, b"default", fp, 1, {}, 1500, node_modules=b"fedcba9876543210" * 4))
    write(d, "run-bad-warm.bin", b"\x01" + run_order(9, b"default", fp, 1, {}, 1500, warm=2))
    write(d, "pools.bin", b"\x01" + u8(9))
    write(d, "run-truncated.bin", b"\x01" + good[:-2])
    write(d, "run-trailing.bin", b"\x01" + good + b"junk")
    write(d, "run-bad-mode.bin", b"\x01" + run_order(1, b"default", fp, 9, {}, 1))
    write(d, "run-huge-length.bin", b"\x01" + u8(2) + u64(1) + u32(0x7fffffff) + b"default")
    write(d, "kill.bin", b"\x01" + u8(6) + u64(1))
    write(d, "kill-trailing.bin", b"\x01" + u8(6) + u64(1) + u8(5))
    write(d, "notify.bin", b"\x01" + u8(8) + wstr(b"accepting requests"))
    write(d, "unknown-type.bin", b"\x01" + u8(99) + b"x")
    s = compiled_set()
    write(d, "set.bin", b"\x00" + s)
    write(d, "set-truncated.bin", b"\x00" + s[:-5])
    write(d, "set-empty-program.bin", b"\x00" + s.replace(program(b"seccomp/default.json", [(0x06, 0, 0, 0x7fff0000)]),
                                                           program(b"seccomp/default.json", [])))
    write(d, "set-bad-magic.bin", b"\x00" + b"TSBSET1\n" + s[8:])
    write(d, "set-table-without-root.bin", b"\x00" + s.replace(fs_row(0, 5, b"/", size=1 << 20, inodes=4096),
                                                                fs_row(7, 5, b"/", size=1 << 20, inodes=4096)))


# --- venv archives (daemon/venv/archive.h), big-endian ------------------------

def builder_module():
    path = os.path.join(REPO, "isolate", "runner", "toolsandbox_venv_builder.py")
    spec = importlib.util.spec_from_file_location("toolsandbox_venv_builder", path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def vrec(kind, path, mode, payload):
    p = path.encode() if isinstance(path, str) else path
    return kind + struct.pack(">H", len(p)) + p + struct.pack(">HQ", mode, len(payload)) + payload


VMAGIC = b"TSBVENV1"
VEND = vrec(b"e", "", 0, b"")
BUILDER_MANIFEST = {"freeze": ["numpy==1.26.4", "pip==23.0.1", "caf\u00e9==1.0"], "python": "3.11.2",
                    "requirements": ["numpy==1.26.4"]}


def venv_archive():
    d = reset("venv_archive")
    builder = builder_module()
    # The builder's own writer on a small venv-like tree (fixed contents,
    # modes and times, so the seeds do not change between runs).
    with tempfile.TemporaryDirectory() as root:
        def put(path, data, mode=0o644):
            full = os.path.join(root, path)
            os.makedirs(os.path.dirname(full), exist_ok=True)
            with open(full, "wb") as f:
                f.write(data)
            os.chmod(full, mode)
        put("bin/activate", b"# activate\n")
        put("bin/tool", b"#!/venv/bin/python3\nprint(1)\n", 0o755)
        put("bin/python3", b"left out: the daemon's to write")
        put("pyvenv.cfg", b"home = /elsewhere\n")
        put("lib/python3.11/site-packages/pkg/__init__.py", b"X = 1\n")
        put("lib/python3.11/site-packages/pkg-1.0.dist-info/METADATA", b"Name: pkg\nVersion: 1.0\n")
        os.symlink("pkg/__init__.py", os.path.join(root, "lib/python3.11/site-packages/alias.py"))
        os.symlink("lib", os.path.join(root, "lib64"))
        out = io.BytesIO()
        builder.write_archive(root, out, BUILDER_MANIFEST)
        good = out.getvalue()
        out = io.BytesIO()
        builder.write_archive(root, out, {})
        empty_manifest = out.getvalue()
    for cut, name in ((255, "builder"), (0, "builder-bytewise"), (6, "builder-cut-7")):
        write(d, name + ".bin", bytes([cut]) + good)
    write(d, "builder-empty-manifest.bin", b"\xff" + empty_manifest)
    manifest = vrec(b"m", "", 0, json.dumps(BUILDER_MANIFEST, sort_keys=True).encode())
    hostile = {
        "no-manifest": vrec(b"d", "lib", 0o755, b""),
        "dotdot": vrec(b"f", "../escape", 0o644, b"x"),
        "absolute": vrec(b"f", "/etc/passwd", 0o644, b"x"),
        "empty-component": vrec(b"d", "lib", 0o755, b"") + vrec(b"f", "lib//x", 0o644, b"x"),
        "nul-in-path": vrec(b"f", b"a\0b", 0o644, b"x"),
        "reserved-python": vrec(b"d", "bin", 0o755, b"") + vrec(b"l", "bin/python3", 0, b"/bin/sh"),
        "reserved-pth": vrec(b"d", "bin", 0o755, b"") + vrec(b"f", "bin/x._pth", 0o644, b"/tmp"),
        "reserved-cfg": vrec(b"f", "pyvenv.cfg", 0o644, b"home = /tmp\n"),
        "twice": vrec(b"f", "a", 0o644, b"1") + vrec(b"f", "a", 0o644, b"2"),
        "dir-over-file": vrec(b"f", "a", 0o644, b"1") + vrec(b"d", "a", 0o755, b""),
        "through-link": vrec(b"l", "up", 0, b"..") + vrec(b"f", "up/x", 0o644, b"x"),
        "link-to-root": vrec(b"l", "lib", 0, b"/") + vrec(b"f", "lib/x", 0o644, b"x"),
        "bin-is-a-file": vrec(b"f", "bin", 0o755, b"#!"),
        "bin-is-a-link": vrec(b"l", "bin", 0, b"/usr/bin"),
        "setuid": vrec(b"f", "s", 0o4755, b"x") + vrec(b"d", "d", 0o7777, b""),
        "second-manifest": manifest,
        "manifest-with-path": vrec(b"m", "m", 0, b"{}"),
        "deep-path": b"".join(vrec(b"d", "/".join(["d"] * i), 0o755, b"") for i in range(1, 67)),
        "long-link": vrec(b"l", "l", 0, b"x" * 4097),
        "empty-link": vrec(b"l", "l", 0, b""),
        "dir-with-content": vrec(b"d", "d", 0o755, b"x"),
        "unknown-kind": vrec(b"z", "z", 0, b""),
        "many-entries": b"".join(vrec(b"d", "d%d" % i, 0o755, b"") for i in range(300)),
        "big-file": vrec(b"f", "big", 0o644, b"x" * 20000),
        "deep-manifest": vrec(b"m", "", 0, b'{"freeze": [["x"]]}'),
        "invalid-utf8-manifest": vrec(b"m", "", 0, b'{"python": "3.11\xff"}'),
        "array-manifest": vrec(b"m", "", 0, b"[]"),
    }
    for name, body in hostile.items():
        if name == "second-manifest":
            write(d, name + ".bin", b"\xff" + VMAGIC + manifest + body + VEND)
        elif name.endswith("-manifest") or name == "manifest-with-path":
            write(d, name + ".bin", b"\xff" + VMAGIC + body + VEND)
        else:
            write(d, name + ".bin", b"\xff" + VMAGIC + manifest + body + VEND)
    write(d, "truncated.bin", b"\x03" + good[:len(good) // 2])
    write(d, "after-end.bin", b"\xff" + good + b"x")
    write(d, "bad-magic.bin", b"\xff" + b"TSBVENV2" + good[8:])
    write(d, "huge-size.bin", b"\xff" + VMAGIC + manifest + b"f" + struct.pack(">H", 1) + b"f"
          + struct.pack(">HQ", 0o644, 0xFFFFFFFFFFFFFFFF) + b"x" + VEND)


def venv_manifest():
    d = reset("venv_manifest")
    write(d, "builder.json", json.dumps(BUILDER_MANIFEST, sort_keys=True))
    write(d, "builder-empty.json", "{}")
    write(d, "stored.json", json.dumps({
        "bytes": 123456, "entries": 12, "files_bytes": 74304, "freeze": BUILDER_MANIFEST["freeze"], "key": "a" * 64,
        "python": "3.11.2", "requirements": ["numpy==1.26.4"], "policy": "default",
        "policy_fingerprint": "sha256:" + "ab" * 32, "index_settings": "wheels=/srv/wheels", "interpreter": "x",
        "build_ms": 1234.5, "build_run_id": "run-1", "built_at": 1700000000,
        "log_tail": "Successfully installed numpy-1.26.4\n\ufffd"}, indent=2))
    write(d, "too-deep.json", '{"freeze": [["numpy"]]}')
    write(d, "too-many.json", '{"freeze": [' + ",".join(['"x"'] * 10400) + "]}")
    write(d, "too-long.json", '{"freeze": ["' + "x" * 4097 + '"]}')
    write(d, "escaped-too-long.json", '{"freeze": ["' + "\\u20ac" * 1366 + '"]}')
    write(d, "invalid-utf8.json", b'{"python": "3.11\xff"}')
    write(d, "encoded-surrogate.json", b'{"python": "\xed\xa0\x80"}')
    write(d, "lone-surrogate.json", '{"python": "\\ud800"}')
    write(d, "duplicate.json", '{"python": "3.11", "python": "9"}')
    write(d, "nan.json", '{"freeze": [NaN, Infinity]}')
    write(d, "out-of-range.json", '{"python": 1e999, "x": -1e400}')
    write(d, "nul.json", b'{}\x00{"python": "x"}')
    write(d, "bom.json", b"\xef\xbb\xbf{}")
    write(d, "not-object.json", '["numpy"]')
    write(d, "wrong-shapes.json", '{"freeze": "numpy", "python": ["3"], "requirements": {"a": null}}')


if __name__ == "__main__":
    requests()
    policies()
    letta_legacy()
    letta_binary()
    shape_result()
    spawn_wire()
    venv_archive()
    venv_manifest()
    for t in sorted(os.listdir(CORPUS)):
        files = os.listdir(os.path.join(CORPUS, t))
        size = sum(os.path.getsize(os.path.join(CORPUS, t, f)) for f in files)
        print("%-14s %3d files, %6d bytes" % (t, len(files), size))
