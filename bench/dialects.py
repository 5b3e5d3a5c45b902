"""The benchmark's page views as the other producers send them: Protobuf messages and Confluent-framed Avro.

:func:`dialect_input` turns the JSON input of :mod:`bench.datagen` into the same events in another dialect, one
base64 line each (what a folder source reads; the files keep their names and arrival times), made as producers make
them: messages of a ``.proto`` compiled by protoc (no generated code), frames of confluent-kafka's own
``AvroSerializer`` against the test registry.  :func:`dialect_types` writes the event types that read them:
``page_view_pb`` (its Avro schema derived from the message) and ``page_view_cf`` (page_view's schema, from the
registry).  The Confluent type's job fetches its writer schema once from the registry the benchmark serves
(:class:`tests.lib.registry_server.RegistryServer`, started by :func:`registry`) for as long as the runs last.
"""

from __future__ import annotations

import base64
import json
import os
import shutil
import sys
from pathlib import Path
from typing import Any

import orjson

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.machine import ROOT

DIALECTS = ("protobuf", "confluent")
TYPES = {"protobuf": "page_view_pb", "confluent": "page_view_cf"}
_SERVER: Any = None


def registry() -> Any:
    """The test registry, started once for the benchmark's process."""
    global _SERVER
    if _SERVER is None:
        from tests.lib.registry_server import RegistryServer

        _SERVER = RegistryServer().start()
    return _SERVER


def dialect_types(work: Path) -> Path:
    """A folder of event types holding ``page_view`` and both dialects' types (in ``work``)."""
    from tests.lib.dialects import page_view_types

    root = work / "types-dialects"
    shutil.rmtree(root, ignore_errors=True)
    return page_view_types(root, registry_url=registry().url)


def _encoder(dialect: str, types: Path) -> Any:
    from tests.lib.dialects import confluent_avro_serializer, message_class, page_view_message

    if dialect == "protobuf":
        cls = message_class(types / "page_view_pb" / "schema.desc", "shop.events.ProductPageViewed")
        return lambda rec: page_view_message(cls, rec).SerializeToString()
    schema = json.loads((ROOT / "event_types" / "page_view" / "schema.avsc").read_text())
    serialize = confluent_avro_serializer(registry().url, schema)
    full = {f["name"]: None for f in schema["fields"]}
    return lambda rec: serialize({**full, **rec})


def dialect_input(inp: Path, work: Path, dialect: str, types: Path) -> Path:
    """The input folder ``inp`` (JSON lines) as ``dialect``'s base64 lines, made once per input in ``work``."""
    out = work / f"{inp.name}-{dialect}"
    stamp = work / f"{inp.name}-{dialect}.done"
    if stamp.exists() and out.is_dir():
        return out
    shutil.rmtree(out, ignore_errors=True)
    out.mkdir(parents=True)
    encode = _encoder(dialect, types)
    for f in sorted(inp.iterdir()):
        lines = [base64.b64encode(encode(orjson.loads(line))) for line in f.read_bytes().splitlines() if line]
        target = out / f.name
        target.write_bytes(b"\n".join(lines) + b"\n")
        st = f.stat()
        os.utime(target, (st.st_atime, st.st_mtime))
    stamp.write_text("ok")
    return out
