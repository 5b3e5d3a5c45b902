"""The hourly DAG of ``airflow_dag.py`` with event_etl's own sensor class, deferrable.

``HourCompleteSensor(deferrable=True)`` waits in Airflow's triggerer (Airflow 2.2 or later, with
a triggerer running) instead of holding a worker slot; ``deferrable=False`` with
``mode="reschedule"`` is the other way to free the slot.  It fails the task (Airflow's retries
apply) when the sink cannot be read, holds nothing for the type (a wrong sink), or the hour lies
before the job's first hour; it returns the manifest's summary (records, files) as its XCom.
"""

from datetime import datetime, timedelta, timezone

from airflow import DAG
from airflow.operators.python import PythonOperator

from event_etl.consumer.airflow import HourCompleteSensor
from event_etl.consumer import read_table

SINK = "gs://my-events/prod"
EVENT_TYPE = "page_view"
HOUR = "{{ data_interval_start }}"


def load_hour(hour: str) -> int:
    return read_table(SINK, EVENT_TYPE, hour).num_rows  # reads and checks exactly the manifest's files


with DAG(
    dag_id=f"{EVENT_TYPE}_hourly_deferrable",
    schedule="@hourly",
    start_date=datetime(2026, 11, 21, tzinfo=timezone.utc),
    catchup=True,
    max_active_runs=4,
) as dag:
    wait_for_hour = HourCompleteSensor(
        task_id="wait_for_complete_hour",
        sink=SINK,
        event_type=EVENT_TYPE,
        hour=HOUR,
        deferrable=True,
        poke_interval=60,
        timeout=6 * 3600,
        retries=3,
        retry_delay=timedelta(minutes=5),
    )
    load = PythonOperator(task_id="load_hour", python_callable=load_hour, op_kwargs={"hour": HOUR})
    wait_for_hour >> load
