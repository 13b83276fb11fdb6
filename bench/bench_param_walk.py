"""The walk of a stage flow's parameters through the modules, and the stage -> stage import edges (issue 35).

    .venv/bin/python bench/bench_param_walk.py                  # this checkout: sft_flow and ppo_flow
    .venv/bin/python bench/bench_param_walk.py --ref 42148e8    # another commit (a temporary git worktree)
    .venv/bin/python bench/bench_param_walk.py --walk           # and every hand-off, parameter by parameter

Read from the source (ast), nothing imported or run: an approximation, the same for every commit measured. A flow's
parameters are the fields of its one `params` model (SFTParams, PPOParams, with StageParams' config and overrides).
The walk follows each parameter from the flow function through every call that passes it on, as an argument or as
the object a method is called on: the parameter model itself (counted as `<params>`), a field read from it
(`params.out`: that parameter), a value computed from one (`str(params.out)`, `SFTFolder(out)`, `folder.model`,
what an evolforge function returns from it), and the settings the parameters make (`params.settings()`,
`run.settings`: counted as `<settings>` and `<settings.SECTION>`; a key the stage's `stage_overrides` mirrors from a
field, `settings.sft.epochs`, is that parameter). Calls are followed into evolforge's functions, methods of known
classes (by construction or annotation), properties, dataclass constructors and context managers (`with
stage_run(...) as run`); a call outside evolforge carries its arguments when it transforms them (str, Path, ...,
or a method of the value), nothing when it reads (a file, a table, a library's work: the data is not the
parameter); dict literals and dataclasses keep their keys apart.

    hand-off   a value carrying the parameter passes from one module to another as a call argument (returns are
               not hand-offs: the value goes on from the caller)
    room       a module the walk visits
    climb      a hand-off to a module of a higher layer (config < storage < tasks < flows < cli; within tasks the
               shared packages core, text, problems, report and sandbox, then the stage packages) or sideways, from
               one stage's package of tasks/ to another's
    return up  a value carrying the parameter returned to a module of a higher layer (a storage helper's result, a
               task module's result back to its flow): printed, not a climb

Counts: rooms (the distinct modules any parameter visits), climbs (distinct (parameter, from, to) hand-offs that
climb) and the module pairs they climb between. At 42148e8 (issue 35: "sft_flow's parameters climb 14 times,
ppo_flow's 21") this counts 13 and 20.
"""

from __future__ import annotations

import argparse
import ast
import sys
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PACKAGE_DIRS = ("config", "storage", "tasks", "flows", "cli", "deployments")
SHARED_TASKS = ("core", "text", "problems", "report", "sandbox")
FLOWS = {"sft": ("evolforge.flows.sft", "sft_flow"), "ppo": ("evolforge.flows.ppo", "ppo_flow")}
MAX_DEPTH = 12


# ---- the source -----------------------------------------------------------------------------------------------

@dataclass
class Module:
    name: str
    path: Path
    tree: ast.Module
    defs: dict[str, ast.AST] = field(default_factory=dict)  # top-level functions and classes
    imports: dict[str, tuple[str, str | None]] = field(default_factory=dict)  # alias -> (module, symbol or None)


def load_modules(root: Path) -> dict[str, Module]:
    mods: dict[str, Module] = {}
    for d in PACKAGE_DIRS:
        for path in sorted((root / d).rglob("*.py")):
            if "__pycache__" in path.parts:
                continue
            rel = path.relative_to(root).with_suffix("")
            name = ".".join(["evolforge", *[p for p in rel.parts if p != "__init__"]])
            mods[name] = Module(name, path, ast.parse(path.read_text(), str(path)))
    for m in mods.values():
        for node in m.tree.body:
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                m.defs[node.name] = node
        m.imports = imports_in(m.tree.body, mods)
    return mods


def imports_in(body: list[ast.stmt], mods: dict[str, Module]) -> dict[str, tuple[str, str | None]]:
    out: dict[str, tuple[str, str | None]] = {}
    for node in body:
        if isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("evolforge"):
            for a in node.names:
                sub = f"{node.module}.{a.name}"
                out[a.asname or a.name] = (sub, None) if sub in mods else (node.module, a.name)
        elif isinstance(node, ast.Import):
            for a in node.names:
                if a.name.startswith("evolforge") and a.asname:
                    out[a.asname] = (a.name, None)
    return out


