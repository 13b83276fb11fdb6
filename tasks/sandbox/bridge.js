'use strict';
/*
 * The JavaScript (Node) side of a sandbox check: the runner (the tests) and the solution process, joined only by
 * two pipes. The JavaScript twin of tasks/sandbox/harness.py + bridge.py (see docs/sandbox.md).
 *
 * Not loaded by evolforge's Python code: it runs INSIDE the sandbox. Warm workers (tasks/sandbox/worker.py) exec
 *
 *     node /evolforge/bridge.js runner NONCE_FD RESULT_FD BRIDGE_IN BRIDGE_OUT TEST_FILE
 *     node /evolforge/bridge.js serve BRIDGE_IN BRIDGE_OUT SOLUTION_FILE
 *
 * in the runner child and the solution child of a check (each already isolated, limited and dropped to its uid,
 * the solution in its own PID and network namespace); the rlimits-only mode runs it as `_evolforge_bridge.js`.
 *
 * runner: reads the run's nonce from NONCE_FD (a pipe the host filled and closed) and closes it; makes
 *   `require('./solution')` (also 'solution', './solution.js') answer with a proxy module: reading a name asks
 *   the solution process for it (a function becomes a stub that forwards calls; plain data comes back as a
 *   fresh copy); runs TEST_FILE (a script using node's assert) as a module; and when the process exits writes
 *   ONE final record, a JSON line with the nonce, to RESULT_FD: {runner: "script", completed, ended_by, lost,
 *   not_checkable}. `completed` is true only if the test file ran to its end and the process exits with status 0
 *   (an uncaught error or rejection in a callback exits 1). The host judges it (tasks/sandbox/verdict.py).
 * serve: loads SOLUTION_FILE as a CommonJS module, names reachable as its exports OR as its top-level
 *   declarations (a HumanEval-style `function f(...)` needs no export), says hello, then answers requests
 *   synchronously until the runner hangs up, and then waits to be killed (ending by itself fails the check).
 *   The event loop never turns in this process: timers and promises of the solution never run.
 *
 * Only plain data crosses, in this file's own tagged JSON codec, rebuilt by the receiver: null, booleans,
 * strings, numbers (NaN, +-Infinity and -0 included), undefined, BigInt, arrays, plain objects (own enumerable
 * string keys, defined as data properties: a "__proto__" key never sets a prototype), Map and Set. Anything else
 * a test passes (a function, a class instance, a Date) or the solution returns (a Promise, a class instance)
 * makes the run "not checkable" (sticky: the record carries it). Errors thrown by the solution come back as the
 * same builtin class (Error, TypeError, RangeError, ...) with the same name and message; a thrown plain value
 * comes back as that value. Arguments are copies: in-place changes the solution makes are not seen by the test.
 * The solution process has neither the nonce nor the result pipe; a broken frame, EOF or garbage from it makes
 * the channel "lost" (sticky), which fails the run.
 */

const fs = require('fs');
const path = require('path');

const MAX_FRAME = 64 << 20;
const MAX_DEPTH = 200;
const IDENT = /^[A-Za-z_$][\w$]*$/;
const ERRORS = { Error, TypeError, RangeError, SyntaxError, ReferenceError, EvalError, URIError };
// bound now: a careless test that patches JSON or fs cannot break the channel or the record
const stringify = JSON.stringify, parse = JSON.parse, writeSync = fs.writeSync, readSync = fs.readSync;
const closeSync = fs.closeSync, BufferFrom = Buffer.from, BufferAlloc = Buffer.alloc;
const getProto = Object.getPrototypeOf, defineProperty = Object.defineProperty, keysOf = Object.keys;
const isArray = Array.isArray, objectIs = Object.is, isFinite = Number.isFinite;

class NotCrossable extends Error {}

// ---------------------------------------------------------------- codec

function describe(v) {
  if (typeof v === 'function') return `a function (${v.name || 'anonymous'})`;
  if (typeof v === 'symbol') return 'a symbol';
  const proto = v === null ? null : getProto(v);
  const ctor = proto && proto.constructor && typeof proto.constructor.name === 'string' ? proto.constructor.name : '?';
  return `an object of class ${ctor}`;
}

