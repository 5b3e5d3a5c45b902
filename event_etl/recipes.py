"""Kept for code written against releases up to 0.3 (``from event_etl.recipes import hour_uris``): the recipes
are :mod:`event_etl.consumer.recipes`.  This path will be removed in release 0.5."""

from event_etl.consumer.recipes import *  # noqa: F403
from event_etl.consumer.recipes import __all__ as __all__
