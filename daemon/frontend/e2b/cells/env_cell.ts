// The E2B backend's environment cell for TypeScript (daemon/frontend/e2b/e2b.cc):
// the tool's environment, as one base64 literal in place of @BLOB@, set in a
// fresh TypeScript kernel context before the script's (or the tool's) own
// cells, and gone with that context. Its value is undefined, so the kernel
// echoes nothing of it. Embedded at build time (daemon/cmake/embed_text.cmake).
void Object.assign(process.env, JSON.parse(Buffer.from("@BLOB@", "base64").toString("utf8")));
