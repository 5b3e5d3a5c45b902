"""``--source`` URLs: a scheme names a kind (the registry), each kind parses its own URL, a path without a scheme is a
folder, and an unknown scheme is an error naming the nearest known one, never a folder of that name."""

from __future__ import annotations

import os

import pytest
from click.testing import CliRunner

from event_etl.cli import main
from event_etl.errors import UsageError
from event_etl.settings import Settings, settings_in_force
from event_etl.sources import parse_source
from event_etl.sources.registry import SOURCES, batch_cap, kind_of_url, source_folder, url_scheme

KAFKA = {"EVENT_ETL_KAFKA_BOOTSTRAP_SERVERS": "b:9092"}


@pytest.mark.parametrize("url, scheme", [
    ("pubsub:projects/my-project/subscriptions/page-view-etl", "pubsub"),
    ("pubsb:projects/my-project/subscriptions/page-view-etl", "pubsb"),
    ("generate:", "generate"),
    ("kafka:t", "kafka"),
    ("s3://b/x", "s3"),
    ("git+ssh://h/r", "git+ssh"),
    ("a:b", "a"),
    ("in", None),
    ("generate", None),
    ("./a:b", None),
    ("/tmp/x:y", None),
    ("../x:y", None),
    ("data/2026:11", None),
    ("1x:y", None),
    ("C:/data", None),
    ("C:\\data", None),
])
def test_a_scheme_is_a_word_and_a_colon_at_the_start(url, scheme):
    assert url_scheme(url) == scheme


