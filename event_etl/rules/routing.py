"""Routing rules of a bus: which event type a message of a shared subscription or topic belongs to (pure).

A **bus** is a source several event types name (the same ``source``), each claiming its messages by a rule in its
``etl.toml``:

- ``route_attribute = "event_type"``: the value of a Pub/Sub attribute (a Kafka header);
- ``route_field = "type"``: the value of a top-level field of the message's JSON object; a framed Avro or Protobuf
  payload (single-object, Gilt's, Confluent's wire format) routes by its writer schema's record name instead (the
  full name, ``com.acme.PageView``, or the bare name, ``PageView``), which a namer the shell hands the
  :class:`Router` reads (:mod:`event_etl.bus.records`: frames, fingerprints and the registry are not this module's);
- ``route_value``: the value or values the type claims (default: the type's name).

Types that share a source route it the same way (the same attribute, or the same field), and no value is claimed
twice: :func:`plan_buses` says which types form which bus, or raises a :class:`~event_etl.errors.ConfigError` naming
the types and the fix.  :class:`Router` then names the type of one message (:meth:`Router.route`), or says why none
claims it (:class:`Unclaimed`): such a message is kept as a dead letter of the bus, never dropped.

Nothing here reads a file, a clock or the network: the engine and the tasks call it with plain values.
"""

from __future__ import annotations

import hashlib
import json
import re
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass

from event_etl.errors import ConfigError

__all__ = ["Route", "BusPlan", "Router", "Unclaimed", "plan_buses", "bus_id", "UNCLAIMED_DIR", "UNCLAIMED_REASON",
           "with_attributes", "detail_attributes", "claimed_by", "Namer", "UNNAMED_PAYLOADS"]

UNCLAIMED_DIR = "_unclaimed"
"""The folder of the sink, beside the types' folders, that keeps each bus's unclaimed messages:
``<sink>/_unclaimed/<bus id>/dt=YYYY-MM-DD/*.avro`` (dead-letter records, reason ``unclaimed``)."""

UNCLAIMED_REASON = "unclaimed"

TOPIC_PATTERN = "kafka:re:"
"""How a source that reads every topic a pattern matches begins (:mod:`event_etl.sources.kafka_pattern`)."""

BUSED_KINDS = ("pubsub", "kafka")
"""Source kinds a bus may read: a subscription or a topic several consumers would otherwise split or each read."""

UNNAMED_PAYLOADS = ("protobuf", "avro")
"""A type's ``payload`` settings whose messages carry neither a JSON field nor a frame naming their record (a bare
Protobuf message of a descriptor set, a bare Avro datum): ``route_field`` cannot route them."""

Namer = Callable[[bytes], "str | Unclaimed | None"]
"""What names a framed payload's record (:class:`event_etl.bus.records.RecordNamer`): its full name, why it cannot
(:class:`Unclaimed`), or None when the payload is no frame (a JSON payload: routed by its field)."""


@dataclass(frozen=True)
class Route:
    """One type's rule: by ``attribute`` or ``field`` (``key`` names it), claiming ``values``."""

    by: str
    key: str
    values: tuple[str, ...]

    def same_rule(self, other: Route) -> bool:
        """Whether two types route their shared source the same way (the same attribute, or the same field)."""
        return (self.by, self.key) == (other.by, other.key)

    def describe(self) -> str:
        what = {"attribute": f"attribute {self.key!r}", "field": f"field {self.key!r} (or a framed payload's record "
                                                              f"name)"}.get(self.by, "topic")
        return f"{what} = {', '.join(repr(v) for v in self.values)}"


def route_of(name: str, *, attribute: str | None, field: str | None, values: Iterable[str] | None,
             settings_file: str = "etl.toml", source: str | None = None, payload: str = "json") -> Route | None:
    """A type's :class:`Route` from its settings (None: the type routes nothing); both ways at once, values
    without a way, or a field for payloads that carry none (:data:`UNNAMED_PAYLOADS`) are refused.  A type reading a
    topic pattern (``source`` ``kafka:re:...``) without an attribute or a field routes by topic: it claims the
    topics ``values`` name (default: the topic named as the type)."""
    vals = tuple(values) if values is not None else ()
    if attribute and field:
        raise ConfigError("route_attribute and route_field are both set", file=settings_file, field="route_field",
                          fix="route a bus by one of them: an attribute (Kafka header) or a field of the payload")
    if field and payload in UNNAMED_PAYLOADS:
        what = "a bare Protobuf message" if payload == "protobuf" else "a bare Avro datum"
        raise ConfigError(f'route_field routes by a JSON field or a framed payload\'s record name, but payload = '
                          f'"{payload}" is {what}: it carries neither', file=settings_file, field="route_field",
                          fix='route this bus by an attribute (Kafka header) the producers set: route_attribute = '
                              '"type"; or have them frame their messages (payload = "confluent")')
    if not attribute and not field and source is not None and source.startswith(TOPIC_PATTERN):
        if any(not isinstance(v, str) or not v for v in vals):
            raise ConfigError("route_value must be a topic name or a list of them", file=settings_file,
                              field="route_value", fix=f'e.g. route_value = "cdc.shop.{name}"')
        return Route("topic", "topic", vals or (name,))
    if not attribute and not field:
        if vals:
            raise ConfigError("route_value is set without route_attribute or route_field", file=settings_file,
                              field="route_value", fix='say what carries the value, e.g. route_attribute = "type"')
        return None
    if any(not isinstance(v, str) or not v for v in vals):
        raise ConfigError("route_value must be a string or a list of non-empty strings", file=settings_file,
                          field="route_value", fix=f'e.g. route_value = "{name}" or route_value = ["a", "b"]')
    if attribute:
        return Route("attribute", attribute, vals or (name,))
    assert field is not None
    return Route("field", field, vals or (name,))


