"""Fault points: named places in the write path where a fault campaign can stop the job.

In production this module does nothing.  With ``EVENT_ETL_FAULT_LOG=path`` set, every
point reached appends ``<name> <pid> <monotonic time> <detail>`` to that file, and with
``EVENT_ETL_FAULT_PAUSE="before_marker=0.5,write_file=0.02"`` the process pauses there,
so that a campaign (integration/campaign.py) can kill it exactly *during file writes*,
*between the last file of an hour and its marker*, and so on.

With ``EVENT_ETL_FAULT_EMPTY_PULLS=deadline``, a Pub/Sub pull that finds nothing waits for its
timeout and raises ``DeadlineExceeded``, as the real service does (the emulator answers an
empty list at once): :func:`empty_pulls_run_out`.

Points: ``write_file`` (an executor about to store a data file), ``duplicates_rewritten``
(a batch's duplicates are recorded and their splits rewritten, the files they emptied not
yet removed), ``files_written`` (all files of a batch are written, the ledger is not),
``before_marker``, ``after_marker`` (a marker is written, the state is not),
``state_saved``, ``idle_advance`` (an idle tick is about to move the watermark and mark
hours), ``drain`` (a drain begins: its markers follow); a fleet's shared engine:
``offset_written`` (a type's end offset is durable, its batch not begun); commit policies (event_etl.job.policies):
``before_policy`` (an hour's marker is durable and read back, the policy not yet run) and ``policy_done`` (its
record saved); the sink lease (event_etl.storage.lease): ``lease_renew`` (a renewal read the lease and found it still
its own, the compare-and-swap not yet written; detail: the type and the holder); Pub/Sub: ``pulled`` (messages pulled,
not yet in a spool segment), ``spooled`` (a segment is durable, not yet acknowledged nor offered to Spark),
``acknowledging`` (some of a segment's or a saved batch's messages are acknowledged, not all), ``spool_acked`` (a
segment's messages are acknowledged, the segment not yet offered) and ``segments_committed`` (Spark committed the
batches that read some segments, which are not yet deleted); the ``iceberg`` commit policy: ``iceberg_commit`` (an
hour's snapshot built, the catalog not yet told) and ``iceberg_committed`` (committed, the policy's record not saved).
"""

from __future__ import annotations

import os
import time

__all__ = ["point", "empty_pulls_run_out"]

_PAUSES: dict[str, float] | None = None


def _pauses() -> dict[str, float]:
    global _PAUSES
    if _PAUSES is None:
        out = {}
        for item in os.environ.get("EVENT_ETL_FAULT_PAUSE", "").split(","):
            if "=" in item:
                k, _, v = item.partition("=")
                out[k.strip()] = float(v)
        _PAUSES = out
    return _PAUSES


def point(name: str, detail: str = "") -> None:
    """Mark that the job reached fault point ``name`` (no-op unless a campaign asks for it)."""
    log = os.environ.get("EVENT_ETL_FAULT_LOG")
    if not log:
        return
    with open(log, "a", encoding="utf-8") as fh:
        fh.write(f"{name} {os.getpid()} {time.monotonic():.3f} {detail}\n")
    pause = _pauses().get(name)
    if pause:
        time.sleep(pause)


def empty_pulls_run_out() -> bool:
    """Whether an empty pull should behave as the real Pub/Sub service's: run out with ``DeadlineExceeded``."""
    return os.environ.get("EVENT_ETL_FAULT_EMPTY_PULLS") == "deadline"
