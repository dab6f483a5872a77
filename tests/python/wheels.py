"""Small pure-Python wheels, written here as zip files (there is no package
index in the tests: they serve these from a local directory or a test
index of their own)."""

import base64
import hashlib
import os
import zipfile


def make_wheel(directory, name="tsbdemo", version="1.0", modules=None, requires=(), scripts=None):
    """Writes `name`-`version`-py3-none-any.whl into `directory` and returns
    its path. `modules`: {"pkg/__init__.py": "source"}, by default one
    package `name` whose VALUE names the wheel; `requires`: Requires-Dist
    lines (other wheels this one needs); `scripts`: {"name": "module:function"},
    console scripts pip makes in the venv's bin."""
    dist = name.replace("-", "_")
    if modules is None:
        modules = {dist + "/__init__.py": 'VALUE = "%s-from-the-test-index"\n' % name}
    info = "%s-%s.dist-info" % (dist, version)
    metadata = "Metadata-Version: 2.1\nName: %s\nVersion: %s\n" % (name, version)
    metadata += "".join("Requires-Dist: %s\n" % r for r in requires)
    files = {path: text.encode() for path, text in modules.items()}
    files[info + "/METADATA"] = metadata.encode()
    if scripts:
        files[info + "/entry_points.txt"] = ("[console_scripts]\n" + "".join(
            "%s = %s\n" % kv for kv in sorted(scripts.items()))).encode()
    files[info + "/WHEEL"] = b"Wheel-Version: 1.0\nGenerator: tsb-test\nRoot-Is-Purelib: true\nTag: py3-none-any\n"
    record = ""
    for path, data in files.items():
        digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
        record += "%s,sha256=%s,%d\n" % (path, digest, len(data))
    record += info + "/RECORD,,\n"
    path = os.path.join(directory, "%s-%s-py3-none-any.whl" % (dist, version))
    with zipfile.ZipFile(path, "w") as z:
        for p, data in files.items():
            z.writestr(p, data)
        z.writestr(info + "/RECORD", record)
    return path
