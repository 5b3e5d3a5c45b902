"""The fault campaign (integration/campaigns/campaign.py) at a small size: it must report 0 of every failure (0 lost, 0
duplicated, 0 premature or changed markers, every record in its hour, every dead letter with its reason).

Each window is stopped once here, with one source each: the directory campaign kills at each of the batch protocol's
points (the same for every source) and makes each other kind of stop (SIGTERM to the process and to its group, a drain
cut short, a downtime, a double kill, a kill in an idle tick); the Pub/Sub campaign kills at each of Pub/Sub's own
points; the fleet campaign (issue 58) kills twenty Pub/Sub types run as one fleet where only a fleet has windows: the
shared pullers' turns, a lease's renewal by the one scheduler, the stop of every source; the bus campaign (issue 59)
kills three types that share one subscription where only a bus has windows: its one puller and spool, a type
quarantined and catching up, a type quiet while the others are busy, messages no type claims. The repeats (the Pub/Sub
campaign's random kills and other stops, more kills, other sinks, Kafka) are `python -m integration.campaigns.campaign`
(RELIABILITY.md), and the unit sweeps reach every window of the same paths far more often than any end-to-end run:
tests/sweeps/crash_sweep.py (a kill before every file-system call of the batch protocol, and again during the restart
and replay), tests/sweeps/spool_campaign.py and tests/sweeps/spool_sweep.py (the Pub/Sub fetcher broken at every call
from a pull to its acknowledgement: kills, torn writes, full disks).
"""

from __future__ import annotations

import argparse

from integration.campaigns.campaign import FAULT_POINTS, PUBSUB_POINTS, Campaign, failures, print_table


def _args(tmp_path, source: str, **kw) -> argparse.Namespace:
    base = dict(source=source, events=3000, files=64, seed=20261121, kills=len(FAULT_POINTS), sigterms=2,
                workdir=str(tmp_path / "campaign"), json=None, verbose=True)
    base.update(kw)
    return argparse.Namespace(**base)


def _killed_at(result: dict) -> set[str]:
    return {k.split("@", 1)[1] for k in result["kills by point"] if k.startswith("SIGKILL@")}


def test_campaign_directory_source_to_local_disk(tmp_path):
    """A SIGKILL at each of the batch protocol's points, a SIGTERM to the process and one to its group (both
    drain), a SIGKILL during a drain, a downtime longer than the idle timeout, a SIGKILL during the replay that
    follows a SIGKILL, a SIGKILL inside an idle tick (``--stops all``).  64 batches of input over more than six
    event-time hours (``python -m integration.campaigns.campaign`` makes 96 by default)."""
    args = _args(tmp_path, "dir")
    result = Campaign(args).run()
    print_table(result, args)
    assert result["SIGKILL"] >= len(FAULT_POINTS) and result["SIGTERM"] >= 2
    assert set(FAULT_POINTS) <= _killed_at(result), f"a point never reached: {result['kills by point']}"
    assert result["SIGTERM to the process group"] >= 1
    assert result["SIGKILL during the replay after a SIGKILL"] >= 1
    assert result["SIGKILL inside an idle tick"] >= 1
    assert result["restarts with a backlog after a downtime > idle_timeout"] >= 1
    assert result["event-time hours"] >= 6
    assert not failures(result), result["_details"]


def test_campaign_pubsub_to_gcs(tmp_path):
    """A SIGKILL at each of Pub/Sub's own points (pulled, spooled, acknowledging, spool_acked, segments_committed),
    Pub/Sub emulator -> GCS emulator, then a last run that drains (``--points source --stops kills``).  The batch
    protocol's points and the other kinds of stop are the directory campaign's (above); ``python -m
    integration.campaigns.campaign --source pubsub`` adds random kills at them, SIGTERMs, a drain cut short, a
    downtime, a double kill and an idle kill (RELIABILITY.md)."""
    args = _args(tmp_path, "pubsub", events=2000, files=72, kills=len(PUBSUB_POINTS), sigterms=0, points="source",
                 stops="kills")
    result = Campaign(args).run()
    print_table(result, args)
    assert result["SIGKILL"] >= len(PUBSUB_POINTS)
    assert set(PUBSUB_POINTS) <= _killed_at(result), f"a point never reached: {result['kills by point']}"
    assert not failures(result), result["_details"]


