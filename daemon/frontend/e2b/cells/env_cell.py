# The E2B backend's environment cell for script mode (daemon/frontend/e2b/e2b.cc):
# the tool's environment, as one base64 literal in place of @BLOB@, set in a
# fresh kernel before the script's own cell, and gone with that kernel.
# Embedded into the daemon at build time (daemon/cmake/embed_text.cmake).
def _tsb_env_cell(blob):
    import base64, json, os
    os.environ.update(json.loads(base64.b64decode(blob).decode("utf-8")))
_tsb_env_cell("@BLOB@")
del _tsb_env_cell
