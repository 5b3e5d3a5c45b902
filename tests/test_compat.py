"""Schema compatibility (event_etl.rules.compat) against the Avro specification's resolution rules, as a table.

Each case is an old and a new schema (a record with one field ``x`` unless it says otherwise),
the compatibility level, and the problems (path, kind) in each direction.  Every verdict that
says "readable" is also checked against fastavro: a datum written with the writer schema
must resolve into the reader schema.
"""

from __future__ import annotations

import io

import fastavro
import pytest

from event_etl.rules.compat import compatibility, describe_type, reader_problems


def rec(*fields, name="R", namespace="test", **extra):
    return {"type": "record", "name": name, "namespace": namespace, "fields": list(fields), **extra}


def f(name, type_, **kw):
    return {"name": name, "type": type_, **kw}


def x(type_, **kw):
    """A record whose only field ``x`` has this type."""
    return rec(f("x", type_, **kw))


def enum(*symbols, name="Status", **kw):
    return {"type": "enum", "name": name, "symbols": list(symbols), **kw}


def fixed(size, name="Hash", **kw):
    return {"type": "fixed", "name": name, "size": size, **kw}


def logical(base, lt, **kw):
    return {"type": base, "logicalType": lt, **kw}


MONEY = rec(f("amount", "long"), f("currency", "string"), name="Money")
MONEY_STR = rec(f("amount", "string"), f("currency", "string"), name="Money")
LINE = rec(f("sku", "string"), name="Line")
LINE_QTY = rec(f("sku", "string"), f("qty", "int"), name="Line")
LINE_QTY_DEFAULT = rec(f("sku", "string"), f("qty", "int", default=1), name="Line")
NODE = rec(f("value", "long"), f("next", ["null", "Node"], default=None), name="Node")
NODE2 = rec(f("value", "long"), f("next", ["null", "Node"], default=None), f("label", "string", default=""),
            name="Node")

B, F = "backward", "forward"