def test_campaign_pubsub_fleet(tmp_path):
    """A fleet of 20 Pub/Sub types in one application (issue 58: ``run --all``, its types pulling in turns on the
    shared pullers, their leases renewed by one scheduler, their sources stopped together), each type its own topic,
    subscription and share of the events (400 over 24 waves): a SIGKILL at two points of the pool's turns
    (``spooled``: a segment durable, not yet acknowledged; ``spool_acked``: acknowledged, the spool its only copy),
    one while leases renew (``lease_renew``, once a batch has run), a SIGTERM (a drain of every type), one SIGTERM
    then SIGKILL during the stop (a fleet drains type after type, then stops its sources), then a last run that
    drains.  Every check per type (0 lost, 0 duplicated, 0 premature markers: each marker's watermark past its hour,
    no file added to a marked hour), no type written by two jobs (each run's data-file writes and lease renewals in a
    fault log of its own: none after a later run's), none quarantined, no stop that hung.  Local disk: on the GCS
    emulator a restart after a SIGKILL waits out the dead run's leases (20 s each time).  Pub/Sub's other points,
    more kills and a hundred types on the GCS emulator: ``python -m integration.campaigns.campaign --source pubsub
    --types 100`` (RELIABILITY.md)."""
    # 24 waves, not 16: each run still planned keeps 2 back ((24 - 2 * AHEAD) // 6 runs), not 1 (a run with none left
    # unread cannot be killed at a pull: the bus campaign's CI failure)
    args = _args(tmp_path, "pubsub", events=400, files=24, kills=3, sigterms=1, types=20, sink="local",
                 points="spooled,spool_acked,lease_renew", stops="kills")
    result = Campaign(args).run()
    print_table(result, args)
    assert result["event types (one fleet, each its own topic and subscription)"] == 20
    assert {"spooled", "spool_acked", "lease_renew"} <= _killed_at(result), (
        f"a point never reached: {result['kills by point']}")
    assert result["SIGTERM"] >= 1 and result["SIGKILL during a SIGTERM drain"] >= 1
    assert result["types failing a check (of them)"] == "0 of 20"
    assert not failures(result), result["_details"]


def test_campaign_bus(tmp_path):
    """A bus (issue 59): three types (``bus_a``, ``bus_b``, ``bus_c``, copies of page_view) that share one Pub/Sub
    subscription, each message routed by its attribute ``type``, 6 % more messages that no type claims (half without
    the attribute, half with a value nobody claims), ``bus_c`` quiet from the 6th of 17 waves on (hours of event time),
    local disk: a SIGKILL at two of Pub/Sub's points in the bus's puller (``spooled``, ``spool_acked``), ``bus_b``
    quarantined (its sink folder replaced by a file until the run says so and the others have gone on a round, then
    back: it must come back and catch up), a SIGTERM then SIGKILL during the stop, a last run that drains (SIGTERM).
    Every check per type (0 lost, 0 duplicated, 0 premature markers, every record in its hour, one ``_COMPLETE`` an
    hour), and every unclaimed message kept exactly once in ``<sink>/_unclaimed/<bus id>/`` and nowhere else.  More
    kills, SIGTERMs, the batch protocol's points and Kafka (noida-db): ``python -m integration.campaigns.campaign
    --bus 3`` (RELIABILITY.md)."""
    # 24 waves: each run still planned keeps 3 back ((24 - 2 * AHEAD) // 5 runs); with 16 it kept 1, and a CI run
    # found no wave left unread for its SIGKILL at spool_acked after the quarantine's run had taken them
    args = _args(tmp_path, "pubsub", events=400, files=24, kills=2, sigterms=0, types=1, bus=3, sink="local",
                 points="spooled,spool_acked", stops="kills")
    result = Campaign(args).run()
    print_table(result, args)
    assert result["event types (one bus: one subscription or topic)"] == 3
    assert {"spooled", "spool_acked"} <= _killed_at(result), f"a point never reached: {result['kills by point']}"
    assert "bus_b quarantined" in result["types quarantined on purpose (sink folder blocked): run, type, what happened"]
    sent = int(result["unclaimed messages sent (no attribute / a value no type claims)"].split()[0])
    assert sent > 0 and result["unclaimed kept (files)"].split()[0] == str(sent)
    assert result["types failing a check (of them)"] == "0 of 3"
    assert not failures(result), result["_details"]
