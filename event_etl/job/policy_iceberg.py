"""Commit policy ``iceberg``: every complete hour of a Parquet type becomes one snapshot of an Iceberg table.

The hour's Parquet files (the ``_COMPLETE`` manifest's list, as stored: no copy, no rewrite) are added to the
table in one append, through ``pyiceberg`` (the ``[iceberg]`` extra, imported on use).  Query engines that read
Iceberg (pyiceberg, DuckDB's ``iceberg`` extension, Spark with ``iceberg-spark-runtime``, Trino...) then see the
hour, and only complete hours.  The Avro/Parquet files with their ``_COMPLETE`` manifests stay the contract; the
table is a view of them that a reader's engine already knows.

**The catalog.** ``catalog`` names a pyiceberg catalog: its properties come from the policy's keys
(``catalog_uri``: ``sqlite:///path/catalog.db`` or ``postgresql+psycopg2://...`` for the SQL catalog,
``http(s)://...`` for a REST catalog; ``catalog_type`` when the URI does not say; ``warehouse``) and from
pyiceberg's own configuration (``.pyiceberg.yaml``, ``PYICEBERG_CATALOG__<NAME>__<KEY>`` variables: credentials go
there, never in ``etl.toml``), any catalog pyiceberg has (``sql``, ``rest``, ``glue``, ``hive``...).

**The table** (``table``, default ``event_etl.<type>``) is created by the first hour that has files, with the
columns of its first Parquet file (all optional) and two more, which are not in the files: ``etl_hour``
(``timestamptz``: the hour whose ``_COMPLETE`` lists the file) and ``etl_late`` (``boolean``: a ``late-`` file).
The table is partitioned by both, identity (``partitioning = "hour"``, the one layout so far), so a reader filters
on ``etl_hour`` as it would open an hour's folder, and engines fill both columns from the partition metadata.

**Late files** (records of earlier hours, too late for them: a ``late-`` file) appear in the hour they *landed*
in, ``etl_late = true``, their own event time in the type's time field: an hour's snapshot is exactly its
manifest, nothing rewrites an earlier hour's partition, and ``WHERE etl_late`` finds the records whose event hour
was already complete (``event-etl late`` names them by hour).

**Schema changes** reach the table by Iceberg's schema evolution, in the same commit as the hour's files: a file
with new columns adds them (optional; earlier rows read null), a column the file lacks stays (null for its rows),
a widening Iceberg allows (``int`` to ``long``, ``float`` to ``double``) is applied; any other change is refused
with the field and the reason, and the hour waits (retried, ``event-etl status`` shows it) until the table or the
type is fixed.

**Exactly once, never before the marker.** The chain hands an hour only after its marker is durable.  The
snapshot's summary carries ``event_etl.event_type``, ``event_etl.hour``, ``event_etl.marker`` and
``event_etl.marker_sha256``, and the same commit sets the table's ``event_etl.committed_through`` property; a
policy that restarts (a kill after the catalog's commit, before its record) finds the hour there and does not add
it again.  The catalog's commit is atomic (a compare-and-swap of the table's metadata pointer): a kill inside it
leaves the hour committed or not, never half.  An hour with no files changes the property only (no snapshot).

**The table's data files are the sink's files**: a table maintenance that deletes files (expiring snapshots after a
delete or an overwrite, ``remove_orphan_files`` over a location that covers the sink) deletes them from the sink
(docs/runbook.md, "An Iceberg commit waits").
"""

from __future__ import annotations

import logging
from collections.abc import Iterable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from event_etl import faults
from event_etl.errors import ConfigError, EventEtlError
from event_etl.job.policies import CompleteHour
from event_etl.rules.buckets import hour_dir
from event_etl.timeutil import iso, parse_hour
from event_etl.util.thirdparty import iceberg_arrow_fits, iceberg_schema_of_arrow

if TYPE_CHECKING:
    from pyiceberg.catalog import Catalog
    from pyiceberg.io import FileIO
    from pyiceberg.manifest import DataFile
    from pyiceberg.table import Table, Transaction

__all__ = ["IcebergPolicy", "IcebergCommitError", "ETL_HOUR", "ETL_LATE", "PARTITIONINGS", "catalog_properties",
           "snapshot_properties", "find_commit"]

log = logging.getLogger(__name__)

ETL_HOUR = "etl_hour"
"""The table's column of the hour a file landed in (its ``_COMPLETE``): an identity partition, not in the files."""
ETL_LATE = "etl_late"
"""The table's column that says a row came from a ``late-`` file: an identity partition, not in the files."""
PARTITIONINGS = ("hour",)
"""The table layouts the policy creates: ``hour`` (identity on ``etl_hour`` and ``etl_late``)."""
PROP = "event_etl."
COMMITTED_THROUGH = PROP + "committed_through"
_PARTITION_FIELD_ID = 1000