def layer(module: str) -> float:
    parts = module.split(".")
    top = parts[1] if len(parts) > 1 else ""
    if top == "tasks":
        return 2.0 if len(parts) > 2 and parts[2] in SHARED_TASKS else 2.5
    return {"config": 0, "storage": 1, "flows": 3, "cli": 4, "deployments": 4}.get(top, 4)


def stage_pkg(module: str) -> str | None:
    parts = module.split(".")
    return parts[2] if len(parts) > 2 and parts[1] == "tasks" and parts[2] not in SHARED_TASKS else None


def climbs(a: str, b: str) -> bool:
    return layer(b) > layer(a) or (stage_pkg(a) is not None and stage_pkg(b) is not None and stage_pkg(a) != stage_pkg(b))


# ---- values ---------------------------------------------------------------------------------------------------

@dataclass(frozen=True)
class V:
    """What a value carries: parameter names (`fields`), or a whole object made of them (`obj`: "params", the
    parameter model; "settings", the settings; "settings.<section>"); its class (module, name) when known; its known
    attributes."""

    fields: frozenset = frozenset()
    obj: str = ""
    cls: tuple[str, str] | None = None
    attrs: tuple = ()  # ((name, V), ...)

    def attr(self, name: str) -> "V":
        for k, v in self.attrs:
            if k == name:
                return v
        return V(self.fields, self.obj)

    @property
    def empty(self) -> bool:
        return not self.fields and not self.obj


EMPTY = V()


def join(values) -> V:
    """A value computed from these: the one that carries something, else the union of their parameters (and the
    first whole object among them)."""
    values = [v for v in values if not v.empty]
    if len(values) == 1:
        return values[0]
    fields, obj = frozenset(), ""
    for v in values:
        fields |= v.fields
        obj = obj or v.obj
    return V(fields, obj)


# functions outside evolforge whose result is their argument transformed (a path, a string, a number); any other
# call outside evolforge (reading a file, parsing, a library's work) gives a value that carries no parameter
TRANSFORMS = {"str", "Path", "PurePosixPath", "UPath", "fspath", "join", "expanduser", "abspath", "int", "float",
              "bool", "dict", "list", "tuple", "set", "frozenset", "sorted", "min", "max", "getattr", "repr", "format",
              "dumps", "deepcopy", "copy"}
READS = {"read_text", "read_bytes", "open", "to_pylist", "iter_batches", "read", "readlines", "load", "loads",
         "iterdir", "glob", "rglob", "exists", "is_file", "is_dir", "stat"}


# ---- the walk -------------------------------------------------------------------------------------------------

