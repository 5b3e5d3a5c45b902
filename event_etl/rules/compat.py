"""Schema compatibility by Avro's resolution rules, with the field and the reason of every problem.

Pure functions over schemas as JSON values (what ``json.load`` gives for an ``.avsc`` file):
no I/O, no clock, no fastavro.  The rules are those of the Avro specification, "Schema
Resolution" (data written with a *writer* schema, read with a *reader* schema):

- primitives match when equal, or when the writer's type is promoted to the reader's:
  ``int`` to ``long``, ``float`` or ``double``; ``long`` to ``float`` or ``double``;
  ``float`` to ``double``; ``string`` to ``bytes`` and ``bytes`` to ``string``;
- records, enums and fixed types match when their unqualified names are equal, or the
  reader lists the writer's name among its ``aliases``; fixed types also need equal sizes;
- record fields are matched by name (or a reader field's ``aliases``); a writer field the
  reader does not have is skipped; a reader field the writer does not have takes its
  ``default``, and without one the data cannot be read;
- an enum symbol the reader does not have is read as the reader enum's ``default``, and
  without one the data cannot be read;
- arrays and maps resolve their items and values;
- a writer union resolves each of its branches; a reader union takes the first branch that
  matches the writer's type;
- logical types are carried by their underlying type (``timestamp-millis`` is a ``long``),
  except decimals, which match only with equal precision and scale.  A change of logical type
  that Avro resolves is reported as a *note*: the bytes read, the meaning may not.

``reader_problems(reader, writer)`` lists why ``reader`` cannot read data written with
``writer`` (empty: it can).  ``compatibility(new, old)`` answers both questions a schema
change raises: can the new schema read what the old one wrote (*backward*), and can readers
of the old schema read what the new one writes (*forward*)?  Both: *full*.  Problems name a
field path (``price.amount``, ``lines[].sku``, ``attributes{}``) and say what changed from the
old schema to the new one, e.g. ``field `price.amount`: type changed from long to string, not
promotable``.
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

__all__ = ["Problem", "Compatibility", "reader_problems", "compatibility", "describe_type", "PROMOTIONS"]

PRIMITIVES = frozenset({"null", "boolean", "int", "long", "float", "double", "bytes", "string"})
NAMED = frozenset({"record", "error", "enum", "fixed"})
_KEYWORDS = PRIMITIVES | NAMED | {"array", "map"}
PROMOTIONS: dict[str, frozenset[str]] = {
    "int": frozenset({"long", "float", "double"}),
    "long": frozenset({"float", "double"}),
    "float": frozenset({"double"}),
    "string": frozenset({"bytes"}),
    "bytes": frozenset({"string"}),
}
"""Writer type -> the reader types it is promoted to (Avro specification, "Schema Resolution")."""

_INT_RANGE = {"int": (-(2**31), 2**31 - 1), "long": (-(2**63), 2**63 - 1)}


@dataclass(frozen=True)
class Problem:
    """Why one part of a schema cannot be read (or, as a note, what changes meaning).

    ``path`` is the field's path from the top record (``""``: the record itself), ``kind`` a
    short code (``type_changed``, ``field_added_without_default``, ``field_removed_without_default``,
    ``symbols_missing``, ``union_branch_missing``, ``name_changed``, ``size_changed``,
    ``decimal_changed``, ``bad_default``, ``logical_type_changed``), ``message`` the reason.
    """

    path: str
    kind: str
    message: str

    def __str__(self) -> str:
        return f"field `{self.path}`: {self.message}" if self.path else self.message


@dataclass(frozen=True)
class Compatibility:
    """How a new schema relates to an old one."""

    backward: tuple[Problem, ...]
    """Why the new schema cannot read data written with the old one (empty: it can)."""
    forward: tuple[Problem, ...]
    """Why readers of the old schema cannot read data written with the new one (empty: they can)."""
    notes: tuple[Problem, ...] = field(default=())
    """Changes Avro resolves that may still change what values mean (logical types)."""

    @property
    def is_backward(self) -> bool:
        return not self.backward

    @property
    def is_forward(self) -> bool:
        return not self.forward

    @property
    def level(self) -> str:
        """``full``, ``backward``, ``forward`` or ``none``."""
        if not self.backward and not self.forward:
            return "full"
        if not self.backward:
            return "backward"
        if not self.forward:
            return "forward"
        return "none"


def compatibility(new: Any, old: Any) -> Compatibility:
    """Whether ``new`` reads data of ``old`` (backward) and ``old`` reads data of ``new`` (forward), with reasons."""
    back = _Checker(reader=new, writer=old, reader_is_new=True)
    back.run()
    fwd = _Checker(reader=old, writer=new, reader_is_new=False)
    fwd.run()
    return Compatibility(tuple(back.problems), tuple(fwd.problems), tuple(back.notes))


def reader_problems(reader: Any, writer: Any, *, reader_is_new: bool = True) -> list[Problem]:
    """Why ``reader`` cannot read data written with ``writer`` (empty: it can).

    Messages speak of the change from the old schema to the new one; ``reader_is_new`` says
    which of the two the reader is (a consumer reading old hours with today's schema: True).
    """
    c = _Checker(reader=reader, writer=writer, reader_is_new=reader_is_new)
    c.run()
    return c.problems


def describe_type(t: Any) -> str:
    """A short name of an Avro type for messages: ``long``, ``long (timestamp-millis)``, ``record Money``,
    ``array<string>``."""
    return _describe(t, {}, "")


# -- names ---------------------------------------------------------------------------------------
def _full_name(name: str, namespace: str | None) -> str:
    if "." in name or not namespace:
        return name
    return f"{namespace}.{name}"


def _short(name: str) -> str:
    return name.rsplit(".", 1)[-1]


def _index(t: Any, ns: str, names: dict[str, Any]) -> None:
    """Record every named type of ``t`` in ``names`` by full name (as ``(schema, its namespace)``)."""
    if isinstance(t, list):
        for b in t:
            _index(b, ns, names)
        return
    if not isinstance(t, dict):
        return
    kind = t.get("type")
    if isinstance(kind, (dict, list)):
        _index(kind, ns, names)
        return
    if kind in NAMED and isinstance(t.get("name"), str):
        full = _full_name(t["name"], t.get("namespace", ns))
        inner_ns = full.rsplit(".", 1)[0] if "." in full else ""
        if full in names:
            return
        names[full] = (t, inner_ns)
        if kind in ("record", "error"):
            for f in t.get("fields", []):
                _index(f.get("type"), inner_ns, names)
    elif kind == "array":
        _index(t.get("items"), ns, names)
    elif kind == "map":
        _index(t.get("values"), ns, names)


class _Side:
    """One schema's named types, to follow references by name."""

    def __init__(self, schema: Any) -> None:
        self.names: dict[str, Any] = {}
        _index(schema, "", self.names)

    def deref(self, t: Any, ns: str) -> tuple[Any, str]:
        """``(t, namespace)`` with a reference to a named type replaced by its definition."""
        while True:
            if isinstance(t, str) and t not in PRIMITIVES:
                hit = self.names.get(_full_name(t, ns)) or self.names.get(t)
                if hit is None:
                    return t, ns  # unknown name: reported by whoever looks at it
                t, ns = hit
                continue
            if isinstance(t, dict) and len(t) == 1 and (
                    isinstance(t.get("type"), (dict, list)) or t.get("type") not in _KEYWORDS):
                t = t["type"]  # {"type": {...}} or {"type": "SomeName"}: the type itself
                continue
            return t, ns


def _kind(t: Any) -> str:
    """``null``..``string``, ``record``, ``enum``, ``fixed``, ``array``, ``map``, ``union``, or ``unknown``."""
    if isinstance(t, list):
        return "union"
    if isinstance(t, str):
        return t if t in PRIMITIVES else "unknown"
    if isinstance(t, dict):
        k = t.get("type")
        if k == "error":
            return "record"
        if isinstance(k, str) and (k in PRIMITIVES or k in NAMED or k in ("array", "map")):
            return k
        if isinstance(k, (dict, list)):
            return _kind(k)
    return "unknown"


def _logical(t: Any) -> str | None:
    if isinstance(t, dict):
        lt = t.get("logicalType")
        return lt if isinstance(lt, str) else None
    return None


def _describe(t: Any, names: dict[str, Any], ns: str) -> str:
    k = _kind(t)
    if k == "union":
        return "union [" + ", ".join(_describe(b, names, ns) for b in t) + "]"
    if k == "unknown":
        return str(t) if isinstance(t, str) else "an unknown type"
    if isinstance(t, dict) and isinstance(t.get("type"), (dict, list)):
        return _describe(t["type"], names, ns)
    lt = _logical(t)
    if k in ("record", "enum", "fixed"):
        text = f"{k} {_short(t['name'])}" if isinstance(t, dict) else str(t)
        if k == "fixed" and isinstance(t, dict):
            text += f"({t.get('size')})"
        if lt == "decimal":
            text += f" (decimal {t.get('precision')},{t.get('scale', 0)})"
        elif lt:
            text += f" ({lt})"
        return text
    if k == "array":
        return f"array<{_describe(t.get('items'), names, ns)}>"
    if k == "map":
        return f"map<{_describe(t.get('values'), names, ns)}>"
    if lt == "decimal":
        return f"{k} (decimal {t.get('precision')},{t.get('scale', 0)})"
    return f"{k} ({lt})" if lt else k


def _join(path: str, name: str) -> str:
    return f"{path}.{name}" if path else name


# -- the check -------------------------------------------------------------------------------------
class _Checker:
    """Walks a reader and a writer schema together, collecting problems and notes."""

    def __init__(self, *, reader: Any, writer: Any, reader_is_new: bool) -> None:
        self.reader, self.writer = reader, writer
        self.r_side, self.w_side = _Side(reader), _Side(writer)
        self.reader_is_new = reader_is_new
        self.problems: list[Problem] = []
        self.notes: list[Problem] = []
        self._active: set[tuple[int, int]] = set()  # (writer, reader) records being checked: recursive types

    # wording: every message speaks of the change from the old schema to the new one
    def _old_new(self, w: str, r: str) -> tuple[str, str]:
        return (w, r) if self.reader_is_new else (r, w)

    def _who_cannot_read(self) -> str:
        return "the new schema cannot read data written with the old one" if self.reader_is_new else \
            "readers of the old schema cannot read data written with the new one"

    def add(self, path: str, kind: str, message: str) -> None:
        self.problems.append(Problem(path, kind, message))

    def run(self) -> None:
        self.check(self.writer, "", self.reader, "", "")

    def desc(self, t: Any, ns: str, side: _Side) -> str:
        return _describe(t, side.names, ns)

    def check(self, w: Any, wns: str, r: Any, rns: str, path: str) -> None:
        w, wns = self.w_side.deref(w, wns)
        r, rns = self.r_side.deref(r, rns)
        wk, rk = _kind(w), _kind(r)
        if wk == "unknown" or rk == "unknown":
            t = w if wk == "unknown" else r
            self.add(path, "unknown_type", f"refers to the unknown type {t!r}")
            return
        if wk == "union":
            self._writer_union(w, wns, r, rns, path)
            return
        if rk == "union":
            branch = self._first_match(w, wns, r, rns)
            if branch is None:
                old, new = self._old_new(self.desc(w, wns, self.w_side), self.desc(r, rns, self.r_side))
                if self.reader_is_new:
                    why = f"the new union has no branch for {old}"
                else:
                    why = f"readers of the old union cannot read {new}"
                self.add(path, "type_changed", f"type changed from {old} to {new}: {why}")
                return
            self.check(w, wns, branch, rns, path)
            return
        self._same_kind_or_promoted(w, wns, wk, r, rns, rk, path)

    def _writer_union(self, w: list[Any], wns: str, r: Any, rns: str, path: str) -> None:
        if _kind(r) == "union":
            missing = []
            for b in w:
                rb = self._first_match(b, wns, r, rns)
                if rb is None:
                    missing.append(b)
                else:
                    self.check(b, wns, rb, rns, path)
            unread = [b for b in r if not any(self._first_match(x, wns, [b], rns) is not None for x in w)]
            if len(missing) == 1 and len(unread) == 1 and len(w) == len(r):
                # one branch changed, e.g. ["null", "long"] to ["null", "string"]: say it as a type change
                mb, mns = self.w_side.deref(missing[0], wns)
                ub, uns = self.r_side.deref(unread[0], rns)
                new_union = self.desc(r, rns, self.r_side) if self.reader_is_new else self.desc(w, wns, self.w_side)
                self.add(path, "type_changed", f"{self._type_change(mb, mns, ub, uns)} (now {new_union})")
                missing = []
            if missing:
                shown = ", ".join(self.desc(b, wns, self.w_side) for b in missing)
                old, new = self._old_new(self.desc(w, wns, self.w_side), self.desc(r, rns, self.r_side))
                if self.reader_is_new:
                    why = f"branch {shown} removed: values of it written with the old schema cannot be read"
                else:
                    why = f"branch {shown} added: readers of the old schema cannot read such values"
                self.add(path, "union_branch_missing", f"union changed from {old} to {new}: {why}")
            return
        bad = [b for b in w if self._first_match(b, wns, [r], rns) is None]
        if bad:
            shown = ", ".join(self.desc(b, wns, self.w_side) for b in bad)
            old, new = self._old_new(self.desc(w, wns, self.w_side), self.desc(r, rns, self.r_side))
            if self.reader_is_new:
                why = f"values {shown} written with the old schema cannot be read as {new}"
            else:
                why = f"readers of the old schema cannot read the new values {shown} as {old}"
            self.add(path, "type_changed", f"type changed from {old} to {new}: {why}")
        for b in w:
            if b not in bad:
                self.check(b, wns, r, rns, path)

    def _first_match(self, w: Any, wns: str, branches: list[Any], rns: str) -> Any:
        """The first reader union branch that matches the writer's (non-union) type, or ``None``."""
        w, wns = self.w_side.deref(w, wns)
        wk = _kind(w)
        for b in branches:
            rb, bns = self.r_side.deref(b, rns)
            rk = _kind(rb)
            if rk == wk and (wk not in ("record", "enum", "fixed") or self._names_match(w, wns, rb, bns)):
                return b
            if rk in PROMOTIONS.get(wk, ()):
                return b
        return None

    def _names_match(self, w: dict[str, Any], wns: str, r: dict[str, Any], rns: str) -> bool:
        wname, rname = w.get("name", ""), r.get("name", "")
        if _short(wname) == _short(rname):
            return True
        wfull = _full_name(wname, w.get("namespace", wns) or None)
        r_ns = r.get("namespace", rns)
        for alias in r.get("aliases") or []:
            if alias == wfull or _full_name(alias, r_ns or None) == wfull or _short(alias) == _short(wname):
                return True
        return False

    def _same_kind_or_promoted(self, w: Any, wns: str, wk: str, r: Any, rns: str, rk: str, path: str) -> None:
        if wk != rk:
            if rk in PROMOTIONS.get(wk, ()):
                self._logical_note(w, r, path)
                return
            self.add(path, "type_changed", self._type_change(w, wns, r, rns))
            return
        if wk in ("record", "enum", "fixed") and not self._names_match(w, wns, r, rns):
            old, new = self._old_new(_short(w["name"]), _short(r["name"]))
            fix = (f"; add \"aliases\": [\"{old}\"] to the new {rk}" if self.reader_is_new else
                   "; readers of the old schema do not know the new name")
            self.add(path, "name_changed", f"{rk} name changed from {old} to {new}{fix}")
            return
        if wk == "record":
            self._record(w, wns, r, rns, path)
        elif wk == "enum":
            self._enum(w, r, path)
        elif wk == "fixed":
            if w.get("size") != r.get("size"):
                old, new = self._old_new(str(w.get("size")), str(r.get("size")))
                self.add(path, "size_changed", f"fixed {_short(r['name'])}: size changed from {old} to {new} bytes")
                return
            self._logical_note(w, r, path)
        elif wk == "array":
            self.check(w.get("items"), wns, r.get("items"), rns, path + "[]")
        elif wk == "map":
            self.check(w.get("values"), wns, r.get("values"), rns, path + "{}")
        else:
            self._logical_note(w, r, path)

    def _type_change(self, w: Any, wns: str, r: Any, rns: str) -> str:
        """Why a writer type cannot be read as a reader type of another kind, as a change from old to new."""
        old, new = self._old_new(self.desc(w, wns, self.w_side), self.desc(r, rns, self.r_side))
        old_k, new_k = self._old_new(_kind(w), _kind(r))
        if self.reader_is_new or new_k not in PROMOTIONS.get(old_k, ()):
            return f"type changed from {old} to {new}, not promotable"
        return (f"type changed from {old} to {new}: a promotion for readers of the new schema, but readers of the "
                f"old schema cannot read {new_k} as {old_k}")

    def _logical_note(self, w: Any, r: Any, path: str) -> None:
        wl, rl = _logical(w), _logical(r)
        if wl == "decimal" and rl == "decimal":
            wp, ws = w.get("precision"), w.get("scale", 0)
            rp, rs = r.get("precision"), r.get("scale", 0)
            if (wp, ws) != (rp, rs):
                old, new = self._old_new(f"({wp},{ws})", f"({rp},{rs})")
                self.add(path, "decimal_changed", f"decimal precision and scale changed from {old} to {new}; "
                         "Avro resolves decimals only with equal precision and scale")
            return
        if wl != rl:
            old, new = self._old_new(wl or "none", rl or "none")
            self.notes.append(Problem(path, "logical_type_changed",
                                      f"logical type changed from {old} to {new}: Avro reads the underlying "
                                      f"{_kind(w)} as it is, so its values may change meaning"))

    def _record(self, w: dict[str, Any], wns: str, r: dict[str, Any], rns: str, path: str) -> None:
        key = (id(w), id(r))
        if key in self._active:
            return  # a recursive type: this pair is being checked further up
        self._active.add(key)
        try:
            w_ns = _full_name(w["name"], w.get("namespace", wns) or None).rpartition(".")[0]
            r_ns = _full_name(r["name"], r.get("namespace", rns) or None).rpartition(".")[0]
            w_fields = {f["name"]: f for f in w.get("fields", [])}
            for rf in r.get("fields", []):
                name = rf["name"]
                wf = w_fields.get(name)
                if wf is None:
                    wf = next((w_fields[a] for a in rf.get("aliases") or [] if a in w_fields), None)
                fpath = _join(path, name)
                if wf is not None:
                    self.check(wf["type"], w_ns, rf["type"], r_ns, fpath)
                elif "default" in rf:
                    why = _default_problem(rf["type"], rf["default"], self.r_side, r_ns)
                    if why is not None:
                        self.add(fpath, "bad_default", f"{why}; data written with the "
                                 f"{'old' if self.reader_is_new else 'new'} schema has no value for it")
                elif self.reader_is_new:
                    self.add(fpath, "field_added_without_default",
                             "added without a default: data written with the old schema has no value for it")
                else:
                    self.add(fpath, "field_removed_without_default",
                             "removed without a default: readers of the old schema need a value for it")
        finally:
            self._active.discard(key)

    def _enum(self, w: dict[str, Any], r: dict[str, Any], path: str) -> None:
        r_symbols = list(r.get("symbols") or [])
        missing = [s for s in w.get("symbols") or [] if s not in r_symbols]
        if not missing:
            return
        default = r.get("default")
        if default is not None and default in r_symbols:
            return  # unknown symbols are read as the reader's default
        shown = ", ".join(missing)
        plural = "s" if len(missing) > 1 else ""
        name = _short(r.get("name", "?"))
        if default is not None:
            extra = f" (its default {default!r} is not one of its symbols)"
        else:
            extra = ""
        if self.reader_is_new:
            self.add(path, "symbols_missing", f"enum {name}: symbol{plural} {shown} removed, and the new enum has no "
                     f"usable default{extra}: values written with the old schema cannot be read")
        else:
            self.add(path, "symbols_missing", f"enum {name}: symbol{plural} {shown} added, and the old enum has no "
                     f"default{extra}: readers of the old schema cannot read them")


# -- defaults ----------------------------------------------------------------------------------
# A default is checked against its type (Avro specification, "Complex Types" and "Unions"): a type whose
# default is one JSON value has a predicate in _DEFAULT_IS_VALID; a type whose default holds others (an array,
# a map, a record), or that says more than "not valid", has its own function in _DEFAULT_PROBLEMS.
def _default_problem(t: Any, value: Any, side: _Side, ns: str, depth: int = 0) -> str | None:
    """Why ``value`` is not a valid JSON default of type ``t`` (``None``: it is)."""
    if depth > 32:
        return None
    t, ns = side.deref(t, ns)
    k = _kind(t)
    if k == "union":
        return _union_default_problem(t, value, side, ns, depth)
    bad = f"default {_json_text(value)} is not a valid {_describe(t, side.names, ns)}"
    is_valid = _DEFAULT_IS_VALID.get(k)
    if is_valid is not None:
        return None if is_valid(t, value) else bad
    problem = _DEFAULT_PROBLEMS.get(k)
    return None if problem is None else problem(_Default(t, value, side, ns, depth, bad))


@dataclass(frozen=True)
class _Default:
    """A default being checked against its (dereferenced) type ``t`` in namespace ``ns``; ``bad`` says it is
    not valid."""

    t: Any
    value: Any
    side: _Side
    ns: str
    depth: int
    bad: str

    def inner(self, t: Any, value: Any, ns: str | None = None) -> str | None:
        """Why ``value``, a part of this default, is not a valid ``t``."""
        return _default_problem(t, value, self.side, self.ns if ns is None else ns, self.depth + 1)


def _union_default_problem(t: Any, value: Any, side: _Side, ns: str, depth: int) -> str | None:
    if not t:
        return "a union without branches has no default"
    shown = _json_text(value)
    first = t[0]
    if _default_problem(first, value, side, ns, depth + 1) is None:
        return None
    others = [b for b in t[1:] if _default_problem(b, value, side, ns, depth + 1) is None]
    if others:
        return (f"default {shown} does not match the first branch of its union "
                f"({_describe(first, side.names, ns)}); the Avro specification takes a union's default from "
                f"its first branch: put {_describe(others[0], side.names, ns)} first")
    return f"default {shown} is not a valid {_describe(first, side.names, ns)}"


def _is_integer_in(kind: str) -> Callable[[Any, Any], bool]:
    lo, hi = _INT_RANGE[kind]
    return lambda _t, value: isinstance(value, int) and not isinstance(value, bool) and lo <= value <= hi


def _is_floating(_t: Any, value: Any) -> bool:
    if isinstance(value, float) and math.isnan(value):
        return True
    return (isinstance(value, (int, float)) and not isinstance(value, bool)) or (
        isinstance(value, str) and value in ("NaN", "Infinity", "-Infinity"))


_DEFAULT_IS_VALID: dict[str, Callable[[Any, Any], bool]] = {
    "null": lambda _t, value: value is None,
    "boolean": lambda _t, value: isinstance(value, bool),
    "int": _is_integer_in("int"),
    "long": _is_integer_in("long"),
    "float": _is_floating,
    "double": _is_floating,
    "string": lambda _t, value: isinstance(value, str),
    "enum": lambda t, value: isinstance(value, str) and value in (t.get("symbols") or []),
}
"""Type kind -> whether a JSON value is a valid default of a type ``t`` of that kind."""


def _bytes_default_problem(d: _Default) -> str | None:
    value = d.value
    if not isinstance(value, str) or any(ord(c) > 255 for c in value):
        return d.bad + " (write bytes as a string of code points 0-255)"
    if _kind(d.t) == "fixed" and len(value) != d.t.get("size"):
        return d.bad + f" (it needs {d.t.get('size')} bytes)"
    return None


def _array_default_problem(d: _Default) -> str | None:
    if not isinstance(d.value, list):
        return d.bad
    for i, x in enumerate(d.value):
        why = d.inner(d.t.get("items"), x)
        if why is not None:
            return f"item {i}: {why}"
    return None


def _map_default_problem(d: _Default) -> str | None:
    if not isinstance(d.value, dict):
        return d.bad
    for key, x in d.value.items():
        why = d.inner(d.t.get("values"), x)
        if why is not None:
            return f"key {key!r}: {why}"
    return None


def _record_default_problem(d: _Default) -> str | None:
    if not isinstance(d.value, dict):
        return d.bad
    inner_ns = _full_name(d.t["name"], d.t.get("namespace", d.ns) or None).rpartition(".")[0]
    for f in d.t.get("fields", []):
        if f["name"] in d.value:
            why = d.inner(f["type"], d.value[f["name"]], inner_ns)
            if why is not None:
                return f"{f['name']}: {why}"
        elif "default" not in f:
            return f"default {_json_text(d.value)} has no value for {f['name']!r}"
    return None


_DEFAULT_PROBLEMS: dict[str, Callable[[_Default], str | None]] = {
    "bytes": _bytes_default_problem,
    "fixed": _bytes_default_problem,
    "array": _array_default_problem,
    "map": _map_default_problem,
    "record": _record_default_problem,
}
"""Type kind -> why a default of that kind is not valid (``None``: it is); a kind in neither table (an unknown
type) takes any default."""


def _json_text(value: Any) -> str:
    try:
        text = json.dumps(value, ensure_ascii=False)
    except (TypeError, ValueError):
        text = repr(value)
    return text if len(text) <= 40 else text[:37] + "..."
