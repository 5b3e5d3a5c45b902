"""A sample of the spool campaign (:mod:`tests.sweeps.spool_campaign`): every 6th call of the fetcher's spool path
broken (a kill, a torn write, a full disk, a failed sync), then restarted; nothing acknowledged lost, no redelivery the
dedupe is not waiting for, no restart that fails, nothing markable before the dead run's messages are in hand."""

from __future__ import annotations

import logging

from tests.sweeps.spool_campaign import TAP_CLEAN, sweep, table


def test_a_sample_of_the_spool_campaign_loses_nothing(tmp_path, caplog):
    caplog.set_level(logging.ERROR)
    outcomes = sweep(every=6, workroot=tmp_path)
    assert len(TAP_CLEAN) > 40, "the clean run went through the spool path"
    windows = {o.window.split(" ")[0] for o in outcomes}
    assert {"kill", "torn", "ENOSPC", "EIO"} <= windows, table(outcomes)
    assert sum(o.restarted for o in outcomes) >= 5
    bad = [o for o in outcomes if not o.ok]
    assert not bad, table(outcomes) + "\n" + "\n".join(str(o) for o in bad)