function enc(v, depth = 0) {
  if (depth > MAX_DEPTH) throw new NotCrossable('a value nested too deep');
  switch (typeof v) {
    case 'string': case 'boolean': return v;
    case 'undefined': return { $: 'undefined' };
    case 'bigint': return { $: 'bigint', v: v.toString() };
    case 'number': return isFinite(v) && !objectIs(v, -0) ? v : { $: 'number', v: objectIs(v, -0) ? '-0' : String(v) };
    case 'object': break;
    default: throw new NotCrossable(describe(v));
  }
  if (v === null) return null;
  const proto = getProto(v);
  if (isArray(v) && proto === Array.prototype) {
    const out = new Array(v.length);
    for (let i = 0; i < v.length; i++) out[i] = enc(v[i], depth + 1);
    return out;
  }
  if (proto === Object.prototype || proto === null) {
    return { $: 'object', null: proto === null, v: keysOf(v).map((k) => [k, enc(v[k], depth + 1)]) };
  }
  if (proto === Map.prototype) return { $: 'map', v: [...v].map(([k, x]) => [enc(k, depth + 1), enc(x, depth + 1)]) };
  if (proto === Set.prototype) return { $: 'set', v: [...v].map((x) => enc(x, depth + 1)) };
  throw new NotCrossable(describe(v));
}

function dec(x, depth = 0) {
  if (depth > MAX_DEPTH) throw new Error('protocol: a value nested too deep');
  if (x === null || typeof x === 'string' || typeof x === 'boolean' || typeof x === 'number') return x;
  if (isArray(x)) return x.map((y) => dec(y, depth + 1));
  if (typeof x !== 'object') throw new Error('protocol: not a value');
  switch (x.$) {
    case 'undefined': return undefined;
    case 'bigint': return BigInt(x.v);
    case 'number': {
      const n = { NaN, Infinity, '-Infinity': -Infinity, '-0': -0 }[x.v];
      if (n === undefined) throw new Error('protocol: a bad number');
      return n;
    }
    case 'object': {
      const o = x.null ? Object.create(null) : {};
      for (const [k, y] of x.v) {
        if (typeof k !== 'string') throw new Error('protocol: a bad key');
        defineProperty(o, k, { value: dec(y, depth + 1), enumerable: true, writable: true, configurable: true });
      }
      return o;
    }
    case 'map': return new Map(x.v.map(([k, y]) => [dec(k, depth + 1), dec(y, depth + 1)]));
    case 'set': return new Set(x.v.map((y) => dec(y, depth + 1)));
    default: throw new Error('protocol: an unknown tag');
  }
}

// ---------------------------------------------------------------- frames: a 4-byte length, then UTF-8 JSON

const waitCell = new Int32Array(new SharedArrayBuffer(4));

function readExact(fd, n) {
  const buf = BufferAlloc(n);
  let off = 0;
  while (off < n) {
    let got;
    try {
      got = readSync(fd, buf, off, n - off, null);
    } catch (e) {
      if (e.code === 'EAGAIN') { Atomics.wait(waitCell, 0, 0, 1); continue; }
      if (e.code === 'EOF' || e.code === 'EBADF' || e.code === 'EPIPE') return null;
      throw e;
    }
    if (got === 0) return null;
    off += got;
  }
  return buf;
}

function readFrame(fd) {
  const head = readExact(fd, 4);
  if (head === null) return null;
  const n = head.readUInt32LE(0);
  if (n > MAX_FRAME) throw new Error('protocol: an oversized frame');
  const body = readExact(fd, n);
  if (body === null) return null;
  const msg = parse(body.toString('utf8'));
  if (msg === null || typeof msg !== 'object' || isArray(msg)) throw new Error('protocol: not a message');
  return msg;
}

function writeAll(fd, buf) {
  let off = 0;
  while (off < buf.length) {
    try {
      off += writeSync(fd, buf, off, buf.length - off);
    } catch (e) {
      if (e.code === 'EAGAIN') { Atomics.wait(waitCell, 0, 0, 1); continue; }
      throw e;
    }
  }
}