@pytest.mark.parametrize("url, nearest", [
    ("pubsb:projects/x/subscriptions/y", "pubsub"),
    ("pubusb:projects/x/subscriptions/y", "pubsub"),
    ("PubSub:projects/x/subscriptions/y", "pubsub"),
    ("kafak:orders", "kafka"),
    ("generat:rate=5", "generate"),
    ("gnerate:", "generate"),
    ("dri:/data/in", "dir"),
    ("s3://bucket/in", None),
    ("gs://bucket/in", None),
])
def test_an_unknown_scheme_is_an_error_naming_the_nearest_and_every_known_one(url, nearest, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    with pytest.raises(UsageError) as info:
        parse_source(url, now=0)
    err = info.value
    scheme = url.partition(":")[0]
    assert f"unknown source kind '{scheme}:'" in str(err) and "not a folder" not in str(err)
    if nearest:
        assert err.fix.startswith(f"did you mean {nearest}:?")
    else:
        assert "did you mean" not in err.fix
    for kind in SOURCES.values():
        assert kind.usage in err.fix
    assert "a path without a scheme is a folder" in err.fix and "./NAME" in err.fix
    assert err.exit_code == 2


def test_a_misspelled_scheme_is_a_usage_error_on_the_command_line(tmp_path):
    """The case of the issue: ``pubsb:`` once answered '<current folder>/pubsb:projects/... is not a folder'."""
    res = CliRunner().invoke(main, ["run", "page_view", "--sink", str(tmp_path / "s"), "--checkpoint",
                                    str(tmp_path / "ck"), "--source", "pubsb:projects/x/subscriptions/y"])
    assert res.exit_code == 2, res.output
    assert "error: --source pubsb:projects/x/subscriptions/y: unknown source kind 'pubsb:'" in res.output
    assert "fix: did you mean pubsub:?" in res.output and "not a folder" not in res.output


@pytest.mark.parametrize("name", ["a:b", "x:y:z", "2026-11-28T10:00"])
def test_a_folder_whose_name_holds_a_colon_is_a_folder_after_a_path_or_dir(name, tmp_path, monkeypatch):
    (tmp_path / name).mkdir()
    monkeypatch.chdir(tmp_path)
    for url in (f"./{name}", str(tmp_path / name), f"dir:{name}", f"dir:./{name}", f"dir:{tmp_path / name}",
                f"file://{tmp_path / name}"):
        spec = parse_source(url, now=0)
        assert (spec.kind, spec.params, spec.url) == ("dir", {"path": str(tmp_path / name)}, url)
        assert spec.identity() == f"dir:{tmp_path / name}"
        assert source_folder(url) is not None and os.path.abspath(source_folder(url)) == str(tmp_path / name)


def test_a_missing_folder_with_a_colon_later_in_its_path_is_still_a_missing_folder(tmp_path):
    with pytest.raises(UsageError, match="is not a folder") as info:
        parse_source(f"{tmp_path}/x:y", now=0)
    assert info.value.fix.startswith("create it")


def test_every_form_of_before_still_parses_to_the_same_spec(tmp_path, monkeypatch):
    (tmp_path / "in").mkdir()
    monkeypatch.chdir(tmp_path)
    folder = str(tmp_path / "in")
    for url in ("in", "./in", folder, "dir:in", f"dir:{folder}", f"file://{folder}"):
        assert parse_source(url, now=0) == parse_source(f"  {url} ", now=0)
        spec = parse_source(url, now=0)
        assert (spec.kind, spec.params["path"], spec.url) == ("dir", folder, url)
    for url in ("generate", "generate:", "generate:rate=10,speedup=60"):
        spec = parse_source(url, now=1_000)
        assert (spec.kind, spec.url) == ("generate", url) and spec.identity() == "generate:"
    assert parse_source("generate:rate=10", now=0).params["rate"] == 10.0
    sub = "projects/my-project/subscriptions/page-view-etl"
    assert parse_source(f"pubsub:{sub}", now=0) == parse_source("pubsub:", now=0, default_subscription=sub)
    spec = parse_source(f"pubsub:{sub}", now=0)
    assert (spec.kind, spec.params, spec.url, spec.identity()) == ("pubsub", {"subscription": sub}, f"pubsub:{sub}",
                                                                   f"pubsub:{sub}")
    with settings_in_force(Settings.from_env(KAFKA)):
        spec = parse_source("kafka:orders", now=0)
    assert (spec.kind, spec.params, spec.url) == ("kafka", {"topic": "orders"}, "kafka:orders")


@pytest.mark.parametrize("url, message", [
    ("", "empty --source"),
    ("   ", "empty --source"),
    ("dir:", "needs a folder"),
    ("generate:rate=-1", "positive"),
    ("pubsub:", "names no subscription"),
    ("pubsub:topics/t", "not a subscription path"),
    ("kafka:", "names no topic"),
    ("kafka://u:p@broker/t", "kafka:// URL"),
])
def test_each_kind_still_rejects_its_own_wrong_urls(url, message):
    with settings_in_force(Settings.from_env(KAFKA)), pytest.raises(UsageError, match=message) as info:
        parse_source(url, now=0)
    assert info.value.fix


def test_each_kind_parses_the_urls_its_schemes_name(tmp_path):
    """The registry's table: a URL of each scheme goes to its kind's own parser."""
    samples = {"dir": f"dir:{tmp_path}", "file": f"file://{tmp_path}", "generate": "generate:rate=5",
               "pubsub": "pubsub:projects/my-project/subscriptions/page-view-etl", "kafka": "kafka:t"}
    schemes = {scheme: kind.name for kind in SOURCES.values() for scheme in (kind.schemes or (kind.name,))}
    assert set(schemes) == set(samples)
    with settings_in_force(Settings.from_env(KAFKA)):
        for scheme, url in samples.items():
            assert kind_of_url(url).name == schemes[scheme]
            assert parse_source(url, now=0).kind == schemes[scheme]


def test_only_a_folder_source_names_a_folder_for_submit(tmp_path):
    """``submit`` makes a folder source's path absolute; an unknown scheme is left as written, for the driver's error
    (it was once made ``dir:<cwd>/pubsb:...``)."""
    from event_etl.cluster.submit import absolute_job_paths

    assert source_folder("pubsb:projects/x/subscriptions/y") is None
    assert source_folder("kafka:t") is None and source_folder("generate") is None
    assert source_folder("dir:a:b") == "a:b" and source_folder("./a:b") == "./a:b"
    for url in ("pubsb:projects/x/subscriptions/y", "s3://b/x"):
        assert absolute_job_paths("page_view", {"source": url})["source"] == url


def test_the_batch_cap_counts_what_the_kind_says():
    limits = {"max_files_per_batch": 7, "max_events_per_batch": 1000}
    assert batch_cap({"kind": "dir", **limits}) == 7
    for kind in ("generate", "pubsub", "kafka"):
        assert batch_cap({"kind": kind, **limits}) == 1000


def test_the_cluster_preflight_asks_the_executors_for_what_the_kind_needs(tmp_path):
    """The Kafka client on the executors (they read the partitions themselves): the kind says so, not a prefix."""
    from types import SimpleNamespace

    from event_etl.cluster.preflight import EXECUTOR_MODULES, preflight
    from event_etl.errors import EventEtlError

    asked: list[tuple[str, ...]] = []

    class Tasks:
        def __init__(self, fn):
            asked.append(fn.args[0])

        def collect(self):
            raise RuntimeError("no executors here")

    class Context:
        defaultParallelism = 1

        def parallelize(self, items, slices):
            return SimpleNamespace(mapPartitions=Tasks)

    (tmp_path / "in").mkdir()
    event_type = SimpleNamespace(name="page_view", source="generate:", pubsub={})
    spark = SimpleNamespace(sparkContext=Context())
    with settings_in_force(Settings.from_env(KAFKA)):
        for source in ("kafka:orders", f"dir:{tmp_path / 'in'}", "generate:"):
            options = SimpleNamespace(source=source, sink="gs://b/p", checkpoint=str(tmp_path / "ck"))
            with pytest.raises(EventEtlError, match="could not run a task"):
                preflight(spark, event_type, options)
    assert [set(modules) - set(EXECUTOR_MODULES) for modules in asked] == [{"gcsfs", "confluent_kafka"}, {"gcsfs"},
                                                                           {"gcsfs"}]
