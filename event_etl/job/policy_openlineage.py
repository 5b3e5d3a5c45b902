"""Commit policy ``openlineage``: a ``COMPLETE`` run event per complete hour, through ``openlineage-python``.

The event's output dataset is the hour's folder (``gs://bucket`` + ``prefix/<type>/dt=.../hour=HH``, or ``file`` +
its absolute path, as OpenLineage names files), with the type's schema (``schema`` facet) and the hour's record
count, bytes and files (``outputStatistics``).  The job is ``<namespace>.event_etl.<type>`` by default
(``namespace`` and ``job_name`` in the policy's table).

The transport is openlineage-python's own configuration: ``OPENLINEAGE_URL`` (HTTP), or its config file
(``OPENLINEAGE_CONFIG``, ``openlineage.yml`` in the working directory or ``~/.openlineage/``), any of its
transports (``http``, ``file``, ``kafka``...).  A job with this policy and neither refuses to start, rather than
print events to its console as the client would.

Idempotent: the run id is a UUID derived from the marker's URI and sha256, so an hour emitted again after a
restart is the same run, completed again.
"""

from __future__ import annotations

import os
import uuid
from typing import Any
from urllib.parse import urlparse

from event_etl import __version__
from event_etl.errors import ConfigError
from event_etl.job.policies import CompleteHour
from event_etl.timeutil import iso

__all__ = ["OpenLineagePolicy", "dataset_name", "run_id"]

PRODUCER = f"https://pypi.org/project/event-etl/{__version__}"


def dataset_name(folder_uri: str) -> tuple[str, str]:
    """``(namespace, name)`` of an hour's folder, after OpenLineage's naming of object stores and local files."""
    u = urlparse(folder_uri)
    if u.scheme and u.netloc and len(u.scheme) > 1:
        return f"{u.scheme}://{u.netloc}", u.path.lstrip("/")
    return "file", os.path.abspath(u.path if u.scheme == "file" else folder_uri)


def run_id(hour: CompleteHour) -> str:
    """The hour's run id: the same for every emission of the same marker."""
    return str(uuid.uuid5(uuid.NAMESPACE_URL, f"{hour.marker_uri}#{hour.sha256}"))


def _avro_type(t: Any) -> str:
    if isinstance(t, list):
        return "union<" + ",".join(_avro_type(x) for x in t) + ">"
    if isinstance(t, dict):
        return str(t.get("logicalType") or t.get("type"))
    return str(t)


class OpenLineagePolicy:
    """Emits a ``COMPLETE`` run event per complete hour (see the module docstring)."""

    kind = "openlineage"

    def __init__(self, config: dict[str, Any], event_type: Any, storage: Any) -> None:
        from openlineage.client import OpenLineageClient

        self.name = str(config["name"])
        self.namespace = str(config.get("namespace") or "event_etl")
        self.job_name = str(config.get("job_name") or f"event_etl.{event_type.name}")
        self.fields = [(f["name"], _avro_type(f["type"])) for f in event_type.schema.get("fields", [])]
        self.client = OpenLineageClient()
        if self.client.transport is None or self.client.transport.kind == "console":
            raise ConfigError(
                "the openlineage commit policy has no transport configured",
                file=event_type.settings_file, field=f"commit_policy {self.name}",
                fix="set OPENLINEAGE_URL (e.g. http://marquez:5000), or OPENLINEAGE_CONFIG to an openlineage.yml "
                    "naming a transport (http, file, kafka...); OPENLINEAGE_DISABLED=true turns the events off",
            )

    def event(self, hour: CompleteHour) -> Any:
        from openlineage.client.event_v2 import Job, OutputDataset, Run, RunEvent, RunState
        from openlineage.client.facet_v2 import output_statistics_output_dataset, schema_dataset

        namespace, name = dataset_name(hour.folder_uri)
        m = hour.manifest
        schema = schema_dataset.SchemaDatasetFacet(
            fields=[schema_dataset.SchemaDatasetFacetFields(name=n, type=t) for n, t in self.fields])
        stats = output_statistics_output_dataset.OutputStatisticsOutputDatasetFacet(
            rowCount=m.records, size=m.bytes, fileCount=len(m.files))
        return RunEvent(
            eventType=RunState.COMPLETE, eventTime=iso(m.completed_at) or "", producer=PRODUCER,
            run=Run(runId=run_id(hour)), job=Job(namespace=self.namespace, name=self.job_name),
            outputs=[OutputDataset(namespace=namespace, name=name, facets={"schema": schema},
                                   outputFacets={"outputStatistics": stats})],
        )

    def run(self, hour: CompleteHour) -> None:
        self.client.emit(self.event(hour))

    def close(self) -> None:
        self.client.close(5.0)