const hasOwn = Object.prototype.hasOwnProperty;
const callOwn = (o, k) => Reflect.apply(hasOwn, o, [k]);

// JSON text of a message without consulting toJSON (a solution may patch Object.prototype.toJSON in its own process)
function toText(v) {
  if (v === null || typeof v === 'number' || typeof v === 'boolean' || typeof v === 'string') return stringify(v);
  if (v === undefined) return 'null';
  if (isArray(v)) {
    const parts = [];
    for (let i = 0; i < v.length; i++) parts[i] = toText(v[i]);
    return '[' + parts.join(',') + ']';
  }
  const keys = keysOf(v), parts = [];
  for (let i = 0; i < keys.length; i++) {
    if (v[keys[i]] !== undefined) parts[parts.length] = stringify(keys[i]) + ':' + toText(v[keys[i]]);
  }
  return '{' + parts.join(',') + '}';
}

function writeFrame(fd, msg) {
  const body = BufferFrom(toText(msg), 'utf8');
  const head = BufferAlloc(4);
  head.writeUInt32LE(body.length, 0);
  writeAll(fd, Buffer.concat([head, body]));
}

// ---------------------------------------------------------------- the solution process

function errorRecord(e) {
  if (e instanceof Error || (e !== null && typeof e === 'object' && e.stack !== undefined)) {
    let base = 'Error';
    for (let p = e; p !== null; p = getProto(p)) {
      const c = Object.prototype.hasOwnProperty.call(p, 'constructor') ? p.constructor : null;
      if (c && Object.prototype.hasOwnProperty.call(ERRORS, c.name) && ERRORS[c.name] === c) { base = c.name; break; }
    }
    const str = (v) => { try { return String(v); } catch (_) { return '?'; } };
    return { error: { base, name: str(e.name), message: str(e.message), stack: str(e.stack).slice(0, 4000) } };
  }
  try {
    return { thrown: enc(e) };
  } catch (_) {
    return { error: { base: 'Error', name: 'Error', message: `the solution threw ${describe(e)}`, stack: '' } };
  }
}

function loadSolution(file) {
  const Module = require('module');
  const vm = require('vm');
  let src = fs.readFileSync(file, 'utf8');
  if (src.startsWith('#!')) src = '//' + src.slice(2);
  const wrapper = '(function (exports, require, module, __filename, __dirname) {' + src +
    '\n;return function (__evolforge_name) { return eval(__evolforge_name); };\n})';
  const m = new Module(file, null);
  m.filename = file;
  m.paths = Module._nodeModulePaths(path.dirname(file));
  const fn = vm.runInThisContext(wrapper, { filename: file });
  const lookup = fn.call(m.exports, m.exports, Module.createRequire(file), m, file, path.dirname(file));
  m.loaded = true;
  return { m, lookup };
}

// A frame to the runner; when the runner is gone (a test that never used the solution can end before its hello),
// wait to be killed as at EOF: a solution process that ends by itself is judged to have ended early.
function send(wfd, msg) {
  try {
    writeFrame(wfd, msg);
  } catch (e) {
    if (e.code === 'EPIPE' || e.code === 'EBADF') idle(wfd);
    throw e;
  }
}