# (id, old, new, level, backward problems [(path, kind)], forward problems [(path, kind)])
CASES = [
    # -- primitives and promotions (int -> long -> float -> double, string <-> bytes) ------------------
    ("same primitive", x("long"), x("long"), "full", [], []),
    ("int to long", x("int"), x("long"), B, [], [("x", "type_changed")]),
    ("int to float", x("int"), x("float"), B, [], [("x", "type_changed")]),
    ("int to double", x("int"), x("double"), B, [], [("x", "type_changed")]),
    ("long to float", x("long"), x("float"), B, [], [("x", "type_changed")]),
    ("long to double", x("long"), x("double"), B, [], [("x", "type_changed")]),
    ("float to double", x("float"), x("double"), B, [], [("x", "type_changed")]),
    ("long to int (narrowing)", x("long"), x("int"), F, [("x", "type_changed")], []),
    ("double to float (narrowing)", x("double"), x("float"), F, [("x", "type_changed")], []),
    ("string to bytes", x("string"), x("bytes"), "full", [], []),
    ("bytes to string", x("bytes"), x("string"), "full", [], []),
    ("long to string", x("long"), x("string"), "none", [("x", "type_changed")], [("x", "type_changed")]),
    ("boolean to int", x("boolean"), x("int"), "none", [("x", "type_changed")], [("x", "type_changed")]),
    ("int to string", x("int"), x("string"), "none", [("x", "type_changed")], [("x", "type_changed")]),
    # -- logical types are carried by their underlying type; decimals need equal precision and scale ---
    ("timestamp-millis to long", x(logical("long", "timestamp-millis")), x("long"), "full", [], []),
    ("long to timestamp-millis", x("long"), x(logical("long", "timestamp-millis")), "full", [], []),
    ("millis to micros", x(logical("long", "timestamp-millis")), x(logical("long", "timestamp-micros")), "full", [],
     []),
    ("uuid to string", x(logical("string", "uuid")), x("string"), "full", [], []),
    ("date (int) to long", x(logical("int", "date")), x("long"), B, [], [("x", "type_changed")]),
    ("date to string", x(logical("int", "date")), x("string"), "none", [("x", "type_changed")],
     [("x", "type_changed")]),
    ("decimal same", x(logical("bytes", "decimal", precision=10, scale=2)),
     x(logical("bytes", "decimal", precision=10, scale=2)), "full", [], []),
    ("decimal precision changed", x(logical("bytes", "decimal", precision=10, scale=2)),
     x(logical("bytes", "decimal", precision=12, scale=2)), "none", [("x", "decimal_changed")],
     [("x", "decimal_changed")]),
    ("decimal scale changed", x(logical("bytes", "decimal", precision=10, scale=2)),
     x(logical("bytes", "decimal", precision=10, scale=3)), "none", [("x", "decimal_changed")],
     [("x", "decimal_changed")]),
    # -- records: fields by name, defaults, aliases, nesting --------------------------------------------
    ("field added with default", rec(f("a", "string")), rec(f("a", "string"), f("b", ["null", "string"], default=None)),
     "full", [], []),
    ("field added with a non-null default", rec(f("a", "string")), rec(f("a", "string"), f("b", "string",
                                                                                           default="web")),
     "full", [], []),
    ("field added without default", rec(f("a", "string")), rec(f("a", "string"), f("b", "string")),
     F, [("b", "field_added_without_default")], []),
    ("field removed that had a default", rec(f("a", "string"), f("b", "string", default="")), rec(f("a", "string")),
     "full", [], []),
    ("field removed without default", rec(f("a", "string"), f("user_id", "string")), rec(f("a", "string")),
     B, [], [("user_id", "field_removed_without_default")]),
    ("field renamed with alias", rec(f("a", "string")), rec(f("b", "string", aliases=["a"])),
     B, [], [("a", "field_removed_without_default")]),
    ("field renamed without alias", rec(f("a", "string")), rec(f("b", "string")),
     "none", [("b", "field_added_without_default")], [("a", "field_removed_without_default")]),
    ("fields reordered", rec(f("a", "string"), f("b", "long")), rec(f("b", "long"), f("a", "string")), "full", [], []),
    ("nested type change", rec(f("price", MONEY)), rec(f("price", MONEY_STR)),
     "none", [("price.amount", "type_changed")], [("price.amount", "type_changed")]),
    ("nested promotion", rec(f("price", MONEY)), rec(f("price", rec(f("amount", "double"), f("currency", "string"),
                                                                    name="Money"))),
     B, [], [("price.amount", "type_changed")]),
    ("record renamed without alias", rec(f("a", "string"), name="PageView"), rec(f("a", "string"), name="View"),
     "none", [("", "name_changed")], [("", "name_changed")]),
    ("record renamed with alias", rec(f("a", "string"), name="PageView"),
     rec(f("a", "string"), name="View", aliases=["PageView"]), B, [], [("", "name_changed")]),
    ("namespace changed only", rec(f("a", "string"), namespace="com.shop"),
     rec(f("a", "string"), namespace="com.shop.v2"), "full", [], []),
    ("named type referenced by name", rec(f("price", MONEY), f("was", "Money")),
     rec(f("price", MONEY), f("was", "Money"), f("note", "string", default="")), "full", [], []),
    ("named reference changed through the definition", rec(f("price", MONEY), f("was", "Money")),
     rec(f("price", MONEY_STR), f("was", "Money")), "none",
     [("price.amount", "type_changed"), ("was.amount", "type_changed")],
     [("price.amount", "type_changed"), ("was.amount", "type_changed")]),
    ("recursive record gains a field with default", rec(f("head", NODE)), rec(f("head", NODE2)), "full", [], []),
    # -- enums: symbols, and the reader's default -------------------------------------------------------
    ("enum symbol added", x(enum("A", "B")), x(enum("A", "B", "C")), B, [], [("x", "symbols_missing")]),
    ("enum symbol added, old has a default", x(enum("A", "B", default="A")), x(enum("A", "B", "C", default="A")),
     "full", [], []),
    ("enum symbol removed, new has a default", x(enum("A", "B", "C")), x(enum("A", "B", default="A")),
     "full", [], []),
    ("enum symbol removed", x(enum("A", "B", "C")), x(enum("A", "B")), F, [("x", "symbols_missing")], []),
    ("enum default not a symbol", x(enum("A", "B", "C")), x(enum("A", "B", default="Z")),
     F, [("x", "symbols_missing")], []),
    ("enum renamed", x(enum("A", name="Status")), x(enum("A", name="State")),
     "none", [("x", "name_changed")], [("x", "name_changed")]),
    # -- unions -----------------------------------------------------------------------------------------
    ("made nullable", x("string"), x(["null", "string"], default=None), B, [], [("x", "type_changed")]),
    ("made required", x(["null", "string"], default=None), x("string"), F, [("x", "type_changed")], []),
    ("union branch promoted", x(["null", "int"]), x(["null", "long"]), B, [], [("x", "type_changed")]),
    ("union branch added", x(["null", "string"]), x(["null", "string", "long"]), B, [],
     [("x", "union_branch_missing")]),
    ("union branch removed", x(["null", "string", "long"]), x(["null", "string"]), F,
     [("x", "union_branch_missing")], []),
    ("union branch changed", x(["null", "long"]), x(["null", "string"]), "none",
     [("x", "type_changed")], [("x", "type_changed")]),
    ("union branches reordered", x(["null", "string", "long"]), x(["long", "null", "string"]), "full", [], []),
    ("plain to union of another type", x("long"), x(["null", "string"]), "none",
     [("x", "type_changed")], [("x", "type_changed")]),
    ("union of records by name", x(["null", MONEY]), x(["null", rec(f("amount", "long"), f("currency", "string"),
                                                                    f("fx", "double", default=1.0), name="Money")]),
     "full", [], []),
    # -- arrays and maps ---------------------------------------------------------------------------------
    ("array items promoted", rec(f("tags", {"type": "array", "items": "int"})),
     rec(f("tags", {"type": "array", "items": "long"})), B, [], [("tags[]", "type_changed")]),
    ("map values changed", rec(f("attrs", {"type": "map", "values": "int"})),
     rec(f("attrs", {"type": "map", "values": "string"})), "none", [("attrs{}", "type_changed")],
     [("attrs{}", "type_changed")]),
    ("array to map", rec(f("tags", {"type": "array", "items": "string"})),
     rec(f("tags", {"type": "map", "values": "string"})), "none", [("tags", "type_changed")], [("tags",
                                                                                                "type_changed")]),
    ("array of records gains a field without default", rec(f("lines", {"type": "array", "items": LINE})),
     rec(f("lines", {"type": "array", "items": LINE_QTY})), F, [("lines[].qty", "field_added_without_default")], []),
    ("array of records gains a field with default", rec(f("lines", {"type": "array", "items": LINE})),
     rec(f("lines", {"type": "array", "items": LINE_QTY_DEFAULT})), "full", [], []),
    ("map of arrays, items promoted", rec(f("m", {"type": "map", "values": {"type": "array", "items": "float"}})),
     rec(f("m", {"type": "map", "values": {"type": "array", "items": "double"}})), B, [], [("m{}[]", "type_changed")]),
    # -- fixed ---------------------------------------------------------------------------------------------
    ("fixed same", x(fixed(16)), x(fixed(16)), "full", [], []),
    ("fixed size changed", x(fixed(16)), x(fixed(32)), "none", [("x", "size_changed")], [("x", "size_changed")]),
    ("fixed renamed with alias", x(fixed(16, name="Hash")), x(fixed(16, name="Digest", aliases=["Hash"])),
     B, [], [("x", "name_changed")]),
    ("fixed to bytes", x(fixed(16)), x("bytes"), "none", [("x", "type_changed")], [("x", "type_changed")]),
    # -- defaults that cannot be used -------------------------------------------------------------------
    ("added union default not of its first branch", rec(f("a", "string")),
     rec(f("a", "string"), f("b", ["string", "null"], default=None)), F, [("b", "bad_default")], []),
    ("added enum default not a symbol", rec(f("a", "string")),
     rec(f("a", "string"), f("s", enum("A", "B"), default="C")), F, [("s", "bad_default")], []),
    ("added int default out of range", rec(f("a", "string")),
     rec(f("a", "string"), f("n", "int", default=2**40)), F, [("n", "bad_default")], []),
    ("added record default", rec(f("a", "string")),
     rec(f("a", "string"), f("price", MONEY, default={"amount": 0, "currency": "EUR"})), "full", [], []),
    ("added record default missing a field", rec(f("a", "string")),
     rec(f("a", "string"), f("price", MONEY, default={"amount": 0})), F, [("price", "bad_default")], []),
]


