"""A Confluent schema registry for tests: the REST calls confluent-kafka's client and serializers make, over real HTTP.

No registry can run on this machine (no Java, no karapace), so tests that need one start this: a
``ThreadingHTTPServer`` on ``127.0.0.1`` (a free port) that keeps schemas in memory and answers as the registry's
documented API does (https://docs.confluent.io/platform/current/schema-registry/develop/api.html):

====================================================  ===========================================================
``POST /subjects/{subject}/versions``                  register (``?normalize=`` ignored): the same schema again
                                                       gives the same id; ids are global across subjects, from 1
``POST /subjects/{subject}``                           look a schema up (``?normalize=&deleted=&format=`` ignored)
``GET /schemas/ids/{id}``                              the schema (``?subject=`` ignored, ``?format=`` below)
``GET /schemas/ids/{id}/versions``, ``.../subjects``   where an id is registered
``GET /schemas/types``                                 ``["AVRO", "JSON", "PROTOBUF"]``
``GET /subjects``                                      the subjects
``GET /subjects/{subject}/versions``                   a subject's versions
``GET /subjects/{subject}/versions/{version|latest}``  one version (``?deleted=`` ignored, ``?format=`` below)
``GET``/``PUT /config``, ``/config/{subject}``         compatibility levels (kept, never enforced)
``GET /associations/resources/{namespace}/{topic}``    ``[]``: no associations (the serializers' default subject
                                                       strategy, ASSOCIATED, asks first, then falls back to TOPIC)
====================================================  ===========================================================

Answers are ``application/vnd.schemaregistry.v1+json``; errors are the registry's ``{"error_code", "message"}``
(404: 40401 subject not found, 40402 version not found, 40403 schema not found, 40408 no subject-level config;
422: 42201 invalid schema; 401 when basic auth is configured and the request's is missing or wrong).

``?format=``, as the registry honours it: Avro ignores it.  A Protobuf schema registered the way confluent-kafka's
Python ``ProtobufSerializer`` registers it (a base64 ``FileDescriptorProto``) comes back as registered with
``format=serialized``; without it the real registry renders ``.proto`` text, which this server cannot, so it
answers :data:`UNRENDERED_PROTO` instead: a client that forgets ``format=serialized`` fails its test.  A
schema registered as ``.proto`` text comes back as given, whatever the format.

Faults, for the tests of what a client does when the registry misbehaves: :meth:`RegistryServer.fail` (the next
*n* requests get an HTTP error), :meth:`~RegistryServer.garbage` (200 with a body that is not JSON),
:meth:`~RegistryServer.pause` / :meth:`~RegistryServer.resume` (requests are accepted and never answered: the
client waits for its read timeout, as behind a black-holed network; the connection is closed unanswered at
``resume``).  :attr:`~RegistryServer.requests` counts requests per path (``/schemas/ids/1``), whatever their
answer; :attr:`~RegistryServer.calls` lists them with their query and credentials.

The fixture :func:`registry_server` (module scope) starts one and stops it; :meth:`RegistryServer.reset` clears
faults, counts and auth between tests (the schemas stay).
"""

from __future__ import annotations

import base64
import binascii
import json
import re
import threading
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import parse_qsl, unquote, urlsplit

import pytest

__all__ = ["RegistryServer", "Call", "registry_server", "UNRENDERED_PROTO", "CONTENT_TYPE"]

CONTENT_TYPE = "application/vnd.schemaregistry.v1+json"
UNRENDERED_PROTO = "// the test registry renders no .proto text: ask with ?format=serialized\n"
GARBAGE = b"<html><body>502 Bad Gateway (not the registry)</body></html>"


class _Refusal(Exception):
    """An answer of the registry's error form."""

    def __init__(self, status: int, code: int, message: str) -> None:
        super().__init__(message)
        self.status, self.code, self.message = status, code, message


@dataclass(frozen=True)
class Call:
    """One request as the server received it."""

    method: str
    path: str
    query: dict[str, str]
    auth: str | None
    """The ``Authorization`` header's basic credentials, decoded (``user:password``), or None."""


@dataclass
class _Stored:
    id: int
    schema_type: str
    text: str
    references: list[dict[str, Any]]


@dataclass
class _State:
    schemas: dict[int, _Stored] = field(default_factory=dict)
    ids: dict[tuple[str, str, str], int] = field(default_factory=dict)
    subjects: dict[str, list[int]] = field(default_factory=dict)
    """subject -> ids by version (version n is index n - 1)."""
    config: dict[str, str] = field(default_factory=lambda: {"": "BACKWARD"})
    """"" is the global level."""


def _canonical(schema_type: str, text: str) -> str:
    if schema_type != "AVRO":
        return text
    try:
        return json.dumps(json.loads(text), separators=(",", ":"))
    except ValueError as err:
        raise _Refusal(422, 42201, f"Invalid schema: {err}") from err


