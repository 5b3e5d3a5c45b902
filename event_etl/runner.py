"""Kept for code written against release 0.1: the job's runner is :mod:`event_etl.job.runner`."""

from event_etl.job.runner import *  # noqa: F403
from event_etl.job.runner import __all__ as __all__