function serve(rfd, wfd, file) {
  let loaded;
  try {
    loaded = loadSolution(file);
  } catch (e) {
    send(wfd, { import_error: errorRecord(e) });
    idle(wfd);
  }
  const { m, lookup } = loaded;
  const exportsOf = () => m.exports;
  const find = (name) => {
    const mod = exportsOf();
    if (mod !== null && (typeof mod === 'object' || typeof mod === 'function') && name in mod) {
      return { found: true, value: mod[name], self: mod };
    }
    if (IDENT.test(name)) {
      try {
        return { found: true, value: lookup(name), self: undefined };
      } catch (_) { /* not declared */ }
    }
    return { found: false };
  };
  const mod = exportsOf();
  const kind = typeof mod === 'function' ? 'function' : 'object';
  const keys = mod !== null && typeof mod === 'object' ? keysOf(mod) : [];
  send(wfd, { hello: true, kind, keys });
  for (;;) {
    let req;
    try {
      req = readFrame(rfd);
    } catch (_) {
      break;
    }
    if (req === null) break;
    let answer;
    try {
      if (req.op === 'get') {
        const got = find(String(req.name));
        if (!got.found) answer = { kind: 'missing' };
        else if (typeof got.value === 'function') answer = { kind: 'function' };
        else {
          try { answer = { kind: 'value', v: enc(got.value) }; } catch (e) { answer = { kind: 'opaque', what: e.message }; }
        }
      } else if (req.op === 'call') {
        const args = dec(req.args);
        let fn = exportsOf(), self;
        if (req.name !== null) {
          const got = find(String(req.name));
          fn = got.found ? got.value : undefined;
          self = got.self;
        }
        if (typeof fn !== 'function') throw new TypeError(`${req.name === null ? 'the module' : req.name} is not a function`);
        const result = Reflect.apply(fn, self, args);
        try { answer = { ok: enc(result) }; } catch (e) { answer = { opaque: e.message }; }
      } else {
        break;
      }
    } catch (e) {
      answer = errorRecord(e);
    }
    send(wfd, answer);
  }
  idle(wfd);
}

function idle(wfd) {
  try { closeSync(wfd); } catch (_) { /* already closed */ }
  for (;;) Atomics.wait(waitCell, 0, 0);  // wait to be killed: a solution process that ends by itself ended early
}

// ---------------------------------------------------------------- the runner

class NotCheckable extends Error {}
class SolutionLost extends Error {}

