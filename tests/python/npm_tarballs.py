"""Small npm tarballs for the tests, made here (no registry is ever reached):
package/package.json and package/index.js in a .tgz, as `npm pack` makes
them."""

import io
import json
import os
import tarfile


def make_tarball(directory, name, version, dependencies=None, scripts=None, files=None):
    """A tarball of package `name`@`version` in `directory`; its path."""
    pj = {"name": name, "version": version, "main": "index.js"}
    if dependencies:
        pj["dependencies"] = dependencies
    if scripts:
        pj["scripts"] = scripts
    content = dict(files or {})
    content["package.json"] = json.dumps(pj)
    content.setdefault("index.js", "module.exports = %s;\n" % json.dumps("%s@%s" % (name, version)))
    path = os.path.join(directory, "%s-%s.tgz" % (name.replace("@", "").replace("/", "-"), version))
    with tarfile.open(path, "w:gz") as t:
        for rel, text in sorted(content.items()):
            data = text.encode() if isinstance(text, str) else text
            info = tarfile.TarInfo("package/" + rel)
            info.size = len(data)
            info.mode = 0o644
            t.addfile(info, io.BytesIO(data))
    os.chmod(path, 0o644)
    return path