class Walk:
    def __init__(self, mods: dict[str, Module], params_cls: tuple[str, str]):
        self.mods = mods
        self.params_cls = params_cls
        self.fields = self.model_fields(params_cls)
        self.mirrored = self.mirrored_fields(params_cls)  # settings section -> the fields it mirrors
        self.handoffs: set[tuple[str, str, str]] = set()  # (field, from module, to module)
        self.returns_up: set[tuple[str, str, str]] = set()
        self.rooms: dict[str, set[str]] = {}  # field -> modules
        self.memo: dict[tuple, V] = {}
        self.active: set[tuple] = set()

    # the parameter model
    def classdef(self, ref: tuple[str, str]) -> ast.ClassDef | None:
        m = self.mods.get(ref[0])
        node = m.defs.get(ref[1]) if m else None
        if node is None and m and ref[1] in m.imports:
            mod, sym = m.imports[ref[1]]
            return self.classdef((mod, sym)) if sym else None
        return node if isinstance(node, ast.ClassDef) else None

    def resolve_class(self, module: str, name: str) -> tuple[str, str] | None:
        m = self.mods.get(module)
        if m is None:
            return None
        if isinstance(m.defs.get(name), ast.ClassDef):
            return (module, name)
        if name in m.imports:
            mod, sym = m.imports[name]
            if sym:
                return self.resolve_class(mod, sym)
        return None

    def bases(self, ref: tuple[str, str]) -> list[tuple[str, str]]:
        out, todo = [], [ref]
        while todo:
            r = todo.pop(0)
            node = self.classdef(r)
            if node is None or r in out:
                continue
            out.append(r)
            for b in node.bases:
                if isinstance(b, ast.Name) and (res := self.resolve_class(r[0], b.id)):
                    todo.append(res)
        return out

    def model_fields(self, ref: tuple[str, str]) -> list[str]:
        names = []
        for r in reversed(self.bases(ref)):
            for node in self.classdef(r).body:
                if isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name) \
                        and node.target.id != "model_config" and node.target.id not in names:
                    names.append(node.target.id)
        return names

    def mirrored_fields(self, ref: tuple[str, str]) -> dict[str, dict[str, str]]:
        """Settings section -> {settings key: the parameter `stage_overrides` puts there}: the section named by a
        string constant, its keys the parameters named (string constants, self.<field>), a key of another name
        where a subscript `[...]["key"] = self.<field>` sets it."""
        from_settings = self.model_fields(("evolforge.config.settings", "Settings"))
        for r in self.bases(ref):
            node = self.classdef(r)
            method = next((n for n in node.body if isinstance(n, ast.FunctionDef) and n.name == "stage_overrides"), None)
            if method is None:
                continue
            sections, keys = set(), {}
            for n in ast.walk(method):
                if isinstance(n, ast.Constant) and isinstance(n.value, str):
                    if n.value in from_settings:
                        sections.add(n.value)
                    elif n.value in self.fields:
                        keys[n.value] = n.value
                if isinstance(n, ast.Attribute) and isinstance(n.value, ast.Name) and n.value.id == "self" \
                        and n.attr in self.fields:
                    keys.setdefault(n.attr, n.attr)
                if isinstance(n, ast.Assign) and isinstance(n.targets[0], ast.Subscript) \
                        and isinstance(n.targets[0].slice, ast.Constant) and isinstance(n.value, ast.Attribute) \
                        and isinstance(n.value.value, ast.Name) and n.value.value.id == "self":
                    keys.pop(n.value.attr, None)
                    keys[n.targets[0].slice.value] = n.value.attr
            return {s: dict(keys) for s in sections}
        return {}

    def params_value(self) -> V:
        return V(frozenset(), "params", self.params_cls, tuple((f, V(frozenset({f}))) for f in self.fields))

    def settings_value(self) -> V:
        sections = self.model_fields(("evolforge.config.settings", "Settings"))
        attrs = tuple((sec, V(frozenset(), f"settings.{sec}", None,
                              tuple((key, V(frozenset({f}))) for key, f in self.mirrored.get(sec, {}).items())))
                      for sec in sections)
        return V(frozenset(), "settings", ("evolforge.config.settings", "Settings"), attrs)

    # recording
    @staticmethod
    def carried(v: V) -> list[str]:
        return sorted(v.fields) + ([f"<{v.obj}>"] if v.obj else [])

    def visit(self, module: str, v: V) -> None:
        for f in self.carried(v):
            self.rooms.setdefault(f, set()).add(module)

    def hand(self, a: str, b: str, v: V) -> None:
        if a != b:
            for f in self.carried(v):
                self.handoffs.add((f, a, b))
        self.visit(b, v)

    # functions
    def function(self, module: str, name: str) -> tuple[str, ast.FunctionDef] | None:
        m = self.mods.get(module)
        if m is None:
            return None
        node = m.defs.get(name)
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            return module, node
        if name in m.imports:
            mod, sym = m.imports[name]
            if sym:
                return self.function(mod, sym)
        return None

    def method(self, cls: tuple[str, str], name: str) -> tuple[str, ast.FunctionDef, bool] | None:
        for r in self.bases(cls):
            for n in self.classdef(r).body:
                if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef)) and n.name == name:
                    prop = any(isinstance(d, ast.Name) and d.id in ("property", "cached_property") for d in n.decorator_list)
                    return r[0], n, prop
        return None

    def call_function(self, caller: str, module: str, fn: ast.FunctionDef, args: list[V], kwargs: dict[str, V],
                      depth: int, self_value: V | None = None) -> V:
        bound: dict[str, V] = {}
        params = [a.arg for a in fn.args.posonlyargs + fn.args.args]
        if self_value is not None and params:
            bound[params[0]] = self_value
            params = params[1:]
        for name, v in zip(params, args):
            bound[name] = v
        for name, v in kwargs.items():
            bound[name] = v
        for a in fn.args.posonlyargs + fn.args.args + fn.args.kwonlyargs:  # an annotated class: its methods resolve
            v = bound.get(a.arg)
            if v is not None and v.cls is None and not v.obj and not v.empty and isinstance(a.annotation, ast.Name):
                if (c := self.resolve_class(module, a.annotation.id)):
                    bound[a.arg] = V(v.fields, v.obj, c, v.attrs)
        for v in [*args, *kwargs.values(), *([self_value] if self_value else [])]:
            self.hand(caller, module, v)
        key = (module, fn.name, fn.lineno, tuple(sorted((k, v.fields, v.obj) for k, v in bound.items() if not v.empty)))
        if key in self.memo:
            result = self.memo[key]
        elif key in self.active or depth > MAX_DEPTH:
            result = join(bound.values())
        else:
            self.active.add(key)
            result = Body(self, module, fn, bound, depth + 1).run()
            self.active.discard(key)
            self.memo[key] = result
        if result.empty and isinstance(fn.returns, ast.Name) and (c := self.resolve_class(module, fn.returns.id)):
            result = V(cls=c)  # nothing of the parameters, but its class: its methods resolve
        if module != caller and layer(caller) > layer(module):
            for f in self.carried(result):
                self.returns_up.add((f, module, caller))
        return result

    def construct(self, caller: str, cls: tuple[str, str], args: list[V], kwargs: dict[str, V], depth: int) -> V:
        node = self.classdef(cls)
        for v in [*args, *kwargs.values()]:
            self.hand(caller, cls[0], v)
        init = self.method(cls, "__init__")
        if init is not None and init[0] != "":
            self.call_function(cls[0], init[0], init[1], args, kwargs, depth, self_value=V(join([*args, *kwargs.values()]).fields, "", cls))
        names = [n.target.id for r in reversed(self.bases(cls)) for n in self.classdef(r).body
                 if isinstance(n, ast.AnnAssign) and isinstance(n.target, ast.Name)] if node else []
        attrs = dict(zip(names, args))
        attrs.update(kwargs)
        made = join([*args, *kwargs.values()])  # a record of what it was made from: its parameters; the objects
        return V(made.fields, "", cls, tuple(attrs.items()))  # in it are its attributes


