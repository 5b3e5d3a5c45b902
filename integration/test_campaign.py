"""The fault campaign (integration/campaign.py) at a small size: it must report 0 of every failure."""

from __future__ import annotations

import argparse

from integration.campaign import PUBSUB_POINTS, Campaign, failures, print_table


def _args(tmp_path, source: str, **kw) -> argparse.Namespace:
    base = dict(source=source, events=3000, files=96, seed=20261121, kills=10, sigterms=2,
                workdir=str(tmp_path / "campaign"), json=None, verbose=True)
    base.update(kw)
    return argparse.Namespace(**base)


def test_campaign_directory_source_to_local_disk(tmp_path):
    args = _args(tmp_path, "dir")
    result = Campaign(args).run()
    print_table(result, args)
    assert result["SIGKILL"] >= 10 and result["SIGTERM"] >= 1
    assert result["SIGTERM to the process group"] >= 1
    assert result["restarts with a backlog after a downtime > idle_timeout"] >= 1
    assert result["event-time hours"] >= 6
    assert not failures(result), result["_details"]


def test_campaign_pubsub_to_gcs(tmp_path):
    """A SIGKILL at each of Pub/Sub's own points (the batch protocol's are each killed by the directory campaign
    above; `python -m integration.campaign --source pubsub` kills at every point: RELIABILITY.md), the others at
    random points, a double kill, a downtime, a SIGTERM."""
    args = _args(tmp_path, "pubsub", events=2000, files=72, kills=7, sigterms=1, points="source")
    result = Campaign(args).run()
    print_table(result, args)
    assert result["SIGKILL"] >= 7
    killed_at = {k.split("@", 1)[1] for k in result["kills by point"] if k.startswith("SIGKILL@")}
    assert set(PUBSUB_POINTS) <= killed_at, f"a point never reached: {result['kills by point']}"
    assert not failures(result), result["_details"]