function runner(argv) {
  const [nonceFd, resultFd, bridgeIn, bridgeOut, testFile] = argv.map((a, i) => (i < 4 ? Number(a) : a));
  const chunks = [];
  for (;;) {
    const buf = BufferAlloc(256);
    const got = readSync(nonceFd, buf, 0, 256, null);
    if (got === 0) break;
    chunks.push(buf.subarray(0, got));
  }
  closeSync(nonceFd);
  const nonce = Buffer.concat(chunks).toString('ascii');
  if (!/^[0-9a-f]{16,128}$/.test(nonce)) {
    process.stderr.write('evolforge harness: no valid nonce on its descriptor\n');
    process.exit(2);
  }
  const state = { lost: null, notCheckable: null, ranToEnd: false, endedBy: null, emitted: false };

  const lose = (why) => { if (state.lost === null) state.lost = why; return new SolutionLost(why); };
  const unchecked = (why) => {
    if (state.notCheckable === null) state.notCheckable = why;
    return new NotCheckable(`not checkable: ${why}`);
  };
  const ask = (msg) => {
    if (state.lost !== null) throw new SolutionLost(state.lost);
    let answer;
    try {
      writeFrame(bridgeOut, msg);
      answer = readFrame(bridgeIn);
    } catch (e) {
      throw lose(`the channel to the solution process broke (${e.message})`);
    }
    if (answer === null) throw lose('the solution process ended or hung up');
    return answer;
  };
  const decoded = (x) => {
    try { return dec(x); } catch (e) { throw lose(`the solution process broke the protocol (${e.message})`); }
  };
  const raise = (answer) => {
    if (answer.opaque !== undefined) throw unchecked(`the solution returned ${answer.opaque}, not plain data`);
    if (answer.thrown !== undefined) throw decoded(answer.thrown);
    const err = answer.error;
    if (!err || typeof err !== 'object') throw lose('the solution process broke the protocol (a bad answer)');
    const Ctor = Object.prototype.hasOwnProperty.call(ERRORS, err.base) ? ERRORS[err.base] : Error;
    const e = new Ctor(String(err.message));
    if (String(err.name) !== e.name) defineProperty(e, 'name', { value: String(err.name), writable: true, configurable: true });
    e.solutionStack = String(err.stack);
    throw e;
  };
  const call = (name, args) => {
    let wire;
    try {
      wire = enc(args);
    } catch (e) {
      if (e instanceof NotCrossable) throw unchecked(`the test passes ${e.message} to the solution`);
      throw e;
    }
    const answer = ask({ op: 'call', name, args: wire });
    if (Object.prototype.hasOwnProperty.call(answer, 'ok')) return decoded(answer.ok);
    return raise(answer);
  };

  let hello = null, proxy = null;
  const stubs = new Map();
  const stub = (name) => {
    if (!stubs.has(name)) {
      const f = function (...args) {
        if (new.target) throw unchecked(`the test constructs ${name} of the solution (only functions cross)`);
        return call(name, args);
      };
      defineProperty(f, 'name', { value: name });
      stubs.set(name, f);
    }
    return stubs.get(name);
  };
  const get = (name) => {
    const answer = ask({ op: 'get', name });
    if (answer.kind === 'missing') return undefined;
    if (answer.kind === 'function') return stub(name);
    if (answer.kind === 'value') return decoded(answer.v);
    if (answer.kind === 'opaque') throw unchecked(`the solution's ${name} is ${answer.what}, not plain data or a function`);
    throw lose('the solution process broke the protocol (a bad answer)');
  };
  const solutionModule = () => {
    if (proxy !== null) return proxy;
    if (hello === null) {
      let first;
      try { first = readFrame(bridgeIn); } catch (e) { throw lose(`the solution process broke the protocol (${e.message})`); }
      if (first === null) throw lose('the solution process ended before it loaded');
      if (first.import_error !== undefined) { hello = first; } else if (first.hello === true) { hello = first; } else {
        throw lose('the solution process broke the protocol (no hello)');
      }
    }
    if (hello.import_error !== undefined) raise(hello.import_error);
    const keys = isArray(hello.keys) ? hello.keys.filter((k) => typeof k === 'string') : [];
    const target = hello.kind === 'function' ? () => {} : {};
    proxy = new Proxy(target, {
      get: (t, name) => (typeof name === 'string' ? get(name) : undefined),
      has: (t, name) => typeof name === 'string' && get(name) !== undefined,
      set: () => false,
      deleteProperty: () => false,
      defineProperty: () => false,
      ownKeys: (t) => [...new Set([...Reflect.ownKeys(t).filter((k) => !Reflect.getOwnPropertyDescriptor(t, k).configurable), ...keys])],
      getOwnPropertyDescriptor: (t, name) => {
        const own = Reflect.getOwnPropertyDescriptor(t, name);
        if (own && !own.configurable) return own;
        return typeof name === 'string' && keys.includes(name) ? { value: get(name), enumerable: true, writable: false, configurable: true } : undefined;
      },
      apply: (t, self, args) => call(null, args),
    });
    return proxy;
  };

  const Module = require('module');
  const load = Module._load;
  const isSolution = (request) => {
    if (typeof request !== 'string') return false;
    const r = request.replace(/^\.\//, '').replace(/^\/sandbox\//, '').replace(/\.js$/, '').replace(/\/$/, '');
    return r === 'solution';
  };
  Module._load = function (request, parent, isMain) {
    if (isSolution(request)) return solutionModule();
    return load.apply(this, arguments);
  };

  const emit = (code) => {
    if (state.emitted) return;
    state.emitted = true;
    const completed = state.ranToEnd && code === 0;
    const endedBy = completed ? null : (state.endedBy || `exit status ${code}`);
    const record = { nonce, kind: 'final', runner: 'script', completed, ended_by: endedBy, lost: state.lost,
      not_checkable: state.notCheckable };
    try { writeAll(resultFd, BufferFrom(toText(record) + '\n', 'utf8')); closeSync(resultFd); } catch (_) { /* gone */ }
  };
  process.on('exit', emit);
  try {
    require(path.resolve(testFile));
  } catch (e) {
    state.endedBy = e && typeof e === 'object' && typeof e.name === 'string' ? e.name : 'a thrown value';
    throw e;
  }
  state.ranToEnd = true;
}

const [role, ...rest] = process.argv.slice(2);
if (role === 'serve') serve(Number(rest[0]), Number(rest[1]), path.resolve(rest[2]));
else if (role === 'runner') runner(rest);
else { process.stderr.write('usage: bridge.js runner|serve ...\n'); process.exit(2); }