def _kinds(problems):
    return sorted((p.path, p.kind) for p in problems)


@pytest.mark.parametrize("old,new,level,backward,forward", [c[1:] for c in CASES], ids=[c[0] for c in CASES])
def test_compatibility_table(old, new, level, backward, forward):
    c = compatibility(new, old)
    assert _kinds(c.backward) == sorted(backward), [str(p) for p in c.backward]
    assert _kinds(c.forward) == sorted(forward), [str(p) for p in c.forward]
    assert c.level == level
    for p in (*c.backward, *c.forward):
        assert str(p).startswith(f"field `{p.path}`: " if p.path else "") and len(p.message) > 10


def _sample(t, names, ns=""):
    """A datum of type ``t`` that uses the last enum symbol and the last union branch (the likeliest to change)."""
    if isinstance(t, list):
        return _sample(t[-1], names, ns)
    if isinstance(t, str):
        prim = {"null": None, "boolean": True, "int": 7, "long": 7, "float": 1.5, "double": 1.5, "bytes": b"ab",
                "string": "ab"}
        if t in prim:
            return prim[t]
        return _sample(names.get(f"{ns}.{t}") or names[t], names, ns)  # a named type, by its name
    kind = t["type"]
    if isinstance(kind, (dict, list)):
        return _sample(kind, names, ns)
    lt = t.get("logicalType")
    if kind in ("record", "enum", "fixed"):
        space = t.get("namespace", ns)
        names[t["name"] if "." in t["name"] or not space else f"{space}.{t['name']}"] = t
        names.setdefault(t["name"], t)
        ns = space
    if kind == "record":
        out = {}
        for fl in t["fields"]:
            ft = fl["type"]
            if isinstance(ft, list) and "null" in ft and fl.get("default", 0) is None and ft[-1] == "Node":
                out[fl["name"]] = None  # stop a recursive type
            else:
                out[fl["name"]] = _sample(ft, names, ns)
        return out
    if kind == "enum":
        return t["symbols"][-1]
    if kind == "fixed":
        return b"\x01" * t["size"]
    if kind == "array":
        return [_sample(t["items"], names, ns)]
    if kind == "map":
        return {"k": _sample(t["values"], names, ns)}
    if lt == "decimal":
        import decimal

        return decimal.Decimal("1.25")
    if lt == "uuid":
        return "0b5c3e9a-35a3-4a6e-9b3f-2f3f1d3c2a10"
    if lt in ("timestamp-millis", "timestamp-micros"):
        return 1_700_000_000_000
    if lt == "date":
        return 19000
    return _sample(kind, names, ns)