class Body:
    """One function's body, walked in order with the values of its locals."""

    def __init__(self, walk: Walk, module: str, fn: ast.FunctionDef, bound: dict[str, V], depth: int):
        self.w, self.module, self.fn, self.depth = walk, module, fn, depth
        self.env: dict[str, V] = dict(bound)
        self.local_imports = imports_in([n for n in ast.walk(fn) if isinstance(n, (ast.Import, ast.ImportFrom))],
                                        walk.mods)
        self.result = EMPTY
        self.yielded: V | None = None
        for v in bound.values():
            walk.visit(module, v)

    def run(self) -> V:
        self.block(self.fn.body)
        return self.yielded if self.yielded is not None else self.result

    def block(self, body: list[ast.stmt]) -> None:
        for st in body:
            self.stmt(st)

    def assign(self, target: ast.expr, v: V) -> None:
        if isinstance(target, ast.Name):
            old = self.env.get(target.id)
            self.env[target.id] = v if old is None or old.empty or v.cls is not None or v.obj else join([v, old])
        elif isinstance(target, (ast.Tuple, ast.List)):
            for t in target.elts:
                self.assign(t, V(v.fields, v.obj))
        if not v.empty:
            self.w.visit(self.module, v)

    def stmt(self, st: ast.stmt) -> None:
        if isinstance(st, ast.Assign):
            if isinstance(st.value, ast.Tuple) and all(isinstance(t, ast.Tuple) and len(t.elts) == len(st.value.elts)
                                                       for t in st.targets):  # a, b = x, y: element by element
                values = [self.expr(e) for e in st.value.elts]
                for t in st.targets:
                    for target, v in zip(t.elts, values):
                        self.assign(target, v)
                return
            v = self.expr(st.value)
            for t in st.targets:
                self.assign(t, v)
        elif isinstance(st, (ast.AnnAssign, ast.AugAssign)) and st.value is not None:
            self.assign(st.target, self.expr(st.value))
        elif isinstance(st, ast.Return) and st.value is not None:
            self.result = join([self.result, self.expr(st.value)])
        elif isinstance(st, ast.Expr):
            if isinstance(st.value, (ast.Yield, ast.YieldFrom)) and st.value.value is not None:
                self.yielded = self.expr(st.value.value)
            else:
                self.expr(st.value)
        elif isinstance(st, (ast.With, ast.AsyncWith)):
            for item in st.items:
                v = self.expr(item.context_expr)
                if item.optional_vars is not None:
                    self.assign(item.optional_vars, v)
            self.block(st.body)
        elif isinstance(st, (ast.If, ast.While)):
            self.expr(st.test)
            self.block(st.body)
            self.block(st.orelse)
        elif isinstance(st, (ast.For, ast.AsyncFor)):
            self.assign(st.target, V(self.expr(st.iter).fields))
            self.block(st.body)
            self.block(st.orelse)
        elif isinstance(st, ast.Try):
            self.block(st.body)
            for h in st.handlers:
                self.block(h.body)
            self.block(st.orelse)
            self.block(st.finalbody)
        elif isinstance(st, ast.Raise) and st.exc is not None:
            self.expr(st.exc)

    def expr(self, e: ast.expr | None) -> V:
        if e is None:
            return EMPTY
        if isinstance(e, ast.Name):
            return self.env.get(e.id, EMPTY)
        if isinstance(e, ast.Attribute):
            base = self.expr(e.value)
            if base.empty and not base.attrs:
                return EMPTY
            if base.cls is not None and base.obj != "params":
                prop = self.w.method(base.cls, e.attr)
                if prop is not None and prop[2]:
                    return self.w.call_function(self.module, prop[0], prop[1], [], {}, self.depth, self_value=base)
            if base.obj == "params" or base.obj.startswith("settings"):
                got = base.attr(e.attr)
                if got.fields:  # a parameter read from the model (or a mirrored setting): a room of its own
                    self.w.visit(self.module, got)
                return got if (got.attrs or got.obj or got.fields) else EMPTY
            return base.attr(e.attr)
        if isinstance(e, ast.Call):
            return self.call(e)
        if isinstance(e, (ast.Yield, ast.YieldFrom)):
            v = self.expr(e.value)
            self.yielded = v
            return v
        if isinstance(e, ast.Lambda):
            return self.expr(e.body)
        if isinstance(e, (ast.ListComp, ast.SetComp, ast.GeneratorExp, ast.DictComp)):
            for g in e.generators:
                self.assign(g.target, V(self.expr(g.iter).fields))
            parts = [e.key, e.value] if isinstance(e, ast.DictComp) else [e.elt]
            return join(self.expr(p) for p in parts)
        if isinstance(e, ast.Dict) and all(isinstance(k, ast.Constant) and isinstance(k.value, str) for k in e.keys):
            items = [(k.value, self.expr(v)) for k, v in zip(e.keys, e.values)]  # a record: its keys are attributes
            made = join(v for _, v in items)
            return V(made.fields, "", None, tuple(items)) if not made.empty else EMPTY
        if isinstance(e, ast.Subscript) and isinstance(e.slice, ast.Constant) and isinstance(e.slice.value, str):
            base = self.expr(e.value)
            return base.attr(e.slice.value) if base.attrs else base
        if isinstance(e, ast.IfExp):  # the value is one of the branches; the test is not in it
            self.expr(e.test)
            return join([self.expr(e.body), self.expr(e.orelse)])
        if isinstance(e, ast.Compare):  # a truth value
            self.expr(e.left)
            for c in e.comparators:
                self.expr(c)
            return EMPTY
        if isinstance(e, ast.NamedExpr):
            v = self.expr(e.value)
            self.assign(e.target, v)
            return v
        return join(self.expr(c) for c in ast.iter_child_nodes(e) if isinstance(c, ast.expr))

    def callee(self, func: ast.expr):
        """What a call calls: ("function", module, node) | ("class", ref) | ("method", base value, name) | None."""
        if isinstance(func, ast.Name):
            name = func.id
            if name in self.local_imports:
                mod, sym = self.local_imports[name]
                if sym:
                    if (f := self.w.function(mod, sym)):
                        return ("function", *f)
                    if (c := self.w.resolve_class(mod, sym)):
                        return ("class", c)
                return None
            if name in self.env:
                return None
            if (f := self.w.function(self.module, name)):
                return ("function", *f)
            if (c := self.w.resolve_class(self.module, name)):
                return ("class", c)
            return None
        if isinstance(func, ast.Attribute):
            if isinstance(func.value, ast.Name) and func.value.id not in self.env:
                imports = {**self.w.mods[self.module].imports, **self.local_imports}
                target = imports.get(func.value.id)
                if target and target[1] is None:
                    if (f := self.w.function(target[0], func.attr)):
                        return ("function", *f)
                    if (c := self.w.resolve_class(target[0], func.attr)):
                        return ("class", c)
                    return None
                if target is None and not (self.w.resolve_class(self.module, func.value.id)
                                           or func.value.id in self.local_imports):
                    return None  # a library's function (pl.read_parquet, json.dumps)
            return ("method", func.value, func.attr)
        return None

    def call(self, e: ast.Call) -> V:
        args = [self.expr(a.value if isinstance(a, ast.Starred) else a) for a in e.args]
        kwargs = {k.arg: self.expr(k.value) for k in e.keywords if k.arg}
        extra = join(self.expr(k.value) for k in e.keywords if not k.arg)
        target = self.callee(e.func)
        if target is None and not isinstance(e.func, (ast.Name, ast.Attribute)):  # f(...)(x): made from x
            self.expr(e.func)
            return join([*args, *kwargs.values(), extra])
        if target is None:
            name = e.func.attr if isinstance(e.func, ast.Attribute) else e.func.id if isinstance(e.func, ast.Name) else ""
            if isinstance(e.func, ast.Name) and e.func.id in self.env:  # a callable passed in: what it was given
                return join([self.env[e.func.id], *args, *kwargs.values(), extra])
            if isinstance(e.func, ast.Attribute) and not (isinstance(e.func.value, ast.Name)
                                                          and e.func.value.id not in self.env):
                base = self.expr(e.func.value)  # a method outside evolforge on a value: it is that value, transformed
                return EMPTY if name in READS else join([base, *args, *kwargs.values(), extra])
            if name == "getattr" and args and args[0].obj == "params":
                const = e.args[1] if len(e.args) > 1 else None
                field_name = const.value if isinstance(const, ast.Constant) else "out"  # by a variable: out_field
                got = args[0].attr(field_name)
                self.w.visit(self.module, got)
                return got
            return join([*args, *kwargs.values(), extra]) if name in TRANSFORMS else EMPTY
        if target[0] == "function":
            return self.w.call_function(self.module, target[1], target[2], args, kwargs, self.depth)
        if target[0] == "class":
            return self.w.construct(self.module, target[1], args, kwargs, self.depth)
        base = self.expr(target[1])
        name = target[2]
        if base.obj == "params" and name == "settings":  # the settings the parameters make (config, overrides
            found = self.w.method(base.cls, name)      # and the mirrored fields read there): the settings object
            if found:
                self.w.call_function(self.module, found[0], found[1], args, kwargs, self.depth, self_value=base)
            return self.w.settings_value()
        if base.cls is not None:
            found = self.w.method(base.cls, name)
            if found is not None:
                return self.w.call_function(self.module, found[0], found[1], args, kwargs, self.depth, self_value=base)
        return join([base, *args, *kwargs.values(), extra])


