"""``event-etl check``: a type loaded as ``run`` loads it, what it reads said, a Protobuf type's derived schema printed
(the text a user pastes into schema.avsc), a broken type an ``error:``/``fix:`` naming the file and field (exit 2)."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
from click.testing import CliRunner

from event_etl.cli import main
from event_etl.eventtypes import load_event_type

EXAMPLES = Path(__file__).resolve().parent.parent / "examples" / "event_types"


@pytest.fixture
def types(tmp_path: Path) -> Path:
    shutil.copytree(EXAMPLES, tmp_path / "types")
    return tmp_path / "types"


def _check(types: Path, *names: str) -> tuple[int, str]:
    res = CliRunner().invoke(main, ["check", *names, "--event-types", str(types)])
    return res.exit_code, res.output


def test_a_protobuf_types_derived_schema_is_printed_as_its_files_are_written(types: Path) -> None:
    code, out = _check(types, "page_view_pb")
    assert code == 0, out
    assert "payload   protobuf" in out and "message   shop.events.ProductPageViewed" in out
    assert "derived from shop.events.ProductPageViewed" in out
    printed = "\n".join(line[4:] for line in out.splitlines() if line.startswith("    "))
    assert json.loads(printed) == load_event_type(types / "page_view_pb").schema


def test_every_type_is_shown_and_a_registry_url_without_its_credentials(types: Path) -> None:
    code, out = _check(types)
    assert code == 0, out
    assert "page_view_cf: ok" in out and "page_view_pb: ok" in out
    assert "registry  http://127.0.0.1:8081" in out


@pytest.mark.parametrize(("edit", "field", "fix"), [
    (lambda d: (d / "schema.desc").unlink(), "schema.desc", "protoc --include_imports"),
    (lambda d: _toml(d, 'protobuf_message = "shop.events.ProductPageViewd"'), "protobuf_message",
     "shop.events.ProductPageViewed"),
    (lambda d: _toml(d, 'payload = "protobuff"'), "payload", "did you mean 'protobuf'"),
    (lambda d: _toml(d, 'protobuf_timestamps = "nanos"'), "protobuf_timestamps", "millis"),
    (lambda d: (d / "schema.avsc").write_text(json.dumps(
        {"type": "record", "name": "X", "fields": [{"name": "event_id", "type": "long"},
                                                  {"name": "event_time", "type": "long"}]})),
     "schema.avsc", "event-etl check"),
])
def test_a_broken_protobuf_type_names_the_file_the_field_and_the_fix(types: Path, edit, field: str, fix: str) -> None:
    edit(types / "page_view_pb")
    code, out = _check(types, "page_view_pb")
    assert code == 2, out
    assert "page_view_pb: BROKEN" in out and "error:" in out and field in out and fix in out, out


def test_a_registry_url_with_credentials_is_refused(types: Path) -> None:
    _toml(types / "page_view_cf", 'schema_registry = "https://me:s3cret@registry.example.com"')
    code, out = _check(types, "page_view_cf")
    assert code == 2 and "schema_registry" in out and "EVENT_ETL_SCHEMA_REGISTRY_AUTH" in out, out
    assert "s3cret" not in out, "the secret is not repeated"


def test_a_set_written_without_its_imports_is_named(types: Path, tmp_path: Path) -> None:
    from grpc_tools import protoc

    from tests.lib.dialects import PAGE_VIEW_PROTO

    d = types / "page_view_pb"
    (tmp_path / "p").mkdir()
    (tmp_path / "p" / "page_view.proto").write_text(PAGE_VIEW_PROTO)
    import importlib.resources

    include = str(importlib.resources.files("grpc_tools") / "_proto")
    assert protoc.main(["protoc", f"-I{tmp_path / 'p'}", f"-I{include}", f"--descriptor_set_out={d / 'schema.desc'}",
                        str(tmp_path / "p" / "page_view.proto")]) == 0  # no --include_imports
    code, out = _check(types, "page_view_pb")
    assert code == 2 and "google/protobuf/timestamp.proto" in out and "--include_imports" in out, out


def _toml(d: Path, line: str) -> None:
    key = line.split("=")[0].strip()
    kept = [ln for ln in (d / "etl.toml").read_text().splitlines() if not ln.startswith(key)]
    (d / "etl.toml").write_text("\n".join([line, *kept]) + "\n")


def test_a_changed_descriptor_is_a_new_schema_version_under_the_compatibility_rules(types: Path) -> None:
    from event_etl.errors import ConfigError
    from event_etl.eventtypes import register_current_schema
    from tests.lib.dialects import PAGE_VIEW_PROTO, compile_proto

    d = types / "page_view_pb"
    register_current_schema(load_event_type(d))  # v1: the derived schema of today's message
    added = PAGE_VIEW_PROTO.replace("optional string country = 13;", "optional string country = 13;\n"
                                    "  optional string campaign = 14;")
    compile_proto(types / "proto-added", {"page_view.proto": added}, out=str(d / "schema.desc"))
    load_event_type(d).check_versions(warn=lambda line: None)  # a field added with a default: it reads v1
    changed = PAGE_VIEW_PROTO.replace("string session_id = 5;", "int64 session_id = 5;")
    compile_proto(types / "proto-changed", {"page_view.proto": changed}, out=str(d / "schema.desc"))
    with pytest.raises(ConfigError, match=r"v1 .*session_id"):
        load_event_type(d).check_versions(warn=lambda line: None)
    code, out = _check(types, "page_view_pb")
    assert code == 2 and "session_id" in out and "event-etl schema check page_view_pb" in out, out


@pytest.mark.parametrize("command", ["check", "types"])
def test_a_misspelt_source_names_the_file_and_the_field(tmp_path: Path, command: str) -> None:
    """``source = "pubsb:..."`` (issue 60 item 3): check and types report it, naming etl.toml and the field, with
    the nearest kind (they listed the type as fine, exit 0), and a run says the same, not a --source never given."""
    shutil.copytree(EXAMPLES.parent.parent / "event_types" / "page_view", tmp_path / "types" / "page_view")
    _toml(tmp_path / "types" / "page_view", 'source = "pubsb:projects/p/subscriptions/s"')
    res = CliRunner().invoke(main, [command, "--event-types", str(tmp_path / "types")])
    assert res.exit_code == 2, res.output
    assert "page_view/etl.toml: source: 'pubsb:projects/p/subscriptions/s': unknown source kind 'pubsb:'" in res.output
    assert "did you mean pubsub:?" in res.output and "--source" not in res.output


def test_a_run_names_the_setting_it_read_not_an_option(tmp_path: Path) -> None:
    from event_etl.errors import ConfigError
    from event_etl.sources.registry import job_source

    shutil.copytree(EXAMPLES.parent.parent / "event_types" / "page_view", tmp_path / "page_view")
    _toml(tmp_path / "page_view", 'source = "pubsb:projects/p/subscriptions/s"')
    et = load_event_type(tmp_path / "page_view")
    with pytest.raises(ConfigError) as err:
        job_source(et, None, now=0)
    assert err.value.field == "source" and err.value.file.endswith("page_view/etl.toml")
    assert "--source" not in str(err.value)


def test_the_examples_descriptor_set_is_protocs_output_of_its_proto(tmp_path: Path) -> None:
    """examples/event_types/page_view_pb/schema.desc is what its README step 1 writes from page_view.proto (protoc
    with --include_imports): a .proto edited without the set compiled again is caught."""
    from tests.lib.dialects import compile_proto

    d = EXAMPLES / "page_view_pb"
    made = compile_proto(tmp_path, {"page_view.proto": (d / "page_view.proto").read_text()})
    from event_etl.payloads.protobuf import ProtoSchema

    ours = ProtoSchema.load(d / "schema.desc", "shop.events.ProductPageViewed")
    theirs = ProtoSchema.load(made, "shop.events.ProductPageViewed")
    assert ours.fingerprint == theirs.fingerprint and ours.avro_schema() == theirs.avro_schema()
