"""Avro records as Arrow tables: one Arrow type per Avro type, decided by the schema, not by the data.

A table built from the schema has the same columns and types for every hour, also an hour
without records, so hours can be concatenated.  The mapping is the one a type of ``format =
"parquet"`` writes its files in (:mod:`event_etl.storage.parquetio`, one copy of it):

======================================  ===============================================
Avro                                    Arrow
======================================  ===============================================
boolean, int, long, float, double       bool, int32, int64, float32, float64
string (also ``uuid``), enum            string
bytes, fixed                            binary, fixed_size_binary
``timestamp-millis`` / ``-micros``      timestamp[ms, UTC] / timestamp[us, UTC]
``local-timestamp-millis`` / ``-micros``  timestamp[ms] / timestamp[us]
``date``, ``time-millis``, ``time-micros``  date32, time32[ms], time64[us]
``decimal``                             decimal128 (decimal256 above 38 digits)
record, array, map                      struct, list, map<string, …>
``["null", T]``                         T, nullable
======================================  ===============================================

A union of several non-null types has no faithful Arrow column here: it is refused with
:class:`~event_etl.consumer.errors.UnsupportedSchemaError` (read such hours as records).
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import pyarrow as pa

from event_etl.consumer.errors import UnsupportedSchemaError
from event_etl.storage.parquetio import AvroArrow, UnsupportedSchema

__all__ = ["ArrowConverter"]


class ArrowConverter:
    """Turns records of one Avro record schema (as fastavro reads them) into Arrow tables."""

    def __init__(self, avro_schema: dict[str, Any]) -> None:
        try:
            self._mapping = AvroArrow(avro_schema)
        except UnsupportedSchema as err:
            raise UnsupportedSchemaError(str(err), fix="read the hour with read_records (or cat --format jsonl) "
                                                       "instead") from err
        self.schema: pa.Schema = self._mapping.schema

    def table(self, records: Iterable[dict[str, Any]]) -> pa.Table:
        """An Arrow table of ``records`` with this converter's schema."""
        return self._mapping.table(records)