def _is_serialized_proto(text: str) -> bool:
    from google.protobuf import descriptor_pb2
    from google.protobuf.message import DecodeError

    try:
        descriptor_pb2.FileDescriptorProto.FromString(base64.b64decode(text, validate=True))
    except (binascii.Error, DecodeError):  # .proto text, not a serialized descriptor
        return False
    return True


class RegistryServer:
    """The registry (see the module docstring).  ``auth="user:password"`` makes it require basic auth."""

    def __init__(self, *, auth: str | None = None) -> None:
        self.auth = auth
        self.requests: Counter[str] = Counter()
        self.calls: list[Call] = []
        self._state = _State()
        self._lock = threading.Lock()
        self._faults: list[tuple[str, int]] = []  # ("fail", status) / ("garbage", 200), consumed in order
        self._running = threading.Event()
        self._running.set()
        self._httpd: ThreadingHTTPServer | None = None
        self._thread: threading.Thread | None = None

    # -- life -----------------------------------------------------------------------------------------------------

    @property
    def port(self) -> int:
        assert self._httpd is not None, "start() the server first"
        return int(self._httpd.server_address[1])

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self) -> RegistryServer:
        registry = self

        class Handler(_Handler):
            server_registry = registry

        self._httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self._httpd.daemon_threads = True
        self._thread = threading.Thread(target=self._httpd.serve_forever, name="registry-server", daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        self._running.set()  # held requests go
        if self._httpd is not None:
            self._httpd.shutdown()
            self._httpd.server_close()
        if self._thread is not None:
            self._thread.join(timeout=5)
        self._httpd = self._thread = None

    def __enter__(self) -> RegistryServer:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    # -- faults and counts ----------------------------------------------------------------------------------------

    def fail(self, status: int = 500, times: int = 1) -> None:
        """The next ``times`` requests get ``status`` with the registry's error body (50001 for a 5xx)."""
        with self._lock:
            self._faults += [("fail", status)] * times

    def garbage(self, times: int = 1) -> None:
        """The next ``times`` requests get 200 with an HTML body (a proxy's page, not the registry's JSON)."""
        with self._lock:
            self._faults += [("garbage", 200)] * times

    def pause(self) -> None:
        """Accept requests and answer none until :meth:`resume` (which closes them unanswered)."""
        self._running.clear()

    def resume(self) -> None:
        self._running.set()

    def reset(self) -> None:
        """Between tests: no faults, no auth, counts at zero, not paused.  The schemas stay."""
        with self._lock:
            self._faults.clear()
            self.requests.clear()
            self.calls.clear()
        self.auth = None
        self._running.set()

    def count(self, path: str) -> int:
        """Requests received for ``path`` (no query string), whatever their answer."""
        with self._lock:
            return self.requests[path]

    # -- direct access, for tests that need a schema without a serializer ------------------------------------------

    def register(self, subject: str, schema: str, schema_type: str = "AVRO",
                 references: list[dict[str, Any]] | None = None) -> int:
        """Register as ``POST /subjects/{subject}/versions`` does, without HTTP; the id."""
        body = {"schema": schema, "schemaType": schema_type, "references": references or []}
        with self._lock:
            return int(self._register(subject, body)["id"])

    # -- the server's side ----------------------------------------------------------------------------------------

    def _received(self, call: Call) -> tuple[str, int] | None:
        with self._lock:
            self.requests[call.path] += 1
            self.calls.append(call)
            return self._faults.pop(0) if self._faults else None

    def _answer(self, method: str, path: str, query: dict[str, str], body: Any) -> Any:
        for verb, pattern, action in _ROUTES:
            m = pattern.fullmatch(path)
            if m and verb == method:
                with self._lock:
                    return action(self, [unquote(g) for g in m.groups()], query, body)
        if any(p.fullmatch(path) for _, p, _ in _ROUTES):
            raise _Refusal(405, 405, "HTTP 405 Method Not Allowed")
        raise _Refusal(404, 404, "HTTP 404 Not Found")

    def _register(self, subject: str, body: Any) -> dict[str, Any]:
        if not isinstance(body, dict) or not isinstance(body.get("schema"), str):
            raise _Refusal(422, 42201, "Invalid schema: no schema")
        schema_type = body.get("schemaType") or "AVRO"
        if schema_type not in ("AVRO", "JSON", "PROTOBUF"):
            raise _Refusal(422, 42201, f"Invalid schema type {schema_type}")
        references = list(body.get("references") or [])
        for ref in references:  # the registry checks them
            try:
                self._version(str(ref.get("subject", "")), str(ref.get("version", "")))
            except _Refusal as err:
                raise _Refusal(422, 42201, f"Invalid schema: reference {ref}: {err.message}") from err
        text = _canonical(schema_type, body["schema"])
        key = (schema_type, text, json.dumps(references, sort_keys=True))
        schema_id = self._state.ids.get(key)
        if schema_id is None:
            schema_id = self._state.ids[key] = len(self._state.schemas) + 1
            self._state.schemas[schema_id] = _Stored(schema_id, schema_type, text, references)
        versions = self._state.subjects.setdefault(subject, [])
        if schema_id not in versions:
            versions.append(schema_id)
        return {"id": schema_id}

    def _lookup(self, subject: str, body: Any) -> dict[str, Any]:
        versions = self._versions(subject)
        if not isinstance(body, dict) or not isinstance(body.get("schema"), str):
            raise _Refusal(422, 42201, "Invalid schema: no schema")
        schema_type = body.get("schemaType") or "AVRO"
        key = (schema_type, _canonical(schema_type, body["schema"]),
               json.dumps(list(body.get("references") or []), sort_keys=True))
        schema_id = self._state.ids.get(key)
        if schema_id is None or schema_id not in versions:
            raise _Refusal(404, 40403, "Schema not found")
        return self._subject_version(subject, versions.index(schema_id) + 1, None)

    def _versions(self, subject: str) -> list[int]:
        versions = self._state.subjects.get(subject)
        if not versions:
            raise _Refusal(404, 40401, f"Subject '{subject}' not found.")
        return versions

    def _version(self, subject: str, version: str) -> int:
        versions = self._versions(subject)
        if version == "latest" or version == "-1":
            return len(versions)
        if not version.isdigit() or not 1 <= int(version) <= len(versions):
            raise _Refusal(404, 40402, f"Version {version} not found.")
        return int(version)

    def _schema(self, schema_id: int) -> _Stored:
        stored = self._state.schemas.get(schema_id)
        if stored is None:
            raise _Refusal(404, 40403, "Schema not found")
        return stored

    def _document(self, stored: _Stored, fmt: str | None) -> dict[str, Any]:
        text = stored.text
        if stored.schema_type == "PROTOBUF" and fmt != "serialized" and _is_serialized_proto(text):
            text = UNRENDERED_PROTO
        doc: dict[str, Any] = {"schema": text}
        if stored.schema_type != "AVRO":  # the registry leaves out the default type
            doc["schemaType"] = stored.schema_type
        if stored.references:
            doc["references"] = stored.references
        return doc

    def _subject_version(self, subject: str, version: int, fmt: str | None) -> dict[str, Any]:
        schema_id = self._state.subjects[subject][version - 1]
        return {"subject": subject, "version": version, "id": schema_id,
                **self._document(self._state.schemas[schema_id], fmt)}


def _schema_by_id(reg: RegistryServer, groups: list[str], query: dict[str, str], body: Any) -> Any:
    return reg._document(reg._schema(int(groups[0])), query.get("format"))


def _versions_of_id(reg: RegistryServer, groups: list[str], query: dict[str, str], body: Any) -> Any:
    schema_id = reg._schema(int(groups[0])).id
    return [{"subject": s, "version": ids.index(schema_id) + 1}
            for s, ids in sorted(reg._state.subjects.items()) if schema_id in ids]


def _subjects_of_id(reg: RegistryServer, groups: list[str], query: dict[str, str], body: Any) -> Any:
    return [v["subject"] for v in _versions_of_id(reg, groups, query, body)]


def _types(reg: RegistryServer, groups: list[str], query: dict[str, str], body: Any) -> Any:
    return ["AVRO", "JSON", "PROTOBUF"]


def _subjects(reg: RegistryServer, groups: list[str], query: dict[str, str], body: Any) -> Any:
    return sorted(reg._state.subjects)


def _register(reg: RegistryServer, groups: list[str], query: dict[str, str], body: Any) -> Any:
    return reg._register(groups[0], body)


def _lookup(reg: RegistryServer, groups: list[str], query: dict[str, str], body: Any) -> Any:
    return reg._lookup(groups[0], body)


def _subject_versions(reg: RegistryServer, groups: list[str], query: dict[str, str], body: Any) -> Any:
    return list(range(1, len(reg._versions(groups[0])) + 1))


def _subject_version(reg: RegistryServer, groups: list[str], query: dict[str, str], body: Any) -> Any:
    return reg._subject_version(groups[0], reg._version(groups[0], groups[1]), query.get("format"))


def _get_config(reg: RegistryServer, groups: list[str], query: dict[str, str], body: Any) -> Any:
    subject = groups[0] if groups else ""
    level = reg._state.config.get(subject)
    if level is None and query.get("defaultToGlobal") == "true":
        level = reg._state.config[""]
    if level is None:
        raise _Refusal(404, 40408, f"Subject '{subject}' does not have subject-level compatibility configured")
    return {"compatibilityLevel": level}


def _put_config(reg: RegistryServer, groups: list[str], query: dict[str, str], body: Any) -> Any:
    level = body.get("compatibility") if isinstance(body, dict) else None
    if level not in ("BACKWARD", "BACKWARD_TRANSITIVE", "FORWARD", "FORWARD_TRANSITIVE", "FULL", "FULL_TRANSITIVE",
                     "NONE"):
        raise _Refusal(422, 42203, f"Invalid compatibility level {level}")
    reg._state.config[groups[0] if groups else ""] = level
    return {"compatibility": level}


def _associations(reg: RegistryServer, groups: list[str], query: dict[str, str], body: Any) -> Any:
    return []


_Action = Callable[[RegistryServer, list[str], dict[str, str], Any], Any]
_SEG = "([^/]+)"
_ROUTES: list[tuple[str, re.Pattern[str], _Action]] = [
    ("GET", re.compile(r"/schemas/ids/(\d+)"), _schema_by_id),
    ("GET", re.compile(r"/schemas/ids/(\d+)/versions"), _versions_of_id),
    ("GET", re.compile(r"/schemas/ids/(\d+)/subjects"), _subjects_of_id),
    ("GET", re.compile(r"/schemas/types"), _types),
    ("GET", re.compile(r"/subjects"), _subjects),
    ("POST", re.compile(rf"/subjects/{_SEG}/versions"), _register),
    ("POST", re.compile(rf"/subjects/{_SEG}"), _lookup),
    ("GET", re.compile(rf"/subjects/{_SEG}/versions"), _subject_versions),
    ("GET", re.compile(rf"/subjects/{_SEG}/versions/{_SEG}"), _subject_version),
    ("GET", re.compile(r"/config"), _get_config),
    ("PUT", re.compile(r"/config"), _put_config),
    ("GET", re.compile(rf"/config/{_SEG}"), _get_config),
    ("PUT", re.compile(rf"/config/{_SEG}"), _put_config),
    ("GET", re.compile(rf"/associations/resources/{_SEG}/{_SEG}"), _associations),
]


def _basic(header: str | None) -> str | None:
    if not header or not header.lower().startswith("basic "):
        return None
    try:
        return base64.b64decode(header[6:].strip(), validate=True).decode("utf-8")
    except (binascii.Error, UnicodeDecodeError):
        return None


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"  # keep-alive, as the real registry (httpx reuses connections)
    server_registry: RegistryServer

    def log_message(self, format: str, *args: Any) -> None:
        pass  # quiet: pytest shows what a test asserts, not an access log

    def do_GET(self) -> None:
        self._handle()

    def do_POST(self) -> None:
        self._handle()

    def do_PUT(self) -> None:
        self._handle()

    def do_DELETE(self) -> None:
        self._handle()

    def _handle(self) -> None:
        reg = self.server_registry
        parts = urlsplit(self.path)
        length = int(self.headers.get("Content-Length") or 0)
        raw = self.rfile.read(length) if length else b""
        call = Call(self.command, parts.path, dict(parse_qsl(parts.query)), _basic(self.headers.get("Authorization")))
        fault = reg._received(call)
        if not reg._running.is_set():
            reg._running.wait()  # paused: hold the request, then drop it unanswered
            self.close_connection = True
            return
        if fault is not None and fault[0] == "garbage":
            self._send(200, GARBAGE, "text/html")
            return
        try:
            if fault is not None:
                raise _Refusal(fault[1], 50001 if fault[1] >= 500 else fault[1], "Error injected by the test")
            if reg.auth is not None and call.auth != reg.auth:
                raise _Refusal(401, 401, "Unauthorized")
            body = json.loads(raw) if raw else None
            answer = reg._answer(self.command, parts.path.rstrip("/") or "/", call.query, body)
        except _Refusal as refusal:
            self._send(refusal.status, json.dumps({"error_code": refusal.code, "message": refusal.message}).encode())
            return
        except ValueError as err:  # a body that is not JSON
            self._send(400, json.dumps({"error_code": 400, "message": f"Unrecognized JSON: {err}"}).encode())
            return
        self._send(200, json.dumps(answer).encode())

    def _send(self, status: int, payload: bytes, content_type: str = CONTENT_TYPE) -> None:
        self.send_response(status)
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(payload)))
        if status == 401:
            self.send_header("WWW-Authenticate", 'Basic realm="SchemaRegistry"')
        self.end_headers()
        self.wfile.write(payload)


@pytest.fixture(scope="module")
def registry_server() -> Iterator[RegistryServer]:
    """A running :class:`RegistryServer` for the module's tests (call ``reset()`` between tests that fault it)."""
    with RegistryServer() as server:
        yield server
