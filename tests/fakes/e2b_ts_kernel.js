// The fake E2B service's TypeScript kernel (tests/fakes/e2b_fake.py): one
// Node process per "typescript" context, behaving as E2B's kernel does
// (e2b-dev/ijavascript: lib/babel.js, Babel's preset-typescript +
// modules-commonjs + ijavascript-babel's topLevelAwait; e2b-dev/nel:
// lib/server/context.js):
//   - types are stripped and imports become require() calls (here by
//     Debian's node-typescript, transpileModule);
//   - a cell with a top-level await is rewritten as ijavascript-babel's
//     topLevelAwait does: the statements before the first await stay, the
//     rest runs in an async arrow function whose last expression (unless an
//     assignment) is returned, its variable and class declarations hoisted as
//     `let` so later cells see them;
//   - every cell runs with vm.runInThisContext in one global scope; its value
//     (a promise: what it resolves to) is util.inspect()ed as nel's default
//     mimer does;
//   - what the cell writes to process.stdout / process.stderr (console
//     included) comes back as stream chunks; an error as nel's formatError
//     gives it (name, message, stack lines), the lines joined with "" as the
//     code interpreter server joins a Jupyter traceback.
// Protocol with the fake: cells as JSON lines {"code"} on stdin; messages as
// JSON lines on fd $TSB_KERNEL_FD (3 unless set): {"type": "stdout"|"stderr", "text"}, {"type":
// "result", "text"}, {"type": "error", "name", "value", "traceback"}, then
// {"type": "done"}.
'use strict';

const fs = require('fs');
const path = require('path');
const util = require('util');
const vm = require('vm');
const Module = require('module');
const ts = require(process.env.TSB_FAKE_TYPESCRIPT || '/usr/share/nodejs/typescript');

const MESSAGES = Number(process.env.TSB_KERNEL_FD || 3);
function send(m) {
  fs.writeSync(MESSAGES, JSON.stringify(m) + '\n');
}

function capture(stream, type) {
  stream.write = function write(chunk, encoding, cb) {
    send({ type, text: typeof chunk === 'string' ? chunk : Buffer.from(chunk).toString('utf8') });
    const done = typeof encoding === 'function' ? encoding : cb;
    if (typeof done === 'function') process.nextTick(done);
    return true;
  };
}
capture(process.stdout, 'stdout');
capture(process.stderr, 'stderr');
globalThis.console = new console.Console(process.stdout, process.stderr);
// Modules resolve from the kernel's working directory (where `npm install`
// put them), as in E2B's sandbox.
globalThis.require = Module.createRequire(path.join(process.cwd(), 'index.js'));
globalThis.module = { exports: {} };
globalThis.exports = globalThis.module.exports;

function containsTopLevelAwait(node) {
  if (ts.isFunctionLike(node)) return false;
  if (node.kind === ts.SyntaxKind.AwaitExpression) return true;
  if (ts.isForOfStatement(node) && node.awaitModifier) return true;
  return ts.forEachChild(node, containsTopLevelAwait) === true;
}

function bindingNames(name, out) {
  if (ts.isIdentifier(name)) out.push(name.text);
  else for (const el of name.elements) if (!ts.isOmittedExpression(el)) bindingNames(el.name, out);
}

function topLevelAwait(js) {
  const sf = ts.createSourceFile('cell.js', js, ts.ScriptTarget.ES2022, true, ts.ScriptKind.JS);
  const stmts = sf.statements;
  const first = stmts.findIndex(containsTopLevelAwait);
  if (first < 0) return js;
  const text = (n) => js.slice(n.getStart(sf), n.end);
  const hoisted = [];
  const body = [];
  for (const s of stmts.slice(first)) {
    if (ts.isVariableStatement(s)) {
      for (const d of s.declarationList.declarations) {
        bindingNames(d.name, hoisted);
        const assign = text(d.name) + ' = ' + (d.initializer ? text(d.initializer) : 'undefined');
        body.push(ts.isIdentifier(d.name) ? assign + ';' : '(' + assign + ');');
      }
    } else if (ts.isClassDeclaration(s) && s.name) {
      hoisted.push(s.name.text);
      body.push(s.name.text + ' = ' + text(s) + ';');
    } else {
      body.push(text(s));
    }
  }
  const last = stmts[stmts.length - 1];
  if (ts.isExpressionStatement(last) &&
      !(ts.isBinaryExpression(last.expression) && last.expression.operatorToken.kind === ts.SyntaxKind.EqualsToken)) {
    body[body.length - 1] = 'return (' + text(last.expression) + ');';
  }
  return js.slice(0, stmts[first].getFullStart()) + '\n' +
         (hoisted.length ? 'let ' + hoisted.join(', ') + ';\n' : '') +
         '(async () => {\n' + body.join('\n') + '\n})()';
}

function transform(code) {
  const r = ts.transpileModule(code, {
    compilerOptions: {
      module: ts.ModuleKind.CommonJS,
      target: ts.ScriptTarget.ES2022,
      esModuleInterop: true,
      importsNotUsedAsValues: ts.ImportsNotUsedAsValues.Preserve,
      isolatedModules: true,
      noImplicitUseStrict: true,
      alwaysStrict: false,
    },
    fileName: 'index.ts',
    reportDiagnostics: true,
  });
  const errors = (r.diagnostics || []).filter((d) => d.category === ts.DiagnosticCategory.Error);
  if (errors.length) throw new SyntaxError(ts.flattenDiagnosticMessageText(errors[0].messageText, '\n'));
  return topLevelAwait(r.outputText);
}

function formatError(error) {
  return {
    type: 'error',
    name: error && error.name ? error.name : typeof error,
    value: error && error.message ? error.message : util.inspect(error),
    traceback: (error && error.stack ? String(error.stack).split('\n') : []).join(''),
  };
}

async function runCell(code) {
  try {
    let value = vm.runInThisContext(transform(code), { filename: 'evalmachine.<anonymous>' });
    if (value instanceof Promise) value = await value;
    send({ type: 'result', text: util.inspect(value) });
  } catch (e) {
    send(formatError(e));
  }
  send({ type: 'done' });
}

process.on('unhandledRejection', () => {});
let pending = '';
let queue = Promise.resolve();
process.stdin.setEncoding('utf8');
process.stdin.on('data', (d) => {
  pending += d;
  for (let nl; (nl = pending.indexOf('\n')) >= 0;) {
    const line = pending.slice(0, nl);
    pending = pending.slice(nl + 1);
    if (line) queue = queue.then(() => runCell(JSON.parse(line).code));
  }
});
process.stdin.on('end', () => process.exit(0));
