"""The writer schemas a type's payloads may be written in, and how each is read into the type's schema.

A payload names its writer schema in one of four ways (:mod:`event_etl.payloads.frames`): a CRC-64 fingerprint
(single-object encoding), a SHA-256 fingerprint (Gilt's frame), a version of the type (``v2``, in a schema
attribute) or a registry id (Confluent's frame, or a schema attribute).  The first three name a registered version
of the type (``schemas/v<N>.avsc``, or ``schema.avsc``), checked against the current schema before the job starts.
A registry id names a schema the type's ``schema_registry`` holds: it is fetched once
(:class:`event_etl.payloads.registry.Registry`), kept in the job's checkpoint (the batch's tasks are handed those
known so far in :class:`~event_etl.task.executor.BatchContext`, and report those they fetched), and read into the
type's schema only if the project's compatibility rules allow it (:func:`event_etl.rules.compat.reader_problems`):
else its payloads are dead letters ``incompatible_schema``, the field named.

A registry that cannot be reached is waited for (the batch in flight waits, so the watermark cannot move: no
idle tick runs meanwhile), with the backoff of the sources' outages, and the job ends with ``error:``/``fix:``
once the outage has lasted ``EVENT_ETL_SCHEMA_REGISTRY_OUTAGE_SECONDS``.  Nothing is dead-lettered because the
registry was down; an id the registry says it does not hold is asked once per split, then its payloads are dead
letters ``unknown_schema``.
"""

from __future__ import annotations

import base64
import json
import logging
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from fastavro import parse_schema

from event_etl.errors import SchemaRegistryDown, redact
from event_etl.eventtypes import EventType, schema_fingerprint
from event_etl.payloads.frames import NamedSchema, gilt_fingerprint

__all__ = ["Writer", "WriterSchemas", "registry_outage_seconds"]

log = logging.getLogger(__name__)  # an executor's log: the registry's outage, as it begins

def registry_outage_seconds() -> float:
    """How long an unreachable registry is waited for (:attr:`event_etl.settings.Settings.schema_registry_outage`)."""
    from event_etl.settings import current_settings

    return current_settings().schema_registry_outage


@dataclass(frozen=True)
class Writer:
    """A writer schema and how it reads into the type's schema: ``parsed`` (for fastavro), ``same`` (its canonical
    form is the type's: a datum is the record's encoding already), ``problem`` (why the type's schema cannot read
    it, or None) and ``label`` (how messages name it)."""

    parsed: Any
    same: bool
    problem: str | None
    label: str