def measure(root: Path) -> dict:
    mods = load_modules(root)
    out = {}
    for stage, (module, flow) in FLOWS.items():
        fn = mods[module].defs[flow]
        ann = fn.args.args[0].annotation
        params_cls = Walk(mods, ("", "")).resolve_class(module, ann.id)
        walk = Walk(mods, params_cls)
        walk.call_function(module, module, fn, [walk.params_value()], {}, 0)
        climbing = {(f, a, b) for f, a, b in walk.handoffs if climbs(a, b)}
        out[stage] = {"fields": walk.fields, "rooms": sorted(set().union(*walk.rooms.values())),
                      "per_field_rooms": {f: sorted(walk.rooms.get(f, ())) for f in walk.fields},
                      "handoffs": sorted(walk.handoffs), "climbs": sorted(climbing),
                      "climbing_pairs": sorted({(a, b) for _, a, b in climbing}),
                      "returns_up": sorted(walk.returns_up)}
    return out


def stage_edges(root: Path) -> dict[str, int]:
    """Stage -> stage import edges of tasks/: the architecture test's definition (both ends neither core, text,
    problems, report nor sandbox) and the issue's first count (both ends neither core, text nor problems)."""
    mods = load_modules(root)
    test, issue = set(), set()
    for name, m in mods.items():
        src = name.split(".")[2] if name.startswith("evolforge.tasks.") else None
        if src is None:
            continue
        for node in ast.walk(m.tree):
            targets = [node.module] if isinstance(node, ast.ImportFrom) and node.module else \
                [a.name for a in node.names] if isinstance(node, ast.Import) else []
            for t in targets:
                parts = t.split(".")
                if len(parts) > 2 and parts[1] == "tasks" and ".".join(parts[:3]) in mods and parts[2] != src:
                    if src not in ("core", "text", "problems") and parts[2] not in ("core", "text", "problems"):
                        issue.add((src, parts[2]))
                        if src not in SHARED_TASKS and parts[2] not in SHARED_TASKS:
                            test.add((src, parts[2]))
    return {"stage_to_stage": len(test), "without_core_text_problems": len(issue)}


