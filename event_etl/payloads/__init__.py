"""Producers' dialects: how the bytes of a payload name and carry a record, before it is the type's record.

A type's ``payload`` (``etl.toml``) says which dialect its producers write:

- ``json`` (the default): a JSON object, or a self-describing Avro frame: single-object encoding
  (``C3 01`` + CRC-64-AVRO fingerprint + datum) or Gilt's frame (``0x81`` + SHA-256 of the schema's
  canonical form + datum), each of a registered version of the type's schema (:mod:`.frames`);
- ``protobuf``: a Protobuf message decoded from the type's descriptor set (``schema.desc``), no generated
  code (:mod:`.protobuf`: the descriptor set, the Avro schema derived from the message, the decoding);
- ``confluent``: Confluent's wire format (``0x00`` + a 4-byte schema id + an Avro datum, or a Protobuf
  message after its message indexes), the writer schema fetched by id from the type's schema registry
  (:mod:`.registry`) once and kept in the job's checkpoint;
- ``avro``: a bare Avro binary datum, its writer schema named by the message (``schema_attribute``).

The frames are parsed in one place (:mod:`.frames`), so that a router of many types on one bus can read the
schema a message names before it decodes it.  Everything here is plain code over bytes and schemas: the task
(:mod:`event_etl.task.payload`) calls it per payload, the fast path (:mod:`event_etl.task.fastpath`) per chunk,
through :mod:`.avrocolumns` (flat Avro datums read as columns).
"""

__all__: list[str] = []