class WriterSchemas:
    """The writer schemas of one type's payloads (see the module docstring); one per decoder, in an executor."""

    def __init__(self, et: EventType, reader: Any, *, registry: Any = None,
                 sleep: Callable[[float], None] = time.sleep, clock: Callable[[], float] = time.monotonic) -> None:
        self.et, self.reader = et, reader
        self.by_crc: dict[str, Writer] = {}
        self.by_sha: dict[str, Writer] = {}
        self.by_version: dict[str, Writer] = {}
        for name, schema in [("schema.avsc", et.schema), *et.schema_versions]:
            fp = schema_fingerprint(schema)
            w = self.by_crc.get(fp) or Writer(parse_schema(schema), fp == et.fingerprint, None,
                                              f"{name} (crc64avro:{fp})")
            self.by_crc[fp] = w
            self.by_sha.setdefault(gilt_fingerprint(schema), w)
            if name != "schema.avsc":
                self.by_version[name] = w
        self._registry = registry
        self.known: dict[int, Any] = {}  # id -> RegistrySchema: from the checkpoint, and fetched
        self.fetched: dict[int, Any] = {}  # fetched by this process (reported, so the driver keeps them)
        self.missing: set[int] = set()  # asked this split, not held by the registry
        self._avro: dict[int, Writer] = {}
        self._lock = threading.Lock()
        self.sleep, self.clock = sleep, clock

    # -- the registry's schemas ----------------------------------------------------------------
    def seed(self, docs: Mapping[str, Any]) -> None:
        """A new split: the schemas the checkpoint holds (id -> :meth:`RegistrySchema.to_json`); ids found missing
        are asked again."""
        from event_etl.payloads.registry import RegistrySchema

        for key, doc in docs.items():
            sid = int(key)
            if sid not in self.known:
                self.known[sid] = RegistrySchema.from_json(doc)
        self.missing.clear()

    def report(self, held: Mapping[str, Any]) -> dict[str, Any]:
        """The schemas fetched that the checkpoint (``held``) does not have yet, for the split's report."""
        return {str(i): s.to_json() for i, s in sorted(self.fetched.items()) if str(i) not in held}

    def registry(self) -> Any:
        if self._registry is None:
            from event_etl.payloads.registry import Registry

            if not self.et.schema_registry:
                return None
            self._registry = Registry.for_url(self.et.schema_registry)
        return self._registry

    def by_id(self, schema_id: int) -> Any:
        """The registry's schema of ``schema_id`` (a ``RegistrySchema``), or None: the registry does not hold it
        (or the type has no registry).  Waits out an unreachable registry (:class:`SchemaRegistryDown` at the bound)."""
        found = self.known.get(schema_id)
        if found is not None or schema_id in self.missing:
            return found
        registry = self.registry()
        if registry is None:
            return None
        with self._lock:
            found = self._fetch(registry, schema_id)
        if found is None:
            self.missing.add(schema_id)
            return None
        self.known[schema_id] = self.fetched[schema_id] = found
        return found

    def _fetch(self, registry: Any, schema_id: int) -> Any:
        from event_etl.payloads.registry import RegistryUnavailable, SchemaNotFound
        from event_etl.sources.pubsub_stalls import waited_since

        since: float | None = None
        bound = registry_outage_seconds()
        while True:
            try:
                return registry.schema(schema_id)
            except SchemaNotFound:
                return None
            except RegistryUnavailable as err:
                now = self.clock()
                if since is None:
                    since = now
                    log.warning("schema registry %s unreachable while fetching schema id %s (%s): the batch waits "
                                "and retries for up to %.0fs", redact(str(self.et.schema_registry)), schema_id,
                                err.message, bound)
                if now - since >= bound:
                    raise SchemaRegistryDown(
                        f"[{self.et.name}] the schema registry {redact(str(self.et.schema_registry))} was unreachable "
                        f"for {bound:.0f}s (schema id {schema_id}): {err.message}",
                        fix="check that the registry is up and reachable from the executors, and its credentials "
                            "(EVENT_ETL_SCHEMA_REGISTRY_AUTH or _AUTH_FILE); then run the job again: the batch is "
                            "replayed and nothing was dead-lettered for the outage "
                            "(EVENT_ETL_SCHEMA_REGISTRY_OUTAGE_SECONDS sets how long it waits)") from err
                self.sleep(min(waited_since(since, now), max(0.0, since + bound - now)))

    def avro_by_id(self, schema_id: int) -> Writer | None:
        """The registry's Avro schema of ``schema_id`` as a :class:`Writer`, or None if the registry does not hold
        it.  A schema of another type than Avro, or one that does not parse, is a Writer with its problem."""
        w = self._avro.get(schema_id)
        if w is not None:
            return w
        rs = self.by_id(schema_id)
        if rs is None:
            return None
        w = self._avro[schema_id] = self._avro_writer(schema_id, rs)
        return w

    def _avro_writer(self, schema_id: int, rs: Any) -> Writer:
        label = f"registry id {schema_id}"
        if rs.schema_type != "AVRO":
            return Writer(None, False, f"{label} is a {rs.schema_type} schema, not Avro", label)
        try:
            schema = json.loads(rs.schema)
            parsed = parse_schema(schema)
        except (ValueError, TypeError, KeyError) as err:  # fastavro's parse errors are ValueErrors
            return Writer(None, False, f"{label} does not parse as an Avro schema: {err}"[:300], label)
        return self._judged(schema, parsed, label)

    def _judged(self, schema: Any, parsed: Any, label: str) -> Writer:
        """A writer schema against the type's: the same, readable (with Avro's resolution), or its problem."""
        from event_etl.rules.compat import reader_problems

        fp = schema_fingerprint(schema)
        if fp == self.et.fingerprint:
            return Writer(parsed, True, None, f"{label} (crc64avro:{fp})")
        if not isinstance(schema, dict) or schema.get("type") != "record":
            return Writer(None, False, f"{label} is not a record schema", label)
        problems = reader_problems(self.et.schema, schema, reader_is_new=True)
        problem = f"{label}: {'; '.join(map(str, problems))}"[:300] if problems else None
        return Writer(parsed, False, problem, f"{label} (crc64avro:{fp})")

    # -- names -----------------------------------------------------------------------------------
    def named(self, what: NamedSchema) -> Writer | None:
        """The writer schema a schema attribute names, or None if it names none this type knows."""
        if what.kind == "version":
            return self.by_version.get(what.key) or (self.by_crc[self.et.fingerprint]
                                                     if what.key == "schema.avsc" else None)
        if what.kind == "crc64":
            return self.by_crc.get(what.key)
        if what.kind == "sha256":
            return self.by_sha.get(what.key)
        return self.avro_by_id(int(what.key))


def descriptor_files(rs: Any) -> list[bytes]:
    """The serialized FileDescriptorProtos of a registry's Protobuf schema: its references first, then its own.

    Producers register no reference for protobuf's well-known types (``google/protobuf/timestamp.proto``...:
    confluent-kafka's serializers skip them, as the registry expects every reader to have them): they come from the
    protobuf runtime."""
    from google.protobuf import descriptor_pb2

    files = [base64.b64decode(text) for _name, text in rs.resolved] + [base64.b64decode(rs.schema)]
    protos = [descriptor_pb2.FileDescriptorProto.FromString(f) for f in files]
    have = {p.name for p in protos}
    known = [dep for p in protos for dep in p.dependency if dep not in have and dep.startswith("google/protobuf/")]
    return [_well_known(dep) for dep in dict.fromkeys(known)] + files


def _well_known(name: str) -> bytes:
    """A well-known type's file (``google/protobuf/timestamp.proto``), serialized, from the protobuf runtime."""
    import importlib

    from google.protobuf import descriptor_pb2, descriptor_pool

    module = "google.protobuf." + name.removeprefix("google/protobuf/").removesuffix(".proto") + "_pb2"
    try:
        importlib.import_module(module)  # registers the file in the default pool
        fd = descriptor_pool.Default().FindFileByName(name)
    except (ImportError, KeyError) as err:
        raise ValueError(f"{name} is not a well-known type of this protobuf runtime: register it as a reference") \
            from err
    proto = descriptor_pb2.FileDescriptorProto()
    fd.CopyToProto(proto)
    return proto.SerializeToString()


def message_name(file_proto: bytes, indexes: tuple[int, ...]) -> str:
    """The full name of the message that Confluent's message indexes point at in a file (``(0,)``: its first)."""
    from google.protobuf import descriptor_pb2

    fd = descriptor_pb2.FileDescriptorProto.FromString(file_proto)
    names: list[str] = [fd.package] if fd.package else []
    level: Any = fd.message_type
    for i in indexes:
        if i >= len(level):
            raise IndexError(f"message index {i} is past the {len(level)} messages at its level of {fd.name}")
        names.append(level[i].name)
        level = level[i].nested_type
    return ".".join(names)