def short(module: str) -> str:
    return module.removeprefix("evolforge.")


def report(root: Path, label: str, show_walk: bool) -> None:
    edges = stage_edges(root)
    print(f"== {label}")
    print(f"stage -> stage import edges in tasks/: {edges['stage_to_stage']} (shared: {', '.join(SHARED_TASKS)}); "
          f"{edges['without_core_text_problems']} counting report and sandbox as stages")
    for stage, r in measure(root).items():
        print(f"{stage}_flow: {len(r['fields'])} parameters, {len(r['rooms'])} rooms, {len(r['climbs'])} climbs "
              f"({len(r['climbing_pairs'])} module pairs), {len(r['handoffs'])} hand-offs, "
              f"{len(r['returns_up'])} returns up")
        for a, b in r["climbing_pairs"]:
            names = sorted(f for f, x, y in r["climbs"] if (x, y) == (a, b))
            print(f"    climb {short(a)} -> {short(b)}: {', '.join(names)}")
        if show_walk:
            for f in r["fields"]:
                print(f"    {f}: {len(r['per_field_rooms'][f])} rooms")
                for _, a, b in (h for h in r["handoffs"] if h[0] == f):
                    print(f"        {short(a)} -> {short(b)}{'   CLIMB' if climbs(a, b) else ''}")
            for f, a, b in r["returns_up"]:
                print(f"    return up {f}: {short(a)} -> {short(b)}")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--ref", action="append", default=[], help="also measure this commit (a git worktree)")
    ap.add_argument("--walk", action="store_true", help="print every hand-off, parameter by parameter")
    args = ap.parse_args(argv)
    for ref in args.ref:
        from evolforge.testing.ref_tree import ref_tree

        with ref_tree(ref) as (tree, _):
            report(tree, ref, args.walk)
    report(ROOT, "this checkout", args.walk)
    return 0


if __name__ == "__main__":
    sys.exit(main())
