"""The narrow channel between the runner process (the tests) and the solution process (the code under test).

Not imported by evolforge's own code at run time: it is loaded INSIDE the sandbox by both processes of a check
(tasks/sandbox/worker.py preloads it; the per-run modes write it beside the harness as `_evolforge_bridge.py`).
Stdlib only. The host imports it only for unit tests of the codec.

    runner:   install_solution_importer(endpoint)   `import solution` / `from solution import *` give proxies
    solution: serve(in_fd, out_fd, path)            imports solution.py, answers calls until killed

Two pipes connect the processes (runner -> solution, solution -> runner); nothing else does: the solution has
no descriptor of the runner's result channel, another uid and PID namespace (bwrap modes), and the runner never
imports, reads or execs the solution's code. Every frame is a 4-byte length and one value of this module's own
strict codec (never pickle or marshal): None, bool, int, float, complex, str, bytes, range and lists, tuples,
dicts, sets and frozensets of them, rebuilt by the receiver as exactly those builtin types; instances of their
subclasses (namedtuple, Counter, an IntEnum, numpy.float64, ...) are sent as their base type's value, read by the
base type's own methods. Anything else is a HANDLE: the receiver gets a proxy, and calls, attribute access,
iteration, len, bool, indexing, str and repr on it are forwarded to the owner. On the runner's side a handle is
never compared by the solution's code: `==`, `!=`, `<`, ... on a handle (other than `h == h`) raise NotCheckable,
which fails the run whatever the test does with the exception. Modules the solution passes (`import math` in a
prompt the tests rely on) are rebuilt as the runner's own module of that name (stdlib and already loaded ones).

Calls the runner makes carry their arguments by value; lists, dicts and sets among them that the solution
changed in place are copied back into the runner's objects when the call returns. Callables and objects the
TEST defines (functions, lambdas, classes, their instances and bound methods) cross to the solution as handles
it can call back; stdlib and builtin functions, classes and modules cross by name (the solution gets its own).
Anything else a test passes (a generator, a file, a mock, ...) raises NotCheckable: the run is "not checkable",
never passed. The runner's side of a callback is validated: only objects the test itself defined, only public
attribute names, a fixed set of operations.

Exceptions raised in the solution are re-raised in the runner as the same builtin exception type with the same
arguments (so the same message), the solution's traceback attached as a note; an exception class the solution
defines becomes a runner-side class of the same name deriving from the same builtin base, so pytest.raises(
solution.MyError) and pytest.raises(ValueError) both match it. What the solution prints through sys.stdout /
sys.stderr during a call is written to the runner's (so capsys sees it).

SolutionLost (the solution process ended, hung up or broke the protocol) and NotCheckable are sticky: once
raised, the endpoint records why and the runner's final record carries it, so catching the exception in a test
does not rescue the run.
"""

import builtins
import importlib
import io
import os
import struct
import sys
import threading
import traceback
import types
from builtins import (  # bound here: a solution that patches builtins does not break its own side of the channel
    bytes,
    callable,
    complex,
    dict,
    frozenset,
    getattr,
    hasattr,
    isinstance,
    issubclass,
    iter,
    len,
    list,
    next,
    object,
    range,
    set,
    setattr,
    str,
    tuple,
    type,
)

MAX_FRAME = 256 << 20  # one message (a value and its framing); larger: protocol error
MAX_DEPTH = 200  # nesting of containers in one value
MAX_FORWARDED_OUTPUT = 8 << 20  # what the solution may print through the channel in one check
MAX_NESTED_CALLS = 200  # runner -> solution -> runner -> ... call depth
MAX_NAME = 200
SOLUTION_MODULE = "solution"
_NOTE_LIMIT = 4000

_read, _write = os.read, os.write  # bound at load: a test patching os cannot break the channel
_Q, _I, _D, _DD = struct.Struct("<q"), struct.Struct("<I"), struct.Struct("<d"), struct.Struct("<dd")
_QQQ = struct.Struct("<qqq")
_MIN_Q, _MAX_Q = -(1 << 63), (1 << 63) - 1
_FORBIDDEN_EXC = (SystemExit, KeyboardInterrupt, GeneratorExit)
_NO_IMPORT = frozenset({"antigravity", "this", "idlelib", "tkinter", "turtle", "turtledemo", "webbrowser", "pydoc",
                        "__hello__", "__phello__", "ensurepip", "venv", "lib2to3", "pdb"})
_REQUESTS = frozenset({"call", "callmethod", "getattr", "setattr", "delattr", "op"})
_COPY_BACK = frozenset({"call", "callmethod", "op"})
_RUNNER_OPS = frozenset({"iter", "next", "len", "bool", "getitem", "setitem", "delitem", "contains", "str", "repr",
                         "eq", "ne", "lt", "le", "gt", "ge", "hash", "int", "float", "index"})


class ChannelError(Exception):
    """A frame or value that breaks the protocol (from the other process)."""


class NotCrossable(Exception):
    """A value this side cannot send (the caller decides: a handle, or NotCheckable)."""


class SolutionLost(BaseException):
    """The solution process ended, hung up or broke the protocol: the run fails (sticky)."""


class NotCheckable(BaseException):
    """The test does something the channel cannot carry faithfully (passes a generator, compares a handle):
    the run is reported "not checkable" (sticky)."""


# ---------------------------------------------------------------- codec


def _base_value(v, t):
    """The value of an instance of a subclass of a plain type, read by the builtin base type's own methods."""
    for base, read in _BASE_READERS:
        if isinstance(v, base):
            return read(v)
    raise NotCrossable(t.__name__)


_BASE_READERS = (
    (int, int.__int__),
    (float, float.__float__),
    (complex, lambda v: complex(complex.real.__get__(v), complex.imag.__get__(v))),
    (str, str.__str__),
    (bytes, lambda v: bytes.__getitem__(v, slice(None))),
    (tuple, lambda v: tuple.__getitem__(v, slice(None))),
    (list, list.copy),
    (dict, lambda v: dict(dict.items(v))),
    (frozenset, frozenset.copy),
    (set, set.copy),
)
PLAIN_BASES = tuple(b for b, _ in _BASE_READERS)


class Encoder:
    """One value (a message) to bytes. `track`: remember the lists, dicts and sets met (pre-order) for copy-back."""

    __slots__ = ("ep", "out", "containers")

    def __init__(self, ep, track=False):
        self.ep = ep
        self.out = bytearray()
        self.containers = [] if track else None

    def value(self, v, depth=0):
        f = _ENC.get(type(v))
        if f is None:
            self.ep.policy.encode_other(self, v, depth)
        else:
            f(self, v, depth)

    def items(self, tag, seq, depth):
        if depth >= MAX_DEPTH:
            raise NotCrossable("a value nested too deep (or containing itself)")
        out = self.out
        out += tag
        out += _I.pack(len(seq))
        for item in seq:
            self.value(item, depth + 1)

    def tracked(self, v):
        if self.containers is not None:
            self.containers.append(v)

    def handle(self, tag, oid, name):
        out = self.out
        out += tag
        out += _Q.pack(oid)
        self.text(name)

    def text(self, s):
        b = s.encode("utf-8", "surrogatepass")
        self.out += b"s" + _I.pack(len(b)) + b


def _enc_none(e, v, d):
    e.out += b"N"


def _enc_bool(e, v, d):
    e.out += b"T" if v else b"F"