def _resolves(writer, reader) -> None:
    w = fastavro.parse_schema(writer)
    buf = io.BytesIO()
    fastavro.schemaless_writer(buf, w, _sample(writer, {}))
    buf.seek(0)
    fastavro.schemaless_reader(buf, w, fastavro.parse_schema(reader))


@pytest.mark.parametrize("old,new,level,backward,forward", [c[1:] for c in CASES], ids=[c[0] for c in CASES])
def test_readable_verdicts_resolve_in_fastavro(old, new, level, backward, forward):
    """What the rules call readable, fastavro resolves (a sample datum using the last symbol and branch)."""
    for schema in (old, new):
        try:
            fastavro.parse_schema(schema)
        except fastavro.schema.SchemaParseException:
            pytest.skip("fastavro refuses one of the two schemas (so would the event type's loader)")
    if not backward:
        _resolves(old, new)
    if not forward:
        _resolves(new, old)


def test_messages_name_the_field_and_the_change():
    c = compatibility(rec(f("price", MONEY_STR)), rec(f("price", MONEY)))
    assert [str(p) for p in c.backward] == ["field `price.amount`: type changed from long to string, not promotable"]
    c = compatibility(rec(f("a", "string")), rec(f("a", "string"), f("user_id", "string")))
    assert [str(p) for p in c.forward] == [
        "field `user_id`: removed without a default: readers of the old schema need a value for it"]
    c = compatibility(rec(f("a", "string"), f("b", "string")), rec(f("a", "string")))
    assert str(c.backward[0]) == ("field `b`: added without a default: data written with the old schema has no value "
                                  "for it")
    c = compatibility(x("double"), x("long"))
    assert "readers of the old schema cannot read double as long" in str(c.forward[0])
    c = compatibility(x(enum("A", "B")), x(enum("A", "B", "C")))
    assert str(c.backward[0]).startswith("field `x`: enum Status: symbol C removed, and the new enum has no usable "
                                         "default")
    c = compatibility(x(["null", "string"]), x(["null", "long"]))
    assert str(c.backward[0]) == (
        "field `x`: type changed from long to string, not promotable (now union [null, string])")
    c = compatibility(rec(f("a", "string"), name="View"), rec(f("a", "string"), name="PageView"))
    assert str(c.backward[0]) == (
        'record name changed from PageView to View; add "aliases": ["PageView"] to the new record')
    c = compatibility(x(fixed(32)), x(fixed(16)))
    assert str(c.backward[0]) == "field `x`: fixed Hash: size changed from 16 to 32 bytes"
    c = compatibility(rec(f("a", "string"), f("b", ["string", "null"], default=None)), rec(f("a", "string")))
    assert "does not match the first branch of its union (string)" in str(c.backward[0])
    assert "put null first" in str(c.backward[0])


