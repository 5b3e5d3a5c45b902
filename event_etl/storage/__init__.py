"""The sink: a local folder or ``gs://bucket/prefix``, and what event_etl keeps in it.

:class:`Storage` and :func:`open_storage` (:mod:`event_etl.storage.sink`: atomic and create-only
writes, compare-and-swap, checked relative paths) over local disk or GCS
(:mod:`event_etl.storage.gcs`: gcsfs, the emulator, which errors are retried; without gcsfs, the light install's
client of :mod:`event_etl.storage.gcs_light`).  Beside them: Avro
I/O, dead letters, the lease, atomic local writes, locations, compaction, temporaries.
"""

from event_etl.storage.sink import SUPPORTED_SCHEMES, Storage, check_sink_url, open_storage, safe_relpath

__all__ = ["Storage", "open_storage", "safe_relpath", "check_sink_url", "SUPPORTED_SCHEMES"]