def bus_id(source: str) -> str:
    """A bus's name in folders and lines: the source's last path part, made safe, and a short hash of the whole
    (``datahub-etl-3f2a9c``): the same source names the same bus in every run."""
    tail = re.sub(r"[^A-Za-z0-9_.-]+", "-", source.rstrip("/").rsplit("/", 1)[-1].split(":")[-1]).strip("-.")
    return f"{tail[:40] or 'bus'}-{hashlib.sha256(source.encode()).hexdigest()[:6]}"


@dataclass(frozen=True)
class BusPlan:
    """Types that read one source together: the source, its id, each type's route."""

    source: str
    id: str
    routes: tuple[tuple[str, Route], ...]

    @property
    def names(self) -> list[str]:
        return [n for n, _ in self.routes]

    def router(self) -> Router:
        return Router(dict(self.routes))

    def describe(self) -> list[str]:
        """Lines for people (``event-etl check``): the bus, then what each type claims."""
        lines = [f"bus {self.id}: {self.source} read once for {len(self.routes)} type(s); unclaimed messages kept "
                 f"in <sink>/{UNCLAIMED_DIR}/{self.id}/"]
        lines += [f"  {name}: {route.describe()}" for name, route in self.routes]
        return lines


def plan_buses(types: Iterable[tuple[str, str, Route | None]], files: Mapping[str, str] | None = None
               ) -> list[BusPlan]:
    """The buses among ``types`` (``(name, source, route)``, the source as the type reads it, e.g.
    ``pubsub:projects/p/subscriptions/s``): each source that a routed type reads is a bus of the types that read it.

    Refused, naming the types and the fix (a :class:`ConfigError` of the settings file of a type it names, from
    ``files``: ``{name: path}``): a source some of whose types route and some do not; types that route one source
    differently; a value two types claim."""
    where = dict(files or {})

    def refused(name: str, message: str, field: str, fix: str) -> ConfigError:
        return ConfigError(message, file=where.get(name, f"event_types/{name}/etl.toml"), field=field, fix=fix)

    by_source: dict[str, list[tuple[str, Route | None]]] = {}
    for name, source, route in types:
        by_source.setdefault(source, []).append((name, route))
    plans = []
    for source, members in by_source.items():
        routed = [(n, r) for n, r in members if r is not None]
        if not routed:
            continue
        kind = source.split(":", 1)[0]
        if kind not in BUSED_KINDS:
            raise refused(routed[0][0], f"{routed[0][0]} routes its source {source}, which is not a bus",
                          "route_attribute", "route_attribute and route_field apply to a Pub/Sub subscription or a "
                          'Kafka topic several types share; remove them, or set source = "pubsub:..." or "kafka:..."')
        plain = sorted(n for n, r in members if r is None)
        if plain:
            names = ", ".join(sorted(n for n, _ in routed))
            raise refused(plain[0], f"{', '.join(plain)} and {names} read {source}, but only {names} route it",
                          "route_attribute", f"give {', '.join(plain)} the same route_attribute or route_field as "
                          "the others (each type claims its messages), or a subscription or topic of its own")
        routed.sort(key=lambda item: item[0])
        first_name, first = routed[0]
        for name, route in routed[1:]:
            if not route.same_rule(first):
                raise refused(name, f"{first_name} and {name} read {source} but route it differently "
                              f"({first.describe()}; {route.describe()})", "route_attribute",
                              "types of one bus route by the same attribute or the same field: make them agree")
        claimed: dict[str, str] = {}
        for name, route in routed:
            for v in route.values:
                if v in claimed:
                    what = route.describe().split(" = ")[0]
                    raise refused(name, f"{claimed[v]} and {name} both claim {what} = {v!r} on {source}",
                                  "route_value", f"each value belongs to one type: change route_value of {name} or "
                                  f"of {claimed[v]}")
                claimed[v] = name
        plans.append(BusPlan(source, bus_id(source), tuple(routed)))
    return sorted(plans, key=lambda p: p.id)


@dataclass(frozen=True)
class Unclaimed:
    """Why no type claims a message: its detail for the dead letter."""

    detail: str