def _enc_int(e, v, d):
    if _MIN_Q <= v <= _MAX_Q:
        e.out += b"i" + _Q.pack(v)
    else:
        b = v.to_bytes((v.bit_length() + 8) // 8, "little", signed=True)
        e.out += b"I" + _I.pack(len(b)) + b


def _enc_float(e, v, d):
    e.out += b"f" + _D.pack(v)


def _enc_complex(e, v, d):
    e.out += b"c" + _DD.pack(v.real, v.imag)


def _enc_str(e, v, d):
    e.text(v)


def _enc_bytes(e, v, d):
    e.out += b"b" + _I.pack(len(v)) + v


def _enc_range(e, v, d):
    if not all(_MIN_Q <= x <= _MAX_Q for x in (v.start, v.stop, v.step)):
        raise NotCrossable("a range beyond 64-bit bounds")
    e.out += b"R" + _QQQ.pack(v.start, v.stop, v.step)


def _enc_list(e, v, d):
    e.tracked(v)
    e.items(b"l", v, d)


def _enc_tuple(e, v, d):
    e.items(b"t", v, d)


def _enc_set(e, v, d):
    e.tracked(v)
    e.items(b"S", list(v), d)


def _enc_frozenset(e, v, d):
    e.items(b"z", list(v), d)


def _enc_dict(e, v, d):
    if d >= MAX_DEPTH:
        raise NotCrossable("a value nested too deep (or containing itself)")
    e.tracked(v)
    out = e.out
    out += b"d"
    out += _I.pack(len(v))
    for k, item in list(v.items()):
        e.value(k, d + 1)
        e.value(item, d + 1)


_ENC = {type(None): _enc_none, bool: _enc_bool, int: _enc_int, float: _enc_float, complex: _enc_complex,
        str: _enc_str, bytes: _enc_bytes, range: _enc_range, list: _enc_list, tuple: _enc_tuple, set: _enc_set,
        frozenset: _enc_frozenset, dict: _enc_dict}


class Decoder:
    """Bytes to a value: only builtin types, this endpoint's proxies and its own exported objects."""

    __slots__ = ("ep", "data", "pos", "containers")

    def __init__(self, ep, data, track=False):
        self.ep = ep
        self.data = data
        self.pos = 0
        self.containers = [] if track else None

    def take(self, n):
        start = self.pos
        end = start + n
        if n < 0 or end > len(self.data):
            raise ChannelError("truncated value")
        self.pos = end
        return self.data[start:end]

    def count(self):
        (n,) = _I.unpack(self.take(4))
        if n > len(self.data) - self.pos:  # every item takes at least one byte
            raise ChannelError("impossible length")
        return n

    def text(self):
        if self.take(1) != b"s":
            raise ChannelError("expected a string")
        return self._str()

    def _str(self):
        try:
            return str(self.take(self.count()), "utf-8", "surrogatepass")
        except UnicodeDecodeError as e:
            raise ChannelError("invalid text") from e

    def oid(self):
        return _Q.unpack(self.take(8))[0]

    def value(self, depth=0):
        if depth > MAX_DEPTH + 2:
            raise ChannelError("value nested too deep")
        tag = self.take(1)
        if tag == b"i":
            return _Q.unpack(self.take(8))[0]
        if tag == b"s":
            return self._str()
        if tag == b"N":
            return None
        if tag == b"T":
            return True
        if tag == b"F":
            return False
        if tag == b"f":
            v = _D.unpack(self.take(8))[0]
            return v if v == v else self.ep.policy.nan(v)
        if tag == b"l":
            out = []
            mark = self._track(out)
            for _ in range(self.count()):
                out.append(self.value(depth + 1))
            self._done(mark)
            return out
        if tag == b"t":
            return tuple([self.value(depth + 1) for _ in range(self.count())])
        if tag == b"d":
            out = {}
            mark = self._track(out)
            for _ in range(self.count()):
                k = self.value(depth + 1)
                try:
                    out[k] = self.value(depth + 1)
                except TypeError as e:
                    raise ChannelError("unhashable dict key") from e
            self._done(mark)
            return out
        if tag == b"I":
            return int.from_bytes(self.take(self.count()), "little", signed=True)
        if tag == b"c":
            v = complex(*_DD.unpack(self.take(16)))
            return v if v == v else self.ep.policy.nan(v)
        if tag == b"b":
            return bytes(self.take(self.count()))
        if tag == b"R":
            return range(*_QQQ.unpack(self.take(24)))
        if tag in (b"S", b"z"):
            out = set()
            mark = self._track(out) if tag == b"S" else None
            try:
                for _ in range(self.count()):
                    out.add(self.value(depth + 1))
            except TypeError as e:
                raise ChannelError("unhashable set item") from e
            self._done(mark)
            return out if tag == b"S" else frozenset(out)
        return self.ep.policy.decode_other(self, tag, depth)

    def _track(self, container):
        """Remember a list, dict or set (pre-order, as the sender's Encoder did) and where its bytes start."""
        if self.containers is None:
            return None
        self.containers.append([container, self.pos - 1, None])
        return self.containers[-1]

    def _done(self, mark):
        if mark is not None:
            mark[2] = self.pos

    def spans(self):
        """(container, its bytes as received) of every tracked container."""
        return [(c, self.data[start:end]) for c, start, end in self.containers or ()]


# ---------------------------------------------------------------- the endpoint (both processes)


class Endpoint:
    """One side of the channel: frames over two pipes, requests with nested callbacks, exported objects."""

    def __init__(self, rfd, wfd, policy):
        self.rfd, self.wfd = rfd, wfd
        self.policy = policy
        policy.ep = self
        self.exports = {}  # our oid -> object (kept alive for the whole check)
        self.export_ids = {}  # id(object) -> our oid
        self.proxies = {}  # their oid -> our proxy of it
        self.next_oid = 1
        self.seq = 0
        self.depth = 0
        self.lost = None  # why the channel is unusable (sticky)
        self.buf = bytearray()
        self.lock = threading.RLock()

    # -- objects

    def export(self, obj):
        oid = self.export_ids.get(id(obj))
        if oid is not None and self.exports.get(oid) is obj:
            return oid
        oid = self.next_oid
        self.next_oid += 1
        self.exports[oid] = obj
        self.export_ids[id(obj)] = oid
        return oid

    def exported(self, oid):
        try:
            return self.exports[oid]
        except KeyError:
            raise ChannelError(f"reference to an unknown object #{oid}") from None

    # -- frames

    def write(self, payload):
        data = _I.pack(len(payload)) + payload
        view = memoryview(data)
        while view:
            view = view[_write(self.wfd, view):]

    def _fill(self, n):
        buf = self.buf
        while len(buf) < n:
            chunk = _read(self.rfd, max(65536, n - len(buf)))
            if not chunk:
                raise EOFError("the other process closed the channel")
            buf += chunk

    def read_frame(self):
        self._fill(4)
        (n,) = _I.unpack(self.buf[:4])
        if n > MAX_FRAME:
            raise ChannelError(f"oversized frame ({n} bytes)")
        self._fill(4 + n)
        data = bytes(self.buf[4:4 + n])
        del self.buf[:4 + n]
        return data

    def send(self, message, track=False):
        enc = Encoder(self, track)
        enc.value(message)
        self.write(bytes(enc.out))
        return enc.containers

    def receive(self, track=False):
        dec = Decoder(self, self.read_frame(), track)
        message = dec.value()
        if dec.pos != len(dec.data) or type(message) is not tuple or len(message) < 2 \
                or type(message[0]) is not str or type(message[1]) is not int:
            raise ChannelError("malformed message")
        return message, dec

    # -- calls

    def request(self, kind, *fields):
        """Send a request and wait for its reply, serving the other side's nested requests meanwhile."""
        __tracebackhide__ = True  # pytest: a failure points at the test's line, not at the channel
        with self.lock:
            if self.lost is not None:
                raise self.policy.lost_error(self.lost)
            self.seq += 1
            seq = self.seq
            try:
                tracked = self.send((kind, seq) + fields, track=kind in _COPY_BACK)
            except NotCrossable as e:
                raise self.policy.not_crossable(e) from None
            except OSError as e:
                raise self.policy.lost_error(self.fail(f"the channel broke ({e})")) from None
            while True:
                try:
                    message, dec = self.receive(track=True)
                    kind2 = message[0]
                    if kind2 == "ok" or kind2 == "err":
                        if message[1] != seq:
                            raise ChannelError(f"reply to #{message[1]} while #{seq} was pending")
                        if kind2 == "ok":
                            if len(message) != 4:
                                raise ChannelError("malformed reply")
                            self._copy_back(tracked, message[3])
                            return message[2]
                        exc = self.policy.reraised(kind, fields, self.policy.rebuild_error(message))
                    elif kind2 == "out":
                        self.policy.output(message)
                        continue
                    elif kind2 in _REQUESTS:
                        self.serve_request(message, dec)
                        continue
                    else:
                        raise ChannelError(f"unexpected message {kind2[:40]!r}")
                except (ChannelError, EOFError, OSError, MemoryError, RecursionError) as e:
                    raise self.policy.lost_error(self.fail(f"{type(e).__name__}: {e}")) from None
                raise exc

    def fail(self, why):
        if self.lost is None:
            self.lost = why
        return self.lost

    def _copy_back(self, tracked, changes):
        if changes is None:
            return
        if type(changes) is not list or tracked is None:
            raise ChannelError("malformed copy-back")
        for change in changes:
            if type(change) is not tuple or len(change) != 2 or type(change[0]) is not int \
                    or not 0 <= change[0] < len(tracked):
                raise ChannelError("malformed copy-back")
            old, new = tracked[change[0]], change[1]
            if type(old) is not type(new):
                raise ChannelError("copy-back of another type")
            if type(old) is list:
                old[:] = new
            else:
                old.clear()
                old.update(new)

    def serve_request(self, message, dec):
        """Answer one request of the other side (a call of ours, or a callback of theirs during our call)."""
        kind, seq = message[0], message[1]
        if kind not in _REQUESTS:
            raise ChannelError(f"not a request: {kind[:40]!r}")
        if self.depth >= MAX_NESTED_CALLS:
            self._reply_error(seq, RecursionError("calls nested too deep across the channel"))
            return
        spans = dec.spans() if kind in _COPY_BACK else ()
        self.depth += 1
        try:
            result = self.policy.perform(kind, message[2:])
        except ChannelError:
            raise
        except BaseException as e:  # noqa: BLE001 - the callee's exception goes back to the caller
            if not self.policy.may_reply_error(e):
                raise
            self.policy.flush_output()
            self._reply_error(seq, e)
            return
        finally:
            self.depth -= 1
        self.policy.flush_output()
        changes = self._changes(spans)
        try:
            self.send(("ok", seq, result, changes))
        except NotCrossable:
            self.send(("ok", seq, self.policy.fallback(result), changes))

    def _changes(self, spans):
        """Copy-back: (index, new value) of the caller's lists, dicts and sets the call changed."""
        out = []
        for i, (container, before) in enumerate(spans):
            enc = Encoder(self)
            try:
                enc.value(container)
            except NotCrossable:
                continue
            if enc.out != before:
                out.append((i, container))
        return out or None

    def _reply_error(self, seq, exc):
        cls, args, text, note = self.policy.error_record(exc)
        try:
            self.send(("err", seq, cls, args, text, note))
        except NotCrossable:
            self.send(("err", seq, cls, None, text, note))

    def serve_forever(self):
        """Answer requests until the other side hangs up (EOF returns)."""
        while True:
            with self.lock:
                try:
                    message, dec = self.receive(track=True)
                except EOFError:
                    return
                self.serve_request(message, dec)


# ---------------------------------------------------------------- proxies (runner side: objects of the solution)


def _ep_of(proxy):
    return type.__getattribute__(type(proxy), "_ef_ep") if not isinstance(proxy, type) else \
        type.__getattribute__(proxy, "_ef_ep")


def _oid_of(proxy):
    d = object.__getattribute__(proxy, "__dict__") if not isinstance(proxy, type) else None
    if d is not None and "_ef_oid" in d:
        return d["_ef_oid"]
    return type.__getattribute__(proxy if isinstance(proxy, type) else type(proxy), "_ef_oid")


_LOCAL_DUNDERS_FORWARDED = frozenset({"__name__", "__qualname__", "__doc__"})


def _forwardable(name):
    if type(name) is not str or name.startswith("_ef_"):
        return False
    return not (name.startswith("__") and name.endswith("__")) or name in _LOCAL_DUNDERS_FORWARDED


class SolutionFunction:
    """Runner side: a function (or other callable that is not a class) of the solution."""

    _ef_ep = None

    def __init__(self, oid, name):
        object.__setattr__(self, "_ef_oid", oid)
        object.__setattr__(self, "_ef_name", name)

    def __call__(self, *args, **kwargs):
        __tracebackhide__ = True
        return _ep_of(self).request("call", self, args, kwargs)

    def __getattr__(self, name):
        __tracebackhide__ = True
        if not _forwardable(name):
            raise AttributeError(name)
        _guard(self, f"reads attribute {name!r} of")
        return _ep_of(self).request("getattr", self, name)

    def __setattr__(self, name, value):
        if not _forwardable(name):
            return object.__setattr__(self, name, value)
        _ep_of(self).request("setattr", self, name, value)

    def __repr__(self):
        return f"<solution function {object.__getattribute__(self, '_ef_name')}>"


class _MethodStub:
    """Runner side: `handle.method` for a method the solution's class declares; calling it is one round trip."""

    __slots__ = ("_ef_owner", "_ef_name")

    def __init__(self, owner, name):
        object.__setattr__(self, "_ef_owner", owner)
        object.__setattr__(self, "_ef_name", name)

    def __call__(self, *args, **kwargs):
        __tracebackhide__ = True
        owner = object.__getattribute__(self, "_ef_owner")
        return _ep_of(owner).request("callmethod", owner, object.__getattribute__(self, "_ef_name"), args, kwargs)

    def __repr__(self):
        return f"<bound method {object.__getattribute__(self, '_ef_name')} of a solution object>"


def _not_checkable(ep, why):
    raise ep.policy.not_checkable_error(why)


_FREE_OPS = frozenset({"iter", "next", "len", "bool", "str", "repr", "int", "float", "index"})  # no argument: data


def _guard(proxy, what):
    """A solution object the test did not reach by name (a result, not one of the task's classes or functions)
    answers no method call, attribute read, call or question with an argument: its answers would be the
    solution's choice of what the test checks (a duck-typed result). The run is not checkable."""
    ep = _ep_of(proxy)
    if not ep.policy.is_declared(proxy):
        kind = "function" if isinstance(proxy, SolutionFunction) else \
            f"class {proxy.__name__}" if isinstance(proxy, type) else f"object of class {type(proxy).__name__}"
        _not_checkable(ep, f"the test {what} a solution {kind} it did not import from the solution (a result "
                           "that is not plain data answers no method call, attribute read or question)")


class SolutionObject:
    """Runner side: base of the proxy class of each class of the solution (instances are handles)."""

    __slots__ = ()
    _ef_ep = None
    _ef_methods = frozenset()

    def __getattr__(self, name):
        if not _forwardable(name):
            raise AttributeError(name)
        _guard(self, f"reads attribute {name!r} of")
        if name in type(self)._ef_methods and not isinstance(self, type):
            return _MethodStub(self, name)
        return _ep_of(self).request("getattr", self, name)

    def __setattr__(self, name, value):
        if not _forwardable(name) or name in ("__doc__",):
            return object.__setattr__(self, name, value)
        _ep_of(self).request("setattr", self, name, value)

    def __delattr__(self, name):
        if not _forwardable(name):
            return object.__delattr__(self, name)
        _ep_of(self).request("delattr", self, name)

    def _ef_op(self, op, *args):
        __tracebackhide__ = True
        if op not in _FREE_OPS:
            _guard(self, f"applies {op!r} to")
        return _ep_of(self).request("op", op, self, args)

    def __call__(self, *args, **kwargs):
        __tracebackhide__ = True
        _guard(self, "calls")
        return _ep_of(self).request("call", self, args, kwargs)

    def __iter__(self):
        return self._ef_op("iter")

    def __next__(self):
        return self._ef_op("next")

    def __len__(self):
        n = self._ef_op("len")
        if type(n) is not int or n < 0:
            raise TypeError("the solution's __len__ did not return a non-negative int")
        return n

    def __bool__(self):
        b = self._ef_op("bool")
        if type(b) is not bool:
            raise TypeError("the solution's __bool__ did not return a bool")
        return b

    def __getitem__(self, key):
        return self._ef_op("getitem", key)

    def __setitem__(self, key, value):
        self._ef_op("setitem", key, value)

    def __delitem__(self, key):
        self._ef_op("delitem", key)

    def __int__(self):
        return _typed(self._ef_op("int"), int)

    def __float__(self):
        return _typed(self._ef_op("float"), float)

    def __index__(self):
        return _typed(self._ef_op("index"), int)

    def __str__(self):
        try:
            return _typed(self._ef_op("str"), str)
        except (SolutionLost, TypeError):
            return self._ef_local_repr()

    def __repr__(self):
        try:
            return _typed(self._ef_op("repr"), str)
        except (SolutionLost, TypeError):
            return self._ef_local_repr()

    def _ef_local_repr(self):
        return f"<solution object of class {type(self).__name__}>"

    def __enter__(self):
        return self._ef_op("enter")

    def __exit__(self, *exc):
        return self._ef_op("exit", None, None, None)

    def __hash__(self):
        return object.__hash__(self)

    def _ef_compare(self, other, op):
        if op in ("==", "<=", ">=") and self is other:
            return True
        if op == "!=" and self is other:
            return False
        _not_checkable(_ep_of(self), f"the test compares a solution object of class {type(self).__name__!s} "
                                     f"with {op} (only plain data is compared in the runner)")

    def __eq__(self, other):
        return self._ef_compare(other, "==")

    def __ne__(self, other):
        return self._ef_compare(other, "!=")

    def __lt__(self, other):
        return self._ef_compare(other, "<")

    def __le__(self, other):
        return self._ef_compare(other, "<=")

    def __gt__(self, other):
        return self._ef_compare(other, ">")

    def __ge__(self, other):
        return self._ef_compare(other, ">=")


def _typed(value, kind):
    if type(value) is not kind:
        raise TypeError(f"the solution returned {type(value).__name__}, expected {kind.__name__}")
    return value


class SolutionClass(type):
    """Runner side: metaclass of the proxy of a class of the solution: calling it constructs in the solution."""

    def __call__(cls, *args, **kwargs):
        __tracebackhide__ = True
        _guard(cls, "calls")
        return type.__getattribute__(cls, "_ef_ep").request("call", cls, args, kwargs)

    def __getattr__(cls, name):
        if not _forwardable(name):
            raise AttributeError(name)
        _guard(cls, f"reads attribute {name!r} of")
        return type.__getattribute__(cls, "_ef_ep").request("getattr", cls, name)

    def __repr__(cls):
        return f"<solution class {cls.__name__}>"

    def __hash__(cls):
        return type.__hash__(cls)

    def __eq__(cls, other):
        return cls is other

    def __ne__(cls, other):
        return cls is not other


def _exc_str(self):
    msg = self.__dict__.get("_ef_message")
    return msg if type(msg) is str else BaseException.__str__(self)


def _exc_repr(self):
    return f"{type(self).__name__}({_exc_str(self)!r})"


# ---------------------------------------------------------------- NaN results and the names a test file uses


def _nan_compare(self, other, op):
    if other is self and op in ("==", "!="):  # the test's own NaN check (`x != x`)
        return op == "!="
    raise type(self)._ef_policy.not_checkable_error(
        f"the test compares a NaN the solution returned (with {op}): every comparison with NaN is false; a test that "
        "expects NaN checks for it (math.isnan)")


def _nan_arith(name):
    def op(self, *args):
        r = getattr(self.__class__.__mro__[2], name)(self, *args)
        if (type(r) is float or type(r) is complex) and r != r:
            return type(self)._ef_policy.nan(r)
        return r

    op.__name__ = name
    return op


def _nan_class_body(names, compares):
    body = {"__hash__": None}
    for op, dunder in (("==", "__eq__"), ("!=", "__ne__"), ("<", "__lt__"), ("<=", "__le__"), (">", "__gt__"),
                       (">=", "__ge__")):
        if dunder in compares:
            body[dunder] = (lambda op: lambda self, other: _nan_compare(self, other, op))(op)
    for name in names:
        body[name] = _nan_arith(name)
    return body


_ARITH = ("__add__", "__radd__", "__sub__", "__rsub__", "__mul__", "__rmul__", "__truediv__", "__rtruediv__",
          "__pow__", "__rpow__", "__neg__", "__pos__", "__abs__")
_NaNFloat = type("_NaNFloat", (float,), {"__slots__": (), **_nan_class_body(
    _ARITH + ("__floordiv__", "__rfloordiv__", "__mod__", "__rmod__"),
    ("__eq__", "__ne__", "__lt__", "__le__", "__gt__", "__ge__"))})
_NaNFloat.__hash__ = float.__hash__
_NaNComplex = type("_NaNComplex", (complex,), {"__slots__": (), **_nan_class_body(_ARITH, ("__eq__", "__ne__"))})
_NaNComplex.__hash__ = complex.__hash__


def free_names(source):
    """The global names `source` uses but never binds at its top level or declares global and assigns anywhere
    (for a test file: what it expects from the solution). None when it does not parse."""
    import symtable

    try:
        top = symtable.symtable(source, "<test>", "exec")
    except (SyntaxError, ValueError):
        return None
    bound = {s.get_name() for s in top.get_symbols() if s.is_assigned() or s.is_imported() or s.is_namespace()}
    used = {s.get_name() for s in top.get_symbols() if s.is_referenced()}
    todo = list(top.get_children())
    while todo:
        table = todo.pop()
        todo.extend(table.get_children())
        for sym in table.get_symbols():
            if sym.is_global():
                if sym.is_referenced():
                    used.add(sym.get_name())
                if sym.is_declared_global() and (sym.is_assigned() or sym.is_imported()):
                    bound.add(sym.get_name())
    return frozenset(used - bound)


# ---------------------------------------------------------------- policies


def _identifier_path(text, allow_empty=False):
    if type(text) is not str or len(text) > MAX_NAME:
        return False
    if not text:
        return allow_empty
    return all(p.isidentifier() for p in text.split("."))


class RunnerPolicy:
    """What the runner accepts from the solution and what it lets cross to it (the trusted side)."""

    def __init__(self, test_files=(), test_modules=("__main__", "test_solution")):
        self.ep = None
        self.test_files = frozenset(test_files)
        self.test_modules = frozenset(test_modules)
        self.classes = {}  # their class oid -> proxy type
        self.function_type = None
        self.not_checkable = None
        self.forwarded = 0
        self.declared_classes = []  # classes the test reached by name from `solution` (the task's interface)
        self.declared_objects = set()  # ids of functions and objects it reached by name (kept alive by the module)
        self.declared_cache = {}  # proxy class -> declared
        self.nan_types = {}

    # -- what the test named (entry points) and what it uses

    def declare(self, value):
        """A value the test got by name from the solution module: a class (its instances and subclasses may answer
        the test), a function or an object (may answer too)."""
        if type(value) is SolutionClass:
            self.declared_classes.append(value)
            self.declared_cache.clear()
        elif isinstance(value, (SolutionFunction, SolutionObject)):
            self.declared_objects.add(id(value))

    def is_declared(self, proxy):
        if id(proxy) in self.declared_objects:
            return True
        cls = proxy if type(proxy) is SolutionClass else type(proxy)
        known = self.declared_cache.get(cls)
        if known is None:
            known = self.declared_cache[cls] = any(issubclass(cls, d) for d in self.declared_classes)
        return known

    def wanted_names(self):
        """The names the test file uses without binding them itself (None: unknown, e.g. it does not parse)."""
        for path in sorted(self.test_files):
            try:
                with open(path, encoding="utf-8", errors="surrogateescape") as f:
                    return free_names(f.read())
            except OSError:
                continue
        return None

    def reraised(self, kind, fields, exc):
        """PEP 479 for calls across the channel: a StopIteration (or StopAsyncIteration, or a subclass) out of a call
        into the solution reaches the test as RuntimeError, so it cannot end the test's map(), filter(), all() or
        any() as if exhausted. Only `next` on a solution iterator ends an iteration with it."""
        if isinstance(exc, (StopIteration, StopAsyncIteration)) and not (kind == "op" and fields and fields[0] == "next"):
            new = RuntimeError(f"a call into the solution raised {type(exc).__name__}")
            new.__cause__ = exc
            return new
        return exc

    def nan(self, v):
        """A NaN from the solution: compared by the test, it makes the run not checkable (every comparison with NaN is
        False, so a negated comparison would hold for any input); math.isnan and `x != x` still see a NaN."""
        base = type(v)
        t = self.nan_types.get(base)
        if t is None:
            t = self.nan_types[base] = type(base.__name__, (_NaNComplex if base is complex else _NaNFloat,),
                                            {"__slots__": (), "_ef_policy": self})
        return t(v)

    # -- errors

    def lost_error(self, why):
        return SolutionLost(f"the solution process is gone or broke the channel: {why}")

    def not_checkable_error(self, why):
        if self.not_checkable is None:
            self.not_checkable = why
        return NotCheckable(why)

    def not_crossable(self, e):
        return self.not_checkable_error(f"the test passes something that cannot cross to the solution: {e}")

    def may_reply_error(self, e):
        return not isinstance(e, (SolutionLost, NotCheckable, KeyboardInterrupt, SystemExit))

    def flush_output(self):
        pass

    def fallback(self, result):
        raise self.not_checkable_error(f"the test gives the solution a {type(result).__name__} object, which "
                                       "cannot cross to it")

    def error_record(self, exc):
        """An exception of the test's code going back to the solution: builtin types only."""
        t = type(exc)
        if getattr(builtins, t.__name__, None) is not t or issubclass(t, _FORBIDDEN_EXC):
            t = RuntimeError
        text = _safe_str(exc)
        return t, (exc.args if type(exc) is t else (text,)), text, None

    # -- the runner's values going to the solution

    def is_test_function(self, f):
        return type(f) is types.FunctionType and f.__code__.co_filename in self.test_files

    def is_test_class(self, c):
        return type(c) is type and c.__dict__.get("__module__") in self.test_modules

    def exportable(self, v):
        t = type(v)
        if t is types.FunctionType:
            return self.is_test_function(v)
        if t is types.MethodType:
            owner = v.__self__
            return self.is_test_function(v.__func__) and (self.is_test_class(type(owner)) or self.is_test_class(owner))
        if t is type:
            return self.is_test_class(v)
        return self.is_test_class(t)

    def encode_other(self, enc, v, depth):
        t = type(v)
        if issubclass(t, (SolutionFunction, SolutionObject)) or t is SolutionClass:
            ep = type.__getattribute__(v if t is SolutionClass else t, "_ef_ep")
            if ep is not self.ep:
                raise NotCrossable("a handle of another channel")
            enc.out += b"r" + _Q.pack(_oid_of(v))
            return
        if t is _MethodStub:
            enc.out += b"M" + _Q.pack(_oid_of(object.__getattribute__(v, "_ef_owner")))
            enc.text(object.__getattribute__(v, "_ef_name"))
            return
        if isinstance(v, PLAIN_BASES):
            enc.value(_base_value(v, t), depth)
            return
        name = _name_of(v)
        if name is not None:
            enc.out += b"n"
            enc.text(name[0])
            enc.text(name[1])
            return
        if self.exportable(v):
            oid = self.ep.export(v)
            if t in (types.FunctionType, types.MethodType, type):
                enc.handle(b"p", oid, str(v.__name__))
            else:
                enc.handle(b"h", oid, t.__name__)
            return
        raise NotCrossable(f"a {t.__module__}.{t.__qualname__} object (only plain data, the solution's own "
                           "objects, and functions, classes and instances the test defines can cross)")

    # -- the solution's values arriving here

    def decode_other(self, dec, tag, depth):
        ep = self.ep
        if tag == b"r":  # one of ours, back
            return ep.exported(dec.oid())
        if tag == b"p":
            oid, name = dec.oid(), dec.text()[:MAX_NAME]
            proxy = ep.proxies.get(oid)
            if proxy is None:
                if self.function_type is None:
                    self.function_type = type("SolutionFunction", (SolutionFunction,), {"_ef_ep": ep})
                proxy = ep.proxies[oid] = self.function_type(oid, name)
            elif type(proxy) is not self.function_type:
                raise ChannelError("an object changed its kind")
            return proxy
        if tag == b"k":
            return self.class_proxy(dec, depth)
        if tag == b"h":
            oid = dec.oid()
            if dec.take(1) != b"k":
                raise ChannelError("expected a class record")
            cls = self.class_proxy(dec, depth)
            proxy = ep.proxies.get(oid)
            if proxy is None:
                proxy = BaseException.__new__(cls) if issubclass(cls, BaseException) else object.__new__(cls)
                object.__setattr__(proxy, "_ef_oid", oid)
                ep.proxies[oid] = proxy
            elif type(proxy) is not cls:
                raise ChannelError("an object changed its class")
            return proxy
        if tag == b"n":
            module, qualname = dec.text(), dec.text()
            return self.resolve(module, qualname)
        raise ChannelError(f"unknown tag {tag!r}")

    def class_proxy(self, dec, depth):
        """A class record (after its tag): oid, name, method names, builtin exception base, base class records."""
        if depth > MAX_DEPTH:
            raise ChannelError("class records nested too deep")
        oid, name = dec.oid(), dec.text()
        methods = dec.value(depth + 1)
        base_name = dec.text()
        bases = []
        for _ in range(dec.count()):
            if dec.take(1) != b"k":
                raise ChannelError("expected a class record")
            bases.append(self.class_proxy(dec, depth + 1))
        if type(methods) is not frozenset or not all(type(m) is str for m in methods):
            raise ChannelError("malformed class record")
        cls = self.classes.get(oid)
        if cls is not None:
            return cls
        if not name.isidentifier() or len(name) > MAX_NAME:
            name = "SolutionObject"
        builtin = getattr(builtins, base_name, None) if _identifier_path(base_name) else None
        if not (isinstance(builtin, type) and issubclass(builtin, BaseException)) or issubclass(
                builtin, _FORBIDDEN_EXC) or issubclass(builtin, BaseExceptionGroup):
            builtin = None
        ns = {"__module__": SOLUTION_MODULE, "__qualname__": name, "_ef_ep": self.ep, "_ef_oid": oid,
              "_ef_methods": frozenset(m for m in methods if _forwardable(m)), "__doc__": None}
        if builtin is not None:
            ns["__str__"] = _exc_str
            ns["__repr__"] = _exc_repr
        options = []
        if bases:
            extra = (builtin,) if builtin is not None and not any(issubclass(b, builtin) for b in bases) else ()
            options.append(tuple(bases) + extra)
        options.append((SolutionObject, builtin) if builtin is not None else (SolutionObject,))
        cls = None
        for parents in options:
            body = dict(ns)
            if builtin is None:
                body["__slots__"] = ("__dict__",) if parents[0] is SolutionObject else ()
            try:
                cls = SolutionClass(name, parents, body)
                break
            except TypeError:
                continue
        if cls is None:
            raise ChannelError("an impossible class hierarchy")
        self.classes[oid] = cls
        return cls

    def resolve(self, module, qualname):
        """A module by name (the runner's own), or a class of builtins (exceptions); nothing else by name."""
        if not _identifier_path(module) or not _identifier_path(qualname, allow_empty=True):
            raise ChannelError("malformed name")
        if qualname:
            obj = getattr(builtins, qualname, None) if module == "builtins" and "." not in qualname \
                and not qualname.startswith("_") else None
            if not isinstance(obj, type):
                raise ChannelError(f"the solution sent {module}.{qualname} by name")
            return obj
        mod = sys.modules.get(module)
        if mod is not None and module != SOLUTION_MODULE:
            return mod
        top = module.split(".")[0]
        if top not in sys.stdlib_module_names or top in _NO_IMPORT or any(p.startswith("_") for p in module.split(".")):
            return _Unresolved(module)
        try:
            return importlib.import_module(module)
        except Exception:  # noqa: BLE001
            return _Unresolved(module)

    # -- replies, errors and output of the solution

    def rebuild_error(self, message):
        if len(message) != 6:
            raise ChannelError("malformed error reply")
        _, _, cls, args, text, note = message
        if type(text) is not str or (note is not None and type(note) is not str) \
                or (args is not None and type(args) is not tuple):
            raise ChannelError("malformed error reply")
        if isinstance(cls, SolutionObject) and isinstance(cls, BaseException):
            exc = cls
            exc.__dict__["_ef_message"] = text
            exc.args = args if args is not None else (text,)
        elif isinstance(cls, type) and type(cls) is type and issubclass(cls, BaseException):
            if issubclass(cls, _FORBIDDEN_EXC):
                raise ChannelError(f"the solution raised {cls.__name__} into the runner")
            exc = _builtin_exception(cls, args, text)
        else:
            raise ChannelError("the error reply names no exception class")
        if note:
            try:
                exc.add_note("[raised in the solution process]\n" + note[-_NOTE_LIMIT:].rstrip())
            except Exception:  # noqa: BLE001
                pass
        return exc

    def output(self, message):
        if len(message) != 4 or message[2] not in (1, 2) or type(message[3]) is not str:
            raise ChannelError("malformed output message")
        self.forwarded += len(message[3])
        if self.forwarded > MAX_FORWARDED_OUTPUT:
            raise ChannelError(f"the solution printed more than {MAX_FORWARDED_OUTPUT} characters")
        stream = sys.stdout if message[2] == 1 else sys.stderr
        try:
            stream.write(message[3])
        except Exception:  # noqa: BLE001 - a closed or odd stream of the test: the text is dropped
            pass

    # -- the solution's callbacks into objects the test passed

    def perform(self, kind, fields):
        if kind == "call" and len(fields) == 3:
            target, args, kwargs = fields
            if not self.exportable(target) or not callable(target) or type(args) is not tuple \
                    or type(kwargs) is not dict or not all(type(k) is str for k in kwargs):
                raise ChannelError("a callback of something the runner did not pass")
            return target(*args, **kwargs)
        if kind in ("getattr", "setattr", "callmethod") and len(fields) >= 2:
            target, name = fields[0], fields[1]
            if type(name) is not str or name.startswith("_") or not (
                    self.is_test_class(type(target)) or self.is_test_class(target)):
                raise ChannelError(f"attribute {str(name)[:40]!r} of something the runner does not share")
            if kind == "getattr" and len(fields) == 2:
                return getattr(target, name)
            if kind == "setattr" and len(fields) == 3 and type(target) is not type:
                setattr(target, name, fields[2])
                return None
            if kind == "callmethod" and len(fields) == 4 and type(fields[2]) is tuple and type(fields[3]) is dict \
                    and all(type(k) is str for k in fields[3]):
                return getattr(target, name)(*fields[2], **fields[3])
        if kind == "op" and len(fields) == 3:
            op, target, args = fields
            if op not in _RUNNER_OPS or type(args) is not tuple or not self.is_test_class(type(target)):
                raise ChannelError(f"operation {str(op)[:40]!r} on something the runner does not share")
            return _apply_op(op, target, args)
        raise ChannelError(f"malformed {str(kind)[:40]} request")


def _builtin_exception(cls, args, text):
    """An instance of builtin exception class `cls` with `args` (or the message alone) whose str is `text`."""
    for attempt in ((args,) if args is not None else ()) + ((text,),):
        try:
            exc = cls(*attempt)
        except Exception:  # noqa: BLE001
            continue
        if type(exc) is cls and _safe_str(exc) == text:
            return exc
    return RuntimeError(f"{cls.__name__}: {text}")


def _safe_str(exc):
    try:
        text = str(exc)
    except Exception:  # noqa: BLE001
        return f"<{type(exc).__name__}: unprintable>"
    return text if type(text) is str else f"<{type(exc).__name__}>"


class _Unresolved:
    """A module of the solution the runner does not load (not stdlib): using it is not checkable."""

    def __init__(self, name):
        self._name = name

    def __getattr__(self, attr):
        raise NotCheckable(f"the test uses module {self._name!r} from the solution, which the runner does not load")


def _name_of(v):
    """(module, qualname) when v is a module, or a class or function reachable by that name in its module."""
    t = type(v)
    if t is types.ModuleType:
        name = getattr(v, "__name__", None)
        return (name, "") if _identifier_path(name) and sys.modules.get(name) is v else None
    if t not in (type, types.BuiltinFunctionType, types.FunctionType, types.MethodDescriptorType,
                 types.WrapperDescriptorType, types.ClassMethodDescriptorType):
        return None
    owner = getattr(v, "__objclass__", None)
    module = getattr(owner if owner is not None else v, "__module__", None)
    qualname = getattr(v, "__qualname__", None)
    if not _identifier_path(module) or not _identifier_path(qualname) or module in (SOLUTION_MODULE, "__main__") \
            or module.startswith("test_"):
        return None
    obj = sys.modules.get(module)
    for part in qualname.split("."):
        obj = getattr(obj, part, None)
    return (module, qualname) if obj is v else None


def _apply_op(op, target, args):
    import operator

    if op == "iter":
        return iter(target)
    if op == "next":
        return next(target)
    if op == "len":
        return len(target)
    if op == "bool":
        return bool(target)
    if op == "str":
        return str(target)
    if op == "repr":
        return repr(target)
    if op == "hash":
        return hash(target)
    if op == "int":
        return int(target)
    if op == "float":
        return float(target)
    if op == "index":
        return operator.index(target)
    if op == "enter":
        return target.__enter__()
    if op == "exit":
        return target.__exit__(*args[:3])
    binary = {"getitem": operator.getitem, "delitem": operator.delitem, "contains": operator.contains,
              "eq": operator.eq, "ne": operator.ne, "lt": operator.lt, "le": operator.le, "gt": operator.gt,
              "ge": operator.ge}
    if op in binary and len(args) == 1:
        return binary[op](target, args[0])
    if op == "setitem" and len(args) == 2:
        return operator.setitem(target, args[0], args[1])
    raise TypeError(f"bad operation {op!r}")


def _error_record(exc, tb_text):
    """(class, args, message, traceback) of an exception, for an "err" reply."""
    t = type(exc)
    args = exc.args if type(exc.args) is tuple else None
    builtin = getattr(builtins, t.__name__, None) is t
    return (t if builtin else exc), args, _safe_str(exc), tb_text


class SolutionPolicy:
    """The solution process's side: encode for fidelity (the runner validates everything it receives)."""

    def __init__(self):
        self.ep = None
        self.out = None

    def lost_error(self, why):
        return SolutionLost(why)

    def nan(self, v):
        return v

    def reraised(self, kind, fields, exc):
        return exc

    def not_checkable_error(self, why):
        return NotCheckable(why)

    def not_crossable(self, e):
        return TypeError(f"cannot pass this value to the tests' process: {e}")

    def may_reply_error(self, e):
        return isinstance(e, Exception)

    def flush_output(self):
        for stream in self.out or ():
            stream.flush()

    def fallback(self, result):
        return _AsHandle(result)

    def rebuild_error(self, message):
        """An exception of the test's callback: the runner sends builtin classes only."""
        if len(message) != 6:
            raise ChannelError("malformed error reply")
        _, _, cls, args, text, _note = message
        if not (isinstance(cls, type) and issubclass(cls, BaseException)):
            return RuntimeError(str(text))
        return _builtin_exception(cls, args if type(args) is tuple else None, str(text))

    def output(self, message):
        raise ChannelError("the runner sends no output")

    def error_record(self, exc):
        frames = exc.__traceback__
        while frames is not None and frames.tb_frame.f_code.co_filename == __file__:  # the channel's own frames
            frames = frames.tb_next
        try:
            tb = "".join(traceback.format_exception(type(exc), exc, frames))
        except Exception:  # noqa: BLE001
            tb = None
        return _error_record(exc, tb)

    def encode_other(self, enc, v, depth):
        t = type(v)
        if t is _AsHandle:
            v = v.obj
            t = type(v)
        elif t is _RunnerProxy:
            enc.out += b"r" + _Q.pack(object.__getattribute__(v, "_ef_oid"))
            return
        elif isinstance(v, PLAIN_BASES) and not (t.__module__ == SOLUTION_MODULE and isinstance(v, (list, dict, set))):
            enc.value(_base_value(v, t), depth)
            return
        elif t is types.ModuleType or (t is type and getattr(builtins, v.__name__, None) is v):
            name = _name_of(v)
            if name is not None:
                enc.out += b"n"
                enc.text(name[0])
                enc.text(name[1])
                return
        elif t.__module__ == "numpy" and hasattr(v, "item"):
            item = v.item()
            if type(item) in (int, float, bool, complex):
                enc.value(item, depth)
                return
        oid = self.ep.export(v)
        if isinstance(v, type):
            enc.out += b"k"
            self.class_record(enc, v, oid, depth)
        elif t in _FUNCTION_TYPES or (callable(v) and t.__name__ == "partial"):
            enc.handle(b"p", oid, str(getattr(v, "__name__", "function")))
        else:
            enc.out += b"h" + _Q.pack(oid) + b"k"
            self.class_record(enc, t, self.ep.export(t), depth)

    def class_record(self, enc, cls, oid, depth):
        enc.out += _Q.pack(oid)
        enc.text(str(getattr(cls, "__name__", "SolutionObject")))
        mro = getattr(cls, "__mro__", (cls,))
        methods = set()
        for klass in mro:
            if klass is object or getattr(builtins, getattr(klass, "__name__", ""), None) is klass:
                continue
            for k, item in list(vars(klass).items()):
                if type(k) is str and not k.startswith("_") and isinstance(
                        item, (types.FunctionType, staticmethod, classmethod)):
                    methods.add(k)
        enc.value(frozenset(methods))
        base = ""
        if issubclass(cls, BaseException):
            for klass in mro:
                if getattr(builtins, klass.__name__, None) is klass:
                    base = klass.__name__
                    break
        enc.text(base)
        own = [b for b in getattr(cls, "__bases__", ()) if getattr(builtins, b.__name__, None) is not b]
        if depth > 20:
            own = []
        enc.out += _I.pack(len(own))
        for b in own:
            enc.out += b"k"
            self.class_record(enc, b, self.ep.export(b), depth + 1)

    def decode_other(self, dec, tag, depth):
        ep = self.ep
        if tag == b"r":
            return ep.exported(dec.oid())
        if tag in (b"p", b"h"):
            oid, name = dec.oid(), dec.text()
            proxy = ep.proxies.get(oid)
            if proxy is None:
                proxy = ep.proxies[oid] = _RunnerProxy(ep, oid, name)
            return proxy
        if tag == b"M":
            owner = ep.exported(dec.oid())
            return getattr(owner, dec.text())
        if tag == b"n":
            module, qualname = dec.text(), dec.text()
            obj = importlib.import_module(module)
            for part in qualname.split(".") if qualname else ():
                obj = getattr(obj, part)
            return obj
        raise ChannelError(f"unknown tag {tag!r}")

    def perform(self, kind, fields):
        if kind == "call":
            target, args, kwargs = fields
            return target(*args, **kwargs)
        if kind == "callmethod":
            target, name, args, kwargs = fields
            return getattr(target, name)(*args, **kwargs)
        if kind == "getattr":
            return getattr(fields[0], fields[1])
        if kind == "setattr":
            setattr(fields[0], fields[1], fields[2])
            return None
        if kind == "delattr":
            delattr(fields[0], fields[1])
            return None
        if kind == "op":
            op, target, args = fields
            return _apply_op(op, target, args)
        raise ChannelError(f"unknown request {kind!r}")


_FUNCTION_TYPES = (types.FunctionType, types.BuiltinFunctionType, types.MethodType, types.MethodWrapperType,
                   types.WrapperDescriptorType, types.MethodDescriptorType, types.ClassMethodDescriptorType)


class _AsHandle:
    __slots__ = ("obj",)

    def __init__(self, obj):
        self.obj = obj


class _RunnerProxy:
    """Solution side: an object the tests passed (a callback); everything on it is asked of the runner."""

    __slots__ = ("_ef_ep", "_ef_oid", "_ef_name", "__weakref__")

    def __init__(self, ep, oid, name):
        object.__setattr__(self, "_ef_ep", ep)
        object.__setattr__(self, "_ef_oid", oid)
        object.__setattr__(self, "_ef_name", name)

    def __call__(self, *args, **kwargs):
        return self._ef_ep.request("call", self, args, kwargs)

    def __getattr__(self, name):
        if name.startswith("__"):
            raise AttributeError(name)
        return self._ef_ep.request("getattr", self, name)

    def __setattr__(self, name, value):
        self._ef_ep.request("setattr", self, name, value)

    def _ef_op(self, op, *args):
        return self._ef_ep.request("op", op, self, args)

    def __iter__(self):
        return self._ef_op("iter")

    def __next__(self):
        return self._ef_op("next")

    def __len__(self):
        return self._ef_op("len")

    def __bool__(self):
        return self._ef_op("bool")

    def __getitem__(self, key):
        return self._ef_op("getitem", key)

    def __setitem__(self, key, value):
        self._ef_op("setitem", key, value)

    def __contains__(self, item):
        return self._ef_op("contains", item)

    def __eq__(self, other):
        return self is other or self._ef_op("eq", other)

    def __ne__(self, other):
        return self is not other and self._ef_op("ne", other)

    def __lt__(self, other):
        return self._ef_op("lt", other)

    def __le__(self, other):
        return self._ef_op("le", other)

    def __gt__(self, other):
        return self._ef_op("gt", other)

    def __ge__(self, other):
        return self._ef_op("ge", other)

    def __hash__(self):
        return self._ef_op("hash")

    def __str__(self):
        return self._ef_op("str")

    def __repr__(self):
        return self._ef_op("repr")


# ---------------------------------------------------------------- the solution process


class _Forward(io.TextIOBase):
    """The solution's sys.stdout / sys.stderr: text goes to the runner, in order with the calls' replies."""

    def __init__(self, ep, stream):
        self.ep, self.stream, self.parts, self.size = ep, stream, [], 0

    def writable(self):
        return True

    def write(self, s):
        if type(s) is not str:
            raise TypeError(f"write() argument must be str, not {type(s).__name__}")
        self.parts.append(s)
        self.size += len(s)
        if self.size > 65536:
            self.flush()
        return len(s)

    def flush(self):
        if self.parts:
            text, self.parts, self.size = "".join(self.parts), [], 0
            try:
                with self.ep.lock:
                    self.ep.send(("out", 0, self.stream, text))
            except OSError:
                pass


def serve(rfd, wfd, path):
    """The solution process: import `path` as module `solution`, say hello (its names), answer calls.
    At EOF (the runner is done) it waits to be killed: a solution process that ends by itself ended early."""
    policy = SolutionPolicy()
    ep = Endpoint(rfd, wfd, policy)
    policy.out = (_Forward(ep, 1), _Forward(ep, 2))
    sys.stdout, sys.stderr = policy.out
    spec = importlib.util.spec_from_file_location(SOLUTION_MODULE, path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[SOLUTION_MODULE] = module
    try:
        spec.loader.exec_module(module)
    except Exception as e:  # noqa: BLE001 - SystemExit and KeyboardInterrupt end the process (the run fails)
        policy.flush_output()
        with ep.lock:
            cls, args, text, note = policy.error_record(e)
            try:
                try:
                    ep.send(("import_error", 0, cls, args, text, note))
                except NotCrossable:
                    ep.send(("import_error", 0, cls, None, text, note))
            except BrokenPipeError:
                pass  # the runner is done already (see below)
        _idle(ep)
    names = [n for n in list(vars(module)) if type(n) is str]
    star = getattr(module, "__all__", None)
    if not (isinstance(star, (list, tuple)) and all(type(n) is str for n in star)):
        star = [n for n in names if not n.startswith("_")]
    policy.flush_output()
    try:
        with ep.lock:
            ep.send(("hello", 0, _AsHandle(module), list(star), names))
    except BrokenPipeError:
        # the runner ended before the hello (a test that never used the solution, e.g. a script that only reads
        # files): it is done, as at EOF; ending here (status 1) failed a correct check whenever the worker looked
        # at the solution after this and before it was killed
        _idle(ep)
    try:
        ep.serve_forever()
    except OSError:
        pass
    _idle(ep)


def _idle(ep):
    """Nothing more to do: wait to be killed (never exit by ourselves, see serve)."""
    import time

    try:
        os.close(ep.wfd)
    except OSError:
        pass
    while True:
        time.sleep(3600)


# ---------------------------------------------------------------- the runner's `solution` module


class SolutionModule(types.ModuleType):
    """Runner side: `solution`. Its attributes are asked of the solution process; functions and classes keep
    their proxies (so `solution.f is f`), plain values are read fresh each time."""

    def __getattr__(self, name):
        if not _forwardable(name) or name == "__doc__":
            raise AttributeError(name)
        d = types.ModuleType.__getattribute__(self, "__dict__")
        cached = d["_ef_cache"].get(name)
        if cached is not None:
            return cached
        value = d["_ef_ep"].request("getattr", d["_ef_handle"], name)
        d["_ef_ep"].policy.declare(value)
        if type(value) is SolutionClass or isinstance(value, SolutionFunction):
            d["_ef_cache"][name] = value
        return value

    def __setattr__(self, name, value):
        if not _forwardable(name):
            return types.ModuleType.__setattr__(self, name, value)
        d = types.ModuleType.__getattribute__(self, "__dict__")
        d["_ef_cache"].pop(name, None)
        d["_ef_ep"].request("setattr", d["_ef_handle"], name, value)

    def __delattr__(self, name):
        if not _forwardable(name):
            return types.ModuleType.__delattr__(self, name)
        d = types.ModuleType.__getattribute__(self, "__dict__")
        d["_ef_cache"].pop(name, None)
        d["_ef_ep"].request("delattr", d["_ef_handle"], name)

    def __dir__(self):
        d = types.ModuleType.__getattribute__(self, "__dict__")
        return sorted(set(d["_ef_names"]) | {k for k in d if not k.startswith("_ef_")})


def connect(ep):
    """Runner side: read the solution's hello and build the `solution` module (or raise its import error)."""
    policy = ep.policy
    with ep.lock:
        if ep.lost is not None:
            raise policy.lost_error(ep.lost)
        try:
            while True:
                message, _ = ep.receive()
                if message[0] == "out":
                    policy.output(message)
                    continue
                break
            if message[0] == "import_error":
                exc = policy.rebuild_error(("err",) + message[1:])
            elif message[0] == "hello" and len(message) == 5 and isinstance(message[2], SolutionObject) \
                    and type(message[3]) is list and type(message[4]) is list \
                    and all(type(n) is str for n in message[3] + message[4]):
                exc = None
            else:
                raise ChannelError(f"expected the solution's hello, got {message[0][:40]!r}")
        except (ChannelError, EOFError, OSError, MemoryError, RecursionError) as e:
            raise policy.lost_error(ep.fail(str(e))) from None
    if exc is not None:
        raise policy.reraised("import", (), exc)
    ep.connected = True
    module = SolutionModule(SOLUTION_MODULE)
    d = types.ModuleType.__getattribute__(module, "__dict__")
    d.update(_ef_ep=ep, _ef_handle=message[2], _ef_cache={}, _ef_names=message[4])
    d["__file__"] = None
    # `from solution import *`: the solution's public names that the test file uses without binding them itself
    # (its entry points), never one that would shadow a builtin or a name the test imports or defines
    wanted = policy.wanted_names()
    d["__all__"] = [n for n in message[3] if n.isidentifier() and not hasattr(builtins, n)
                    and not n.startswith("_ef_") and (wanted is None or n in wanted)]
    return module


class SolutionImporter:
    """Runner side: `import solution` connects to the solution process (once) and gives its module proxy."""

    def __init__(self, ep):
        self.ep = ep
        self.module = None

    def find_spec(self, name, path=None, target=None):
        if name != SOLUTION_MODULE:
            return None
        import importlib.machinery

        return importlib.machinery.ModuleSpec(name, self)

    def create_module(self, spec):
        if self.module is None:
            self.module = connect(self.ep)
        return self.module

    def exec_module(self, module):
        pass


def install_solution_importer(ep):
    """Runner side: make `solution` importable (a proxy; nothing of the solution's code is loaded here)."""
    sys.modules.pop(SOLUTION_MODULE, None)
    sys.meta_path.insert(0, SolutionImporter(ep))


def runner_endpoint(rfd, wfd, test_file):
    test_files = {test_file, os.path.abspath(test_file), os.path.realpath(test_file)}
    return Endpoint(rfd, wfd, RunnerPolicy(test_files))


def runner_state(ep):
    """(lost, not_checkable) of the runner's endpoint: what the final record carries."""
    lost = None if ep.lost is None else f"the solution process ended or broke the channel: {ep.lost}"
    return lost, ep.policy.not_checkable


def check_quiet(ep):
    """Runner side, once the tests are done: after its hello the solution speaks only when asked, so anything
    waiting in the pipe now was written outside a call (a thread left running, a forged reply): the run fails."""
    if not getattr(ep, "connected", False) or ep.lost is not None:
        return
    stray = bool(ep.buf)
    if not stray:
        try:
            os.set_blocking(ep.rfd, False)
            stray = bool(os.read(ep.rfd, 1))
        except BlockingIOError:
            stray = False
        except OSError:
            stray = False
    if stray:
        ep.fail("the solution wrote to the channel outside a call")


if __name__ == "__main__":  # the solution process of the per-run modes: bridge.py serve IN_FD OUT_FD PATH
    if len(sys.argv) != 5 or sys.argv[1] != "serve":
        raise SystemExit("usage: bridge.py serve IN_FD OUT_FD PATH")
    serve(int(sys.argv[2]), int(sys.argv[3]), sys.argv[4])
