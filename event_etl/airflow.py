"""Kept for DAGs written against releases up to 0.3 (``from event_etl.airflow import HourCompleteSensor``),
and for triggers those releases deferred (serialized as ``event_etl.airflow.HourCompleteTrigger``): the
sensor is :mod:`event_etl.consumer.airflow`.  This path will be removed in release 0.5.

Every name is looked up there when first asked for, so importing this module still imports no Airflow."""

from __future__ import annotations

from typing import Any

from event_etl.consumer import airflow as _airflow

__all__ = list(_airflow.__all__)


def __getattr__(name: str) -> Any:
    return getattr(_airflow, name)