class Router:
    """The types of one bus and what each claims (built from :class:`BusPlan`); :meth:`route` names the type of a
    message, or says why none claims it."""

    def __init__(self, routes: Mapping[str, Route], namer: Namer | None = None) -> None:
        if not routes:
            raise ValueError("a router needs at least one route")
        first = next(iter(routes.values()))
        self.by, self.key = first.by, first.key
        self.routes = dict(routes)
        self.table = {v: name for name, r in routes.items() for v in r.values}
        self.namer = namer
        """A bus by field: names a framed payload's record (None: every payload is routed by its JSON field)."""

    def with_namer(self, namer: Namer | None) -> Router:
        """This router, framed payloads named by ``namer`` (a bus routed by attribute or topic has no use of it)."""
        return Router(self.routes, namer if self.by == "field" else None)

    def route(self, payload: bytes, attributes: Mapping[str, str] | None, topic: str | None = None
              ) -> str | Unclaimed:
        """The type that claims a message (``payload``, its ``attributes`` or Kafka headers, the ``topic`` it was read
        from), or :class:`Unclaimed`."""
        value: str | Unclaimed
        if self.by == "topic":
            value = topic if topic is not None else Unclaimed("no topic")
        elif self.by == "attribute":
            got = attributes.get(self.key) if attributes else None
            value = got if got is not None else Unclaimed(f"no attribute {self.key!r}")
        else:
            named = self.namer(payload) if self.namer is not None else None
            if named is not None:  # a frame: its record's full name, or the bare name
                return self._by_record(named)
            value = field_value(payload, self.key)
        if isinstance(value, Unclaimed):
            return value
        name = self.table.get(value)
        if name is None:
            what = {"attribute": f"attribute {self.key!r}", "field": f"field {self.key!r}"}.get(self.by, "topic")
            return Unclaimed(f"{what} is {value!r}, which no type of the bus claims")
        return name

    def _by_record(self, named: str | Unclaimed) -> str | Unclaimed:
        if isinstance(named, Unclaimed):
            return named
        name = self.table.get(named) or self.table.get(named.rsplit(".", 1)[-1])
        if name is None:
            return Unclaimed(f"record {named!r} (a framed payload), which no type of the bus claims")
        return name


def field_value(payload: bytes, key: str) -> str | Unclaimed:
    """The string value of top-level field ``key`` of a JSON object payload, or why there is none.  Numbers and
    booleans route by their JSON text (``2`` claims ``route_value = "2"``)."""
    try:
        obj = json.loads(payload)
    except (ValueError, UnicodeDecodeError):
        return Unclaimed(f"not a JSON object (field {key!r} routes this bus)")
    if not isinstance(obj, dict):
        return Unclaimed(f"not a JSON object (field {key!r} routes this bus)")
    value = obj.get(key)
    if value is None:
        return Unclaimed(f"no field {key!r}")
    if isinstance(value, str):
        return value
    if isinstance(value, bool | int | float):
        return json.dumps(value)
    return Unclaimed(f"field {key!r} is not a string, a number or a boolean")


_ATTRIBUTES = "; attributes "


def with_attributes(why: str, attributes: Mapping[str, str]) -> str:
    """An unclaimed message's dead-letter detail: ``why``, then its attributes as JSON (none: ``why`` alone)."""
    if not attributes:
        return why
    return f"{why}{_ATTRIBUTES}{json.dumps(dict(attributes), sort_keys=True, separators=(',', ':'))}"


def detail_attributes(detail: str) -> dict[str, str]:
    """The attributes :func:`with_attributes` put in a detail (``{}``: none, or not such a detail)."""
    i = detail.find(_ATTRIBUTES)
    while i >= 0:  # the first place whose rest is a JSON object (the reason may quote a value holding the words)
        try:
            got = json.loads(detail[i + len(_ATTRIBUTES):])
        except ValueError:
            got = None
        if isinstance(got, dict):
            return {str(k): str(v) for k, v in got.items()}
        i = detail.find(_ATTRIBUTES, i + 1)
    return {}


def claimed_by(route: Route, payload: bytes, detail: str, source: str, namer: Namer | None = None) -> bool:
    """Whether ``route`` claims an unclaimed message kept with this ``payload``, ``detail`` and ``source`` (its
    position: ``kafka:TOPIC/PARTITION@OFFSET`` for Kafka), by the route as it is now (pure; ``namer`` names a
    framed payload's record, as :class:`Router` does)."""
    if route.by == "attribute":
        value: str | Unclaimed | None = detail_attributes(detail).get(route.key)
    elif route.by == "field":
        named = namer(payload) if namer is not None else None
        if isinstance(named, str):
            return named in route.values or named.rsplit(".", 1)[-1] in route.values
        value = field_value(payload, route.key) if named is None else None
    else:
        value = source[len("kafka:"):].rsplit("/", 1)[0] if source.startswith("kafka:") else None
    return isinstance(value, str) and value in route.values