class IcebergCommitError(EventEtlError):
    """An hour cannot be committed to the table as it is (a schema change Iceberg refuses, a table of another
    layout or type, an hour committed with another marker).  The chain retries it; the hour waits."""


@dataclass(frozen=True)
class IcebergConfig:
    """The checked keys of an ``iceberg`` policy (see :data:`event_etl.eventtypes.POLICY_KINDS`)."""

    name: str
    catalog: str
    catalog_uri: str
    catalog_type: str
    warehouse: str
    table: str
    partitioning: str


def catalog_properties(config: IcebergConfig) -> dict[str, str]:
    """The properties handed to ``pyiceberg.catalog.load_catalog`` (those not set come from pyiceberg's config)."""
    props = {"uri": config.catalog_uri, "type": config.catalog_type, "warehouse": config.warehouse}
    return {k: v for k, v in props.items() if v}


def snapshot_properties(hour: CompleteHour) -> dict[str, str]:
    """What a snapshot's summary says of the hour it adds."""
    return {PROP + "event_type": hour.event_type, PROP + "hour": iso(hour.hour) or "", PROP + "marker": hour.marker_uri,
            PROP + "marker_sha256": hour.sha256, PROP + "records": str(hour.manifest.records)}


def find_commit(summaries: Iterable[dict[str, Any]], event_type: str, hour: int) -> dict[str, Any] | None:
    """The summary of the snapshot that committed ``hour`` of ``event_type``, if any (the newest)."""
    found = None
    for s in summaries:
        if s.get(PROP + "event_type") == event_type and s.get(PROP + "hour") == iso(hour):
            found = s
    return found


def parse_config(config: dict[str, Any], event_type: Any) -> IcebergConfig:
    c = IcebergConfig(name=str(config["name"]), catalog=str(config.get("catalog") or "event_etl"),
                      catalog_uri=str(config.get("catalog_uri") or ""),
                      catalog_type=str(config.get("catalog_type") or ""),
                      warehouse=str(config.get("warehouse") or ""),
                      table=str(config.get("table") or f"event_etl.{event_type.name}"),
                      partitioning=str(config.get("partitioning") or "hour"))
    where = f"commit_policy {c.name}"
    if "." not in c.table.strip("."):
        raise ConfigError(f"table {c.table!r} names no namespace", file=event_type.settings_file,
                          field=f"{where}.table",
                          fix=f'write table = "<namespace>.<table>", e.g. "events.{event_type.name}"')
    if c.partitioning not in PARTITIONINGS:
        raise ConfigError(f"unknown partitioning {c.partitioning!r}", file=event_type.settings_file,
                          field=f"{where}.partitioning",
                          fix=f"write partitioning = \"hour\" (one of: {', '.join(PARTITIONINGS)})")
    return c


def _check_type(event_type: Any, name: str) -> None:
    """Refuse what the policy cannot do for this type: Avro files (Iceberg adds Parquet files only), fields that
    clash with the table's own columns."""
    fmt = str(getattr(event_type, "format", "avro") or "avro")
    if fmt != "parquet":
        raise ConfigError(
            f"the iceberg commit policy adds Parquet files to a table, and this type writes {fmt}",
            file=event_type.settings_file, field=f"commit_policy {name}",
            fix='set format = "parquet" in the type\'s etl.toml (new hours are written in Parquet; the policy '
                "starts after the hours already marked)")
    fields = {f["name"] for f in event_type.schema.get("fields", [])}
    clash = sorted(fields & {ETL_HOUR, ETL_LATE})
    if clash:
        raise ConfigError(f"the type's schema has a field named {clash[0]!r}, a column the iceberg policy adds",
                          file=event_type.settings_file, field=f"commit_policy {name}",
                          fix=f"rename the field {clash[0]!r} in schema.avsc")


def _file_uri(storage: Any, rel: str) -> str:
    """A data file's absolute URI, as the table records it (``file:///...`` on local disk, ``gs://...``)."""
    if storage.local:
        return "file://" + str(storage.path(rel))
    return f"{storage.url}/{rel}"


