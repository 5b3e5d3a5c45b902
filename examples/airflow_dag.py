"""An hourly Airflow DAG that waits for event_etl's ``_COMPLETE`` marker, verifies the hour, then reads it once.

Copy it into your DAGs folder and set ``SINK`` and ``EVENT_TYPE``.  It needs Airflow (2.4 or
later; on Airflow 3 import ``PythonSensor`` and ``PythonOperator`` from
``airflow.providers.standard``) and event_etl in the workers' environment; event_etl itself
does not depend on Airflow.

How the sensor behaves (``event_etl.consumer.poke_hour``):

- the hour has its marker: ``True``, the sensor succeeds and ``load_hour`` runs;
- not yet (open, or nothing arrived yet): ``False``, the sensor pokes again in
  ``poke_interval`` until its ``timeout``;
- the sink cannot be read (network, permission): it raises ``CouldNotCheckError``, so the
  task fails and Airflow's ``retries`` apply: a storage outage is never taken for "not yet";
- the hour lies before the job's first hour: it raises ``HourNeverCompleteError`` (no marker
  will ever come: set ``start_date`` to the job's first hour or later).
"""

from datetime import datetime, timedelta, timezone

from airflow import DAG
from airflow.operators.python import PythonOperator
from airflow.sensors.python import PythonSensor

from event_etl.consumer import poke_hour, read_table, verify_hour

SINK = "gs://my-events/prod"
EVENT_TYPE = "page_view"
HOUR = "{{ data_interval_start }}"  # rendered as "2026-11-21 13:00:00+00:00": the hour this run is about


def load_hour(hour: str) -> int:
    """Verify the complete hour, then read exactly the files its manifest lists."""
    report = verify_hour(SINK, EVENT_TYPE, hour)
    if not report.ok:
        raise RuntimeError(report.describe())
    table = read_table(SINK, EVENT_TYPE, hour, include_late=True)
    # ... write `table` to the warehouse, partitioned by the hour, replacing what an earlier try wrote ...
    return table.num_rows


with DAG(
    dag_id=f"{EVENT_TYPE}_hourly",
    schedule="@hourly",
    start_date=datetime(2026, 11, 21, tzinfo=timezone.utc),
    catchup=True,
    max_active_runs=4,
) as dag:
    wait_for_hour = PythonSensor(
        task_id="wait_for_complete_hour",
        python_callable=poke_hour,
        op_kwargs={"sink": SINK, "event_type": EVENT_TYPE, "hour": HOUR},
        mode="reschedule",  # frees the worker slot between pokes
        poke_interval=60,
        timeout=6 * 3600,
        retries=3,
        retry_delay=timedelta(minutes=5),
    )
    load = PythonOperator(task_id="load_hour", python_callable=load_hour, op_kwargs={"hour": HOUR})
    wait_for_hour >> load
