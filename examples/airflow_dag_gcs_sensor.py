"""Waiting with Google's own ``GCSObjectExistenceSensor`` on the hour's ``_COMPLETE`` object (no event_etl
needed on the worker for the wait itself).

The marker of hour H is ``<prefix>/<event_type>/dt=YYYY-MM-DD/hour=HH/_COMPLETE`` in the sink's
bucket (``event_etl.consumer.airflow.marker_object`` computes it).  What this sensor cannot tell you, and
event_etl's sensor can: a wrong bucket or prefix looks exactly like "not yet" (it pokes until its
timeout), so can a permission error on some versions, and an hour before the job's first hour
never gets a marker.  Give it a ``timeout`` and alert on it.  Needs
``apache-airflow-providers-google``.
"""

from datetime import datetime, timezone

from airflow import DAG
from airflow.providers.google.cloud.sensors.gcs import GCSObjectExistenceSensor

BUCKET = "my-events"
PREFIX = "prod"  # the sink is gs://my-events/prod
EVENT_TYPE = "page_view"
MARKER = (PREFIX + "/" + EVENT_TYPE + "/dt={{ data_interval_start.strftime('%Y-%m-%d') }}"
          "/hour={{ data_interval_start.strftime('%H') }}/_COMPLETE")

with DAG(
    dag_id=f"{EVENT_TYPE}_hourly_gcs_sensor",
    schedule="@hourly",
    start_date=datetime(2026, 11, 21, tzinfo=timezone.utc),
    catchup=True,
) as dag:
    wait_for_marker = GCSObjectExistenceSensor(
        task_id="wait_for_complete_marker",
        bucket=BUCKET,
        object=MARKER,
        mode="reschedule",
        poke_interval=60,
        timeout=6 * 3600,
    )