class IcebergPolicy:
    """Adds each complete hour's Parquet files to an Iceberg table in one snapshot (see the module docstring)."""

    kind = "iceberg"

    def __init__(self, config: dict[str, Any], event_type: Any, storage: Any) -> None:
        self.config = parse_config(config, event_type)
        self.name = self.config.name
        _check_type(event_type, self.name)
        try:
            import pyiceberg  # noqa: F401 - the extra is needed: say so at the start, not at the first hour
        except ImportError as err:
            raise ConfigError("pyiceberg is not installed", file=event_type.settings_file,
                              field=f"commit_policy {self.name}",
                              fix="pip install 'event_etl[iceberg]' where the job runs") from err
        self.event_type = event_type.name
        self.storage = storage
        self._catalog: Catalog | None = None

    # -- the catalog and the table -------------------------------------------------------------
    def catalog(self) -> Catalog:
        """The catalog, loaded on first use (a REST catalog that is down fails an hour, retried, not the start)."""
        if self._catalog is None:
            from pyiceberg.catalog import load_catalog

            self._catalog = load_catalog(self.config.catalog, **catalog_properties(self.config))
        return self._catalog

    def table(self) -> Table | None:
        from pyiceberg.exceptions import NoSuchTableError

        try:
            table = self.catalog().load_table(self.config.table)
        except NoSuchTableError:
            return None
        self._check_table(table)
        return table

    def _check_table(self, table: Table) -> None:
        owner = table.properties.get(PROP + "event_type")
        if owner not in (None, self.event_type):
            raise IcebergCommitError(f"table {self.config.table} holds the hours of {owner}, not {self.event_type}",
                                     fix="give the policy a table of its own (table = \"...\")")
        sources = {table.schema().find_column_name(f.source_id) for f in table.spec().fields
                   if str(f.transform) == "identity"}
        if ETL_HOUR not in sources:
            raise IcebergCommitError(f"table {self.config.table} is not partitioned by identity({ETL_HOUR})",
                                     fix="let the policy create the table (drop this one or name another), or "
                                         f"add the optional timestamptz column {ETL_HOUR} and partition by it")

    def _create(self, first_file: str) -> Table:
        """The table, created from the columns of an hour's first Parquet file (all optional), with ours."""
        import pyarrow.parquet as pq
        from pyiceberg.io import load_file_io
        from pyiceberg.partitioning import PartitionField, PartitionSpec
        from pyiceberg.schema import Schema, assign_fresh_schema_ids
        from pyiceberg.transforms import IdentityTransform
        from pyiceberg.types import BooleanType, NestedField, TimestamptzType

        cat = self.catalog()
        with load_file_io(cat.properties, first_file).new_input(first_file).open() as fin:
            arrow = pq.read_schema(fin)
        base = iceberg_schema_of_arrow(_nullable(arrow))
        schema = assign_fresh_schema_ids(Schema(
            *(NestedField(-1, f.name, f.field_type, required=False, doc=f.doc) for f in base.fields),
            NestedField(-1, ETL_HOUR, TimestamptzType(), required=False, doc="the hour whose _COMPLETE lists the file"),
            NestedField(-1, ETL_LATE, BooleanType(), required=False, doc="the row is from a late- file")))
        spec = PartitionSpec(
            PartitionField(schema.find_field(ETL_HOUR).field_id, _PARTITION_FIELD_ID, IdentityTransform(), ETL_HOUR),
            PartitionField(schema.find_field(ETL_LATE).field_id, _PARTITION_FIELD_ID + 1, IdentityTransform(),
                           ETL_LATE))
        cat.create_namespace_if_not_exists(self.config.table.rsplit(".", 1)[0])
        log.info("[%s] iceberg policy %s: creating table %s", self.event_type, self.name, self.config.table)
        return cat.create_table_if_not_exists(
            self.config.table, schema=schema, partition_spec=spec,
            properties={PROP + "event_type": self.event_type,
                        "schema.name-mapping.default": schema.name_mapping.model_dump_json()})

    # -- an hour -------------------------------------------------------------------------------
    def run(self, hour: CompleteHour) -> None:
        uris = self._uris(hour)
        table = self.table()
        if table is None:
            if not uris:
                log.info("[%s] iceberg policy %s: hour %s has no files and the table does not exist yet: nothing "
                         "to commit", self.event_type, self.name, iso(hour.hour))
                return
            table = self._create(uris[0][0])
        if self._committed(table, hour):
            return
        tx = table.transaction()
        if uris:
            self._evolve(tx, table.io, [u for u, _ in uris])
            data_files = [self._data_file(tx, table.io, uri, size, late, hour.hour) for uri, (size, late) in uris]
            with tx.update_snapshot(snapshot_properties=snapshot_properties(hour)).fast_append() as append:
                for df in data_files:
                    append.append_data_file(df)
        tx.set_properties({COMMITTED_THROUGH: iso(hour.hour) or ""})
        faults.point("iceberg_commit", f"{self.name} {hour.hour}")
        tx.commit_transaction()
        faults.point("iceberg_committed", f"{self.name} {hour.hour}")

    def _uris(self, hour: CompleteHour) -> list[tuple[str, tuple[int, bool]]]:
        folder = hour_dir(hour.event_type, hour.hour)
        out = []
        for f in hour.manifest.files:
            if not f.name.endswith(".parquet"):
                raise IcebergCommitError(
                    f"hour {iso(hour.hour)} holds {f.name}, not a Parquet file: Iceberg adds Parquet files only",
                    fix="the hour was written before format = \"parquet\": raise the policy's done_through past it "
                        "(its record in the checkpoint, etl/policies/<name>.json) to skip it")
            out.append((_file_uri(self.storage, f"{folder}/{f.name}"), (f.bytes, f.late)))
        return out

    def _committed(self, table: Table, hour: CompleteHour) -> bool:
        """Whether the table has the hour already (a restart after the catalog's commit): True, or an error if it
        was committed from another marker."""
        summaries = [s.summary.additional_properties if s.summary else {} for s in table.snapshots()]
        found = find_commit(summaries, self.event_type, hour.hour)
        if found is not None:
            if found.get(PROP + "marker_sha256") != hour.sha256:
                raise IcebergCommitError(
                    f"table {self.config.table} has hour {iso(hour.hour)} from a marker of sha256 "
                    f"{found.get(PROP + 'marker_sha256')}, and the hour's marker is now {hour.sha256}",
                    fix="the hour was marked again (a restored or rebuilt sink): remove that snapshot's files from "
                        "the table, then the policy commits the hour as it is")
            return True
        through = table.properties.get(COMMITTED_THROUGH)
        return through is not None and parse_hour(through) >= hour.hour  # its snapshot expired, or an empty hour

    def _evolve(self, tx: Transaction, io: FileIO, uris: list[str]) -> None:
        """The table's schema, widened in ``tx`` to every file's columns (Iceberg's rules), or a refusal naming the
        field and why."""
        import pyarrow.parquet as pq

        seen: set[str] = set()
        for uri in uris:
            with io.new_input(uri).open() as fin:
                arrow = _nullable(pq.read_schema(fin))
            key = str(arrow)
            if key in seen:
                continue
            seen.add(key)
            if iceberg_arrow_fits(tx.table_metadata.schema(), arrow, format_version=tx.table_metadata.format_version):
                continue
            # new columns or a changed type: evolve, if Iceberg allows it
            try:
                with tx.update_schema() as update:
                    update.union_by_name(arrow)
            except Exception as err:
                raise IcebergCommitError(
                    f"the schema of {uri.rsplit('/', 1)[-1]} does not fit table {self.config.table}: "
                    + str(err).splitlines()[0],
                    fix="Iceberg adds optional columns and widens int to long, float to double; any other change "
                        "needs a new column (a new field in schema.avsc) or a new table (table = \"...\")") from err

    def _data_file(self, tx: Transaction, io: FileIO, uri: str, size: int, late: bool, hour: int) -> DataFile:
        """A file's entry: its statistics from its Parquet footer, its partition the hour it landed in."""
        import pyarrow.parquet as pq
        from pyiceberg.io.pyarrow import (
            compute_statistics_plan,
            data_file_statistics_from_parquet_metadata,
            parquet_path_to_id_mapping,
        )
        from pyiceberg.manifest import DataFile, DataFileContent, FileFormat
        from pyiceberg.typedef import Record

        meta = tx.table_metadata
        schema = meta.schema()
        with io.new_input(uri).open() as fin:
            parquet = pq.read_metadata(fin)
        stats = data_file_statistics_from_parquet_metadata(
            parquet_metadata=parquet, stats_columns=compute_statistics_plan(schema, meta.properties),
            parquet_column_mapping=parquet_path_to_id_mapping(schema))
        return DataFile.from_args(
            content=DataFileContent.DATA, file_path=uri, file_format=FileFormat.PARQUET,
            partition=Record(hour * 1000, late), file_size_in_bytes=size, sort_order_id=None,
            spec_id=meta.default_spec_id, equality_ids=None, key_metadata=None, **stats.to_serialized_dict())

    def close(self) -> None:
        self._catalog = None


def _nullable(arrow: Any) -> Any:
    """An Arrow schema with every field nullable: a table's columns are optional, so a later file may lack one."""
    import pyarrow as pa

    return pa.schema([f.with_nullable(True) for f in arrow], metadata=arrow.metadata)

