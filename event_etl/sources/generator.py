"""Synthetic events that follow an event type's schema.

Event ``i`` of a generator is a pure function of the generator's parameters and ``i``:
replaying a range of indexes gives the same bytes, which is what lets a micro-batch of
the ``generate:`` source be replayed after a crash.

Time: the generator runs a simulated clock.  Event ``i`` *arrives* at
``start + i / rate * speedup`` (ms); with ``speedup=120`` one wall-clock second carries
two minutes of event time, so a demo sees hours close within a minute.  Its event time
is the arrival minus a small delay, except for the configured shares of:

- ``out_of_order``: up to the type's out-of-orderness bound behind (still timely);
- ``late``: one to two hours behind (its hour is complete: written to the open hour);
- ``too_late``: more than the allowed lateness behind (dead-letter ``too_late``);
- ``future``: days ahead of its arrival (dead-letter ``future``);
- ``fast_clock``: from a producer whose clock runs ``fast_by`` seconds ahead (default 480:
  8 minutes, within the default ``max_future_skew``): accepted, written to the hour of its
  own event time, but counted toward the watermark only up to its arrival;
- ``invalid``: a broken payload (bad JSON, missing or mistyped fields, bad time...);
- ``duplicate``: an exact copy of an earlier event (a producer retry).

Parameters (``generate:rate=2000,speedup=120,late=0.01``): ``rate`` events per wall
second, ``speedup``, ``start`` (ISO time, or a negative duration from now such as
``-3h``), ``seed``, ``format`` (``json`` or ``avro``), the shares above, and ``count``
(stop after that many events).
"""

from __future__ import annotations

import base64
import random
import uuid
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass, fields, replace
from typing import Any

import orjson

from event_etl.eventtypes import EventType
from event_etl.storage.avroio import encode_single_object
from event_etl.timeutil import HOUR_MS, MINUTE_MS, iso, parse_duration, to_millis

__all__ = ["GeneratorParams", "Generated", "generate", "parse_generator_params", "INTENTS"]

GENERATOR_VERSION = 2
"""How event times are drawn.  1: as 2 does, but an out-of-order or late event of the first hours may lie in an hour
before the generator's start (a demo's first lines were markers of hours of a record or two, before any batch).
2: such an event is drawn as a timely one instead, so the first hour is the one the generator starts in.  A job
keeps the version it started with (its checkpoint), so a replay after an upgrade gives the same bytes."""

INTENTS = ("timely", "out_of_order", "late", "too_late", "future", "invalid", "duplicate", "fast_clock")