def test_a_logical_type_change_is_a_note_not_a_problem():
    c = compatibility(x(logical("long", "timestamp-micros")), x(logical("long", "timestamp-millis")))
    assert c.level == "full"
    assert [str(n) for n in c.notes] == [
        ("field `x`: logical type changed from timestamp-millis to timestamp-micros: Avro reads the underlying long as "
         "it is, so its values may change meaning")]
    assert compatibility(x("long"), x("long")).notes == ()


def test_reader_problems_is_the_backward_question():
    assert reader_problems(x("long"), x("int")) == []
    assert [p.kind for p in reader_problems(x("int"), x("long"))] == ["type_changed"]


def test_rules_are_pure_and_leave_the_schemas_alone():
    import copy

    old, new = rec(f("price", MONEY), f("was", "Money")), rec(f("price", MONEY_STR), f("was", "Money"))
    before = copy.deepcopy((old, new))
    assert compatibility(new, old) == compatibility(new, old)
    assert (old, new) == before


def test_describe_type():
    assert describe_type("long") == "long"
    assert describe_type(logical("long", "timestamp-millis")) == "long (timestamp-millis)"
    assert describe_type(["null", {"type": "array", "items": "string"}]) == "union [null, array<string>]"
    assert describe_type(fixed(16)) == "fixed Hash(16)"
    assert describe_type(logical("bytes", "decimal", precision=10, scale=2)) == "bytes (decimal 10,2)"


def test_shipped_types_are_compatible_with_their_registered_versions():
    from pathlib import Path

    from event_etl.eventtypes import load_event_types

    types = load_event_types(Path(__file__).resolve().parent.parent / "event_types")
    for et in types.values():
        assert et.schema_versions, f"{et.name} keeps no schema history"
        for name, s in et.schema_versions:
            assert compatibility(et.schema, s).backward == (), (et.name, name)
