"""The EVENT_ETL_* settings are read once, at the edge of a process's work (a command, the driver of a submitted
job, an executor task), and everything below uses what was read then."""

from __future__ import annotations

from click.testing import CliRunner

from event_etl.cli import main
from event_etl.settings import Settings, settings_in_force
from event_etl.storage.lease import default_ttl_ms


def test_what_the_edge_read_is_what_the_code_below_uses_until_the_edge_ends(monkeypatch):
    monkeypatch.setenv("EVENT_ETL_LEASE_TTL", "30s")
    assert default_ttl_ms() == 30_000  # no edge around: the environment of the moment
    with settings_in_force(Settings(lease_ttl="45s")):
        monkeypatch.setenv("EVENT_ETL_LEASE_TTL", "90s")  # changed after the edge read it: not seen below
        assert default_ttl_ms() == 45_000
        with settings_in_force():  # an edge inside (a command run by a command): its own reading
            assert default_ttl_ms() == 90_000
        assert default_ttl_ms() == 45_000
    assert default_ttl_ms() == 90_000


def test_a_command_reads_the_environment_once_however_often_the_code_below_asks(tmp_path, monkeypatch):
    """``hours`` finds the event types, opens the sink and reads its hours: three places that ask for settings
    (without the edge, each read the environment again)."""
    reads = []
    real = Settings.from_env.__func__

    def counting(cls, environ=None):
        reads.append(1)
        return real(cls, environ)

    monkeypatch.setattr(Settings, "from_env", classmethod(counting))
    (tmp_path / "sink" / "page_view" / "dt=2026-11-25" / "hour=10").mkdir(parents=True)
    result = CliRunner().invoke(main, ["hours", "page_view", "--sink", str(tmp_path / "sink")])
    assert result.exit_code == 0, result.output
    assert "hour" in result.output
    assert len(reads) == 1, f"the environment was read {len(reads)} times in one command"