@dataclass(frozen=True)
class GeneratorParams:
    rate: float = 2000.0
    speedup: float = 120.0
    start: int = 0  # ms; 0 = decided when the job starts (see resolve)
    seed: int = 42
    format: str = "json"
    out_of_order: float = 0.05
    late: float = 0.01
    too_late: float = 0.001
    future: float = 0.0005
    invalid: float = 0.001
    duplicate: float = 0.0
    count: int = 0  # 0 = endless
    fast_clock: float = 0.0
    fast_by: float = 480.0  # seconds a fast producer clock runs ahead
    version: int = GENERATOR_VERSION  # how event times are drawn (see GENERATOR_VERSION); kept in the checkpoint

    def to_json(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_json(cls, d: dict[str, Any]) -> GeneratorParams:
        """Parameters as a checkpoint or a split kept them; those of a release without ``version`` draw as 1."""
        return cls(**{"version": 1, **{f.name: d[f.name] for f in fields(cls) if f.name in d}})

    def arrival(self, i: int) -> int:
        """Simulated arrival time of event ``i`` (ms)."""
        return self.start + int(i * 1000.0 * self.speedup / self.rate)

    def resolve(self, now: int, start_text: str | None = None) -> GeneratorParams:
        """Fix ``start`` against the wall clock ``now`` when the job is first started."""
        if self.start:
            return self
        if start_text:
            start = _parse_start(start_text, now)
        elif self.speedup > 1:
            # A demo: begin two hours and a quarter back, so the first hour closes in seconds.
            start = now - now % HOUR_MS - 2 * HOUR_MS - 15 * MINUTE_MS
        else:
            start = now
        return replace(self, start=start)


def _parse_start(text: str, now: int) -> int:
    if text.startswith("-"):
        return now - parse_duration(text[1:])
    from datetime import datetime

    return to_millis(datetime.fromisoformat(text))


def parse_generator_params(text: str, now: int) -> GeneratorParams:
    """Parse ``rate=2000,speedup=120,...`` (the part after ``generate:``)."""
    kinds = {f.name: f.type for f in fields(GeneratorParams)}
    values: dict[str, Any] = {}
    start_text = None
    for item in filter(None, (p.strip() for p in text.replace("&", ",").split(","))):
        if "=" not in item:
            raise ValueError(f"generator option {item!r} must be key=value")
        key, _, raw = item.partition("=")
        key = key.strip()
        if key not in kinds or key == "version":
            known = ", ".join(k for k in kinds if k != "version")
            raise ValueError(f"unknown generator option {key!r}; known: {known}")
        if key == "start":
            start_text = raw.strip()
            continue
        kind = kinds[key]
        try:
            values[key] = int(raw) if kind == "int" else float(raw) if kind == "float" else raw.strip()
        except ValueError as err:
            raise ValueError(f"generator option {key}={raw!r}: expected a number") from err
    p = GeneratorParams(**values)
    if p.rate <= 0 or p.speedup <= 0:
        raise ValueError("generator rate and speedup must be positive")
    if p.format not in ("json", "avro"):
        raise ValueError("generator format must be json or avro")
    shares = p.out_of_order + p.late + p.too_late + p.future + p.invalid + p.duplicate + p.fast_clock
    if shares > 1 or min(p.out_of_order, p.late, p.too_late, p.future, p.invalid, p.duplicate, p.fast_clock) < 0:
        raise ValueError("generator shares must be between 0 and 1 and add up to at most 1")
    return p.resolve(now, start_text)


@dataclass(frozen=True)
class Generated:
    """One generated payload and what the generator meant it to be."""

    index: int
    payload: bytes
    arrival: int
    intent: str
    event_id: str | None
    event_time: int | None


_PRIMITIVES: dict[str, Callable[[str, random.Random], Any]] = {
    "string": lambda name, rng: f"{name}-{rng.randint(1, 99999)}",
    "int": lambda name, rng: rng.randint(0, 100_000),
    "long": lambda name, rng: rng.randint(0, 100_000),
    "float": lambda name, rng: round(rng.uniform(0, 1000), 2),
    "double": lambda name, rng: round(rng.uniform(0, 1000), 2),
    "boolean": lambda name, rng: rng.random() < 0.5,
    "null": lambda name, rng: None,
}
"""A random value of each Avro primitive type, for a field ``name``."""


def _uuid(rng: random.Random) -> str:
    return str(uuid.UUID(int=rng.getrandbits(128), version=4))


class _Values:
    """Random values for an Avro type, steered by the type's ``[generator.values]`` pools."""

    def __init__(self, event_type: EventType) -> None:
        self.pools = dict(event_type.generator.get("values", {}))

    def value(self, t: Any, name: str, rng: random.Random, depth: int = 0) -> Any:
        pool = self.pools.get(name)
        if pool:
            v = rng.choice(pool)
            if isinstance(v, str) and "{" in v:
                return v.replace("{n}", str(rng.randint(1, 99999))).replace("{uuid}", _uuid(rng))
            return v
        if isinstance(t, list):
            if "null" in t and rng.random() < 0.15:
                return None
            branches = [b for b in t if b != "null"]
            return self.value(branches[0], name, rng, depth) if branches else None
        if isinstance(t, dict):
            return self._complex(t, name, rng, depth)
        make = _PRIMITIVES.get(t) if isinstance(t, str) else None
        if make is None:
            raise ValueError(f"the generator cannot make values of Avro type {t!r} for field {name!r}")
        return make(name, rng)

    def _complex(self, t: dict[str, Any], name: str, rng: random.Random, depth: int) -> Any:
        """A value of a type written as an object: a logical type, an enum, an array, a map, a record, or a
        primitive spelt out (``{"type": "string"}``)."""
        kind, logical = t.get("type"), t.get("logicalType")
        if logical == "uuid":
            return _uuid(rng)
        if logical in ("timestamp-millis", "timestamp-micros"):
            return 1_700_000_000_000 + rng.randint(0, 10**10)
        if kind == "enum":
            return rng.choice(t["symbols"])
        if kind == "array":
            return [self.value(t["items"], name, rng, depth + 1) for _ in range(rng.randint(0, 3))] if depth < 3 else []
        if kind == "map":
            return {
                f"{name}_{j}": self.value(t["values"], name, rng, depth + 1) for j in range(rng.randint(1, 3))
            } if depth < 3 else {}
        if kind == "record":
            return {f["name"]: self.value(f["type"], f["name"], rng, depth + 1) for f in t["fields"]}
        return self.value(kind, name, rng, depth)


class Generator:
    """Generates payloads of one event type.  Create once per process; call :meth:`range`."""

    def __init__(self, event_type: EventType, params: GeneratorParams) -> None:
        self.et = event_type
        self.p = params
        self.values = _Values(event_type)
        self.parsed = event_type.parsed_schema()
        self.fingerprint = event_type.fingerprint
        self.fields = [(f["name"], f["type"]) for f in event_type.schema["fields"]]
        self._proto = self._protobuf_encoder(event_type)
        self.first_hour = params.start - params.start % HOUR_MS  # the hour the generator starts in
        self.cum = []
        acc = 0.0
        for intent in ("out_of_order", "late", "too_late", "future", "invalid", "duplicate", "fast_clock"):
            acc += getattr(params, intent)
            self.cum.append((acc, intent))

    def _rng(self, i: int) -> random.Random:
        return random.Random((self.p.seed << 40) ^ i)

    def _intent(self, rng: random.Random) -> str:
        u = rng.random()
        for bound, intent in self.cum:
            if u < bound:
                return intent
        return "timely"

    def _event_time(self, intent: str, arrival: int, rng: random.Random) -> int:
        ooo = self.et.out_of_orderness
        if intent == "out_of_order":
            return arrival - rng.randint(ooo // 2, max(ooo // 2, ooo - 1000))
        if intent == "late":
            return arrival - arrival % HOUR_MS - HOUR_MS - rng.randint(1, HOUR_MS - 1) - ooo
        if intent == "too_late":
            return arrival - self.et.allowed_lateness - 2 * HOUR_MS - rng.randint(0, 6 * HOUR_MS)
        if intent == "future":
            return arrival + self.et.max_future_skew + HOUR_MS + rng.randint(0, 30 * 24 * HOUR_MS)
        if intent == "fast_clock":
            return arrival + int(self.p.fast_by * 1000) - rng.randint(0, max(1, ooo // 8))
        return arrival - rng.randint(0, max(1, ooo // 8))

    def _time_value(self, ms: int) -> Any:
        if self.et.time_logical_divisor:
            return ms * self.et.time_logical_divisor
        fmt = self.et.time_format
        if fmt == "epoch_seconds":
            return ms / 1000.0
        if fmt == "iso8601":
            return iso(ms)
        return ms

    def record(self, i: int, rng: random.Random, event_time: int) -> dict[str, Any]:
        rec = {name: self.values.value(t, name, rng) for name, t in self.fields}
        rec[self.et.time_field] = self._time_value(event_time)
        return rec

    @staticmethod
    def _protobuf_encoder(et: EventType) -> Any:
        """A Protobuf type's producer: its records as messages (:mod:`event_etl.payloads.protoencode`)."""
        if et.payload != "protobuf":
            return None
        from event_etl.payloads.protobuf import ProtoSchema
        from event_etl.payloads.protoencode import encoder

        proto = ProtoSchema.from_bytes(base64.b64decode(et.protobuf_descriptor), str(et.protobuf_message),
                                       origin=et.descriptor_file)
        return encoder(proto, et.schema)

    def wire(self, payload: bytes) -> bytes:
        """A payload as a message carries it (Pub/Sub): a binary dialect's bytes, not the base64 line a folder
        source (and this generator's splits) hold."""
        return base64.b64decode(payload) if self._proto is not None else payload

    def encode(self, rec: dict[str, Any]) -> bytes:
        if self._proto is not None:  # a Protobuf type: its message, one base64 line as a folder holds it
            return base64.b64encode(self._proto(rec))
        if self.p.format == "avro":
            return base64.b64encode(encode_single_object(self.parsed, self.fingerprint, rec))
        return orjson.dumps(rec)

    def one(self, i: int) -> Generated:
        rng = self._rng(i)
        arrival = self.p.arrival(i)
        intent = self._intent(rng)
        if intent == "duplicate" and i > 0:
            # A producer retry: the same bytes as a recent valid event.
            j = i - 1 - rng.randint(0, min(i - 1, 50))
            orig = self.one(j)
            while orig.intent in ("invalid", "duplicate") and j > 0:
                j -= 1
                orig = self.one(j)
            if orig.intent not in ("invalid", "duplicate"):
                return Generated(i, orig.payload, arrival, "duplicate", orig.event_id, orig.event_time)
        if intent == "invalid":
            payload = self._invalid(rng, arrival)
            return Generated(i, payload, arrival, "invalid", None, None)
        if intent == "duplicate":
            intent = "timely"
        et = self._event_time(intent, arrival, rng)
        if self.p.version >= 2 and intent in ("out_of_order", "late") and et < self.first_hour:
            intent, et = "timely", self._event_time("timely", arrival, rng)  # no hour before the generator's start
        rec = self.record(i, rng, et)
        eid = rec.get(self.et.id_field) if self.et.id_field else None
        return Generated(i, self.encode(rec), arrival, intent, None if eid is None else str(eid), et)

    def _invalid(self, rng: random.Random, arrival: int) -> bytes:
        kind = rng.randint(0, 5)
        rec = self.record(0, rng, arrival)
        if self._proto is not None:  # a message cut short, or bytes of no message
            whole = self._proto(rec)
            return base64.b64encode(whole[:max(1, len(whole) - 1 - kind)] if kind < 4 else b"\xff" * 11)
        if kind == 0:
            return orjson.dumps(rec)[:-7]  # truncated JSON
        if kind == 1:
            rec.pop(self.et.time_field)
            return orjson.dumps(rec)
        if kind == 2:
            rec[self.et.time_field] = "not a time"
            return orjson.dumps(rec)
        if kind == 3:
            return orjson.dumps([rec])
        if kind == 4:
            name = next((n for n, t in self.fields if t in ("string", "long", "int") and n != self.et.time_field), None)
            if name is not None:
                rec[name] = {"unexpected": True}
                return orjson.dumps(rec)
        return b"\xff\xfe not utf-8 \xc0"

    def range(self, start: int, end: int) -> Iterator[Generated]:
        for i in range(start, end):
            yield self.one(i)


def generate(event_type: EventType, params: GeneratorParams, start: int, end: int) -> Iterator[Generated]:
    """Events ``start`` .. ``end - 1`` of the generator ``params`` for ``event_type``."""
    return Generator(event_type, params).range(start, end)
