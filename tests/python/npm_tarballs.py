"""Small npm tarballs for the tests, made here (no registry is ever reached):
package/package.json and package/index.js in a .tgz, as `npm pack` makes
them."""

import io
import json
import os
import tarfile


def make_tarball(directory, name, version, dependencies=None, scripts=None, files=None, package_json=None):
    """A tarball of package `name`@`version` in `directory`; its path.
    `package_json`: more fields of its package.json ("bin", say)."""
    pj = {"name": name, "version": version, "main": "index.js"}
    pj.update(package_json or {})
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


def pack_installed(node_modules, directory):
    """Every package installed under `node_modules` (scoped ones and nested
    node_modules too) packed into `directory` as `npm pack` would (its
    files under package/, without its own node_modules), so that a build
    from `directory` alone installs the same tree offline. Their number."""
    count = 0
    for top, dirs, _ in os.walk(node_modules):
        if os.path.basename(top) != "node_modules":
            continue
        for d in sorted(dirs):
            for pkg in ([os.path.join(top, d, s) for s in sorted(os.listdir(os.path.join(top, d)))]
                        if d.startswith("@") else [os.path.join(top, d)]):
                pj = os.path.join(pkg, "package.json")
                if d.startswith(".") or not os.path.isfile(pj):
                    continue
                with open(pj) as f:
                    meta = json.load(f)
                out = os.path.join(directory, "%s-%s.tgz" % (meta["name"].replace("@", "").replace("/", "-"),
                                                             meta["version"]))
                if os.path.exists(out):
                    continue
                with tarfile.open(out, "w:gz") as t:
                    t.add(pkg, "package", filter=lambda i: None if "/node_modules" in i.name else i)
                os.chmod(out, 0o644)
                count += 1
    return count
