"""A Confluent schema registry, asked for writer schemas by id: the registry of ``payload = "confluent"`` types.

Confluent's wire format names its writer schema by a 4-byte id (:mod:`.frames` reads it); :meth:`Registry.schema`
asks the type's registry (``schema_registry`` in ``etl.toml``) for that id once per process and keeps the answer
(an id's schema never changes in a registry).  The job's lead keeps the answers in its checkpoint
(:meth:`RegistrySchema.to_json`), so that a job restarted while the registry is down decodes what it already knew.

Asking
    ``GET /schemas/ids/{id}`` (Avro: the schema's JSON text).  For a Protobuf schema the registry renders ``.proto``
    text by default; the decoder needs the ``FileDescriptorProto`` that confluent-kafka's ``ProtobufSerializer``
    registers, which the registry gives with ``?format=serialized`` (base64).  The type of an id is only known once
    it is answered, and an Avro schema asked with a Protobuf format is an error on some registry versions, so a
    Protobuf id is asked again, as ``GET /subjects/{subject}/versions/{version}?format=serialized`` of a subject
    version ``GET /schemas/ids/{id}/versions`` names: three requests, once per id and process.  Its references
    (imported ``.proto`` files, or Avro named types of other subjects) are fetched the same way, recursively, into
    :attr:`RegistrySchema.resolved`, dependencies first, so that a descriptor pool can be built without the
    registry.  The well-known types (``google/protobuf/*.proto``) that the serializers leave out of the references
    by default are not fetched: take them from the protobuf runtime.

The client
    confluent-kafka's ``SchemaRegistryClient`` (its TLS and proxy handling, its URL failover), told to try each
    request twice with ``timeout / 2`` seconds per attempt, so that a request the registry does not answer fails
    after about ``timeout`` seconds instead of the client's default of four attempts with backoff up to 20 s; a
    :meth:`Registry.schema` that needs several requests starts none after ``timeout`` seconds.

Answers
    :class:`SchemaNotFound` (a :class:`LookupError`, not an event_etl error): the registry answered, and has no
    schema of that id (404, code 40403): a per-message answer, for a dead letter.  :class:`RegistryUnavailable`:
    the registry could not be asked, or answered something else than its documented JSON (a network error, a
    timeout, a 5xx after the retry, a 401/403, a 404 that is not the registry's, a proxy's HTML page, a
    reference the registry lacks): the job stops, the messages wait.  "Absent" and "could not ask" are never the
    same answer.

Credentials
    ``EVENT_ETL_SCHEMA_REGISTRY_AUTH`` (``user:password``, Confluent's ``basic.auth.user.info``) or
    ``EVENT_ETL_SCHEMA_REGISTRY_AUTH_FILE`` (its first line), read through :mod:`event_etl.settings` by
    :meth:`Registry.for_url`; never from ``etl.toml``, whose url is checked with :func:`url_has_credentials` when
    the type is loaded.  Messages show a url's credentials as ``***``.
"""

from __future__ import annotations

import functools
import importlib
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, TypeVar
from urllib.parse import urlsplit, urlunsplit

from confluent_kafka.schema_registry import SchemaRegistryClient, SchemaRegistryError

from event_etl.errors import EventEtlError, UsageError, redact
from event_etl.settings import ENV_SCHEMA_REGISTRY_AUTH, ENV_SCHEMA_REGISTRY_AUTH_FILE, Settings, current_settings

__all__ = ["RegistrySchema", "Registry", "RegistryUnavailable", "SchemaNotFound", "url_has_credentials"]

_T = TypeVar("_T")

_ATTEMPTS = 2
"""Tries of one request (the client's ``max.retries`` + 1): a lone 5xx or dropped connection is retried once."""
_RETRY_WAIT_MS = 100
_NOT_FOUND = 40403
_AUTH_FIX = (f"set {ENV_SCHEMA_REGISTRY_AUTH}=user:password (or {ENV_SCHEMA_REGISTRY_AUTH_FILE}=a file whose first "
             "line is user:password) to credentials the registry accepts for reading schemas, on every node")
_REACH_FIX = ("check the type's schema_registry url in etl.toml (the registry's base url, http(s)://host:port), "
              "that this node can reach it (network, proxy, TLS), and the credentials ("
              f"{ENV_SCHEMA_REGISTRY_AUTH} or {ENV_SCHEMA_REGISTRY_AUTH_FILE})")


def _transport_errors() -> tuple[type[BaseException], ...]:
    """The HTTP library's errors (connection refused or reset, timeouts, TLS, protocol): confluent-kafka uses
    httpx2 when it is installed, else httpx; catch whichever are there."""
    found: list[type[BaseException]] = []
    for name in ("httpx2", "httpx"):
        try:
            found.append(importlib.import_module(name).HTTPError)
        except ImportError:
            continue
    return tuple(found)


_TRANSPORT_ERRORS = _transport_errors()


@dataclass(frozen=True)
class RegistrySchema:
    """A registry's answer for one schema id, and what it references, fetched."""

    id: int
    schema_type: str
    """``AVRO``, ``PROTOBUF`` or ``JSON`` (the registry leaves it out for Avro)."""
    schema: str
    """Avro: the schema's JSON text; Protobuf: a base64 ``FileDescriptorProto`` (``format=serialized``)."""
    references: tuple[tuple[str, str, int], ...]
    """``(name, subject, version)`` as the registry gives them (Protobuf: ``name`` is the imported file's path)."""
    resolved: tuple[tuple[str, str], ...] = ()
    """``(name, schema text)`` of every schema referenced, directly or not, dependencies before their dependents
    (Protobuf: base64 ``FileDescriptorProto`` each, ready for ``DescriptorPool.Add`` in this order)."""

    def to_json(self) -> dict[str, Any]:
        """A JSON-able document, in the registry's field names (for the job's checkpoint)."""
        return {"id": self.id, "schemaType": self.schema_type, "schema": self.schema,
                "references": [{"name": n, "subject": s, "version": v} for n, s, v in self.references],
                "resolved": [{"name": n, "schema": text} for n, text in self.resolved]}

    @classmethod
    def from_json(cls, doc: Any) -> RegistrySchema:
        """What :meth:`to_json` wrote; :class:`ValueError` naming what is wrong with anything else."""
        try:
            return cls(id=_checked(doc["id"], int), schema_type=_checked(doc["schemaType"], str),
                       schema=_checked(doc["schema"], str),
                       references=tuple((_checked(r["name"], str), _checked(r["subject"], str),
                                         _checked(r["version"], int)) for r in _checked(doc["references"], list)),
                       resolved=tuple((_checked(r["name"], str), _checked(r["schema"], str))
                                      for r in _checked(doc.get("resolved", []), list)))
        except (KeyError, TypeError, AttributeError) as err:
            raise ValueError(f"not a registry schema's document ({type(err).__name__}: {err})") from err


def _checked(value: Any, kind: type[_T]) -> _T:
    if not isinstance(value, kind) or (kind is int and isinstance(value, bool)):
        raise TypeError(f"{value!r} is not {kind.__name__}")
    return value


class RegistryUnavailable(EventEtlError):
    """The schema registry cannot be asked right now (network, timeout, 5xx, credentials refused), or answered
    something that is not its documented JSON.  ``url`` is shown without credentials; ``status`` is the HTTP
    status when there was one."""

    def __init__(self, message: str, *, url: str, schema_id: int | None = None, status: int | None = None,
                 fix: str | None = None) -> None:
        self.url = url
        self.schema_id = schema_id
        self.status = status
        super().__init__(redact(message), fix=fix)


class SchemaNotFound(LookupError):
    """The registry answered: it has no schema of this id (HTTP 404, error code 40403)."""

    def __init__(self, schema_id: int, url: str) -> None:
        self.schema_id = schema_id
        self.url = url
        super().__init__(f"schema id {schema_id} is not in the schema registry {url}")


def url_has_credentials(url: str) -> bool:
    """Whether ``url`` (or one of a comma-separated list) carries ``user[:password]@``."""
    return any("@" in urlsplit(part.strip()).netloc for part in url.split(","))


def _shown(url: str) -> str:
    """``url`` with any ``user:password@`` replaced by ``***@``."""
    parts = []
    for part in url.split(","):
        split = urlsplit(part.strip())
        netloc = split.netloc
        if "@" in netloc:
            netloc = "***@" + netloc.rpartition("@")[2]
        parts.append(urlunsplit(split._replace(netloc=netloc)))
    return ",".join(parts)


class Registry:
    """One schema registry (a base url, or a comma-separated list the client fails over), asked by schema id.

    ``auth`` is ``user:password`` (basic auth); ``timeout`` bounds one request, retry included, in seconds;
    ``client`` is asked instead of a ``SchemaRegistryClient`` built here (anything with its ``get_schema``,
    ``get_schema_versions`` and ``get_version``: confluent-kafka's mock client, a client of the caller's own
    configuration).  Thread-safe: concurrent askers of one id wait for one request.
    """

    def __init__(self, url: str, *, auth: str | None = None, timeout: float = 10.0, client: Any = None) -> None:
        if timeout <= 0:
            raise ValueError(f"timeout must be positive, not {timeout}")
        self.url = _shown(url)
        self.timeout = timeout
        self._client: Any = client if client is not None else _build_client(url, auth, timeout)
        self._schemas: dict[int, RegistrySchema] = {}
        self._gates: dict[int, threading.Lock] = {}
        self._lock = threading.Lock()

    @classmethod
    def for_url(cls, url: str) -> Registry:
        """The registry at ``url`` with the environment's credentials (``EVENT_ETL_SCHEMA_REGISTRY_AUTH`` or
        ``..._AUTH_FILE``, see the module docstring); one per url and credentials in a process, so that the
        tasks of an executor share its answers.  :class:`~event_etl.errors.UsageError` for unusable credentials."""
        auth = _credentials(current_settings())
        key = (url, auth)
        with _SHARED_LOCK:
            found = _SHARED.get(key)
            if found is None:
                found = _SHARED[key] = cls(url, auth=auth)
            return found

    def schema(self, schema_id: int) -> RegistrySchema:
        """The registry's schema of ``schema_id``, its references resolved: asked once, then kept.

        Raises :class:`SchemaNotFound` (the registry has no such id; not kept: ask again later) or
        :class:`RegistryUnavailable`."""
        with self._lock:
            found = self._schemas.get(schema_id)
            if found is not None:
                return found
            gate = self._gates.setdefault(schema_id, threading.Lock())
        with gate:
            with self._lock:
                found = self._schemas.get(schema_id)
            if found is not None:
                return found
            try:
                found = self._fetch(schema_id)
            finally:
                with self._lock:
                    if found is not None:
                        self._schemas[schema_id] = found
                    if self._gates.get(schema_id) is gate:
                        del self._gates[schema_id]
            return found

    def close(self) -> None:
        """Close the client's connections (a closed registry still answers what it kept)."""
        close = getattr(self._client, "close", None)
        if close is not None:
            close()

    # -- asking ---------------------------------------------------------------------------------------------------

    def _fetch(self, schema_id: int) -> RegistrySchema:
        deadline = time.monotonic() + self.timeout
        what = f"schema id {schema_id}"
        text, schema_type, refs = self._parts(schema_id, what, self._ask(
            schema_id, what, functools.partial(self._client.get_schema, schema_id), deadline))
        fmt = "serialized" if schema_type == "PROTOBUF" else None
        if fmt is not None:
            text = self._serialized(schema_id, deadline)
        resolved = self._resolve(schema_id, refs, fmt, deadline) if refs else ()
        return RegistrySchema(id=schema_id, schema_type=schema_type, schema=text, references=refs, resolved=resolved)

    def _serialized(self, schema_id: int, deadline: float) -> str:
        what = f"the subject versions of schema id {schema_id}"
        versions = self._ask(schema_id, what, functools.partial(self._client.get_schema_versions, schema_id,
                                                                deleted=True), deadline)
        if not versions:
            raise RegistryUnavailable(f"the schema registry {self.url} has schema id {schema_id} under no subject "
                                      "version, so its serialized form cannot be asked", url=self.url,
                                      schema_id=schema_id, fix=_REACH_FIX)
        first = versions[0]
        what = f"subject {first.subject!r} version {first.version} (schema id {schema_id}) in format=serialized"
        answer = self._ask(schema_id, what, functools.partial(
            self._client.get_version, first.subject, first.version, True, "serialized"), deadline)
        return self._parts(schema_id, what, answer.schema)[0]

    def _resolve(self, schema_id: int, refs: tuple[tuple[str, str, int], ...], fmt: str | None,
                 deadline: float) -> tuple[tuple[str, str], ...]:
        """The referenced schemas' texts, depth first, each once, dependencies before their dependents."""
        out: list[tuple[str, str]] = []
        seen: set[str] = set()

        def visit(level: tuple[tuple[str, str, int], ...]) -> None:
            for name, subject, version in level:
                if name in seen:
                    continue
                seen.add(name)
                what = f"reference {name!r} (subject {subject!r} version {version}) of schema id {schema_id}"
                answer = self._ask(schema_id, what, functools.partial(
                    self._client.get_version, subject, version, True, fmt), deadline, reference=True)
                text, _, deeper = self._parts(schema_id, what, answer.schema)
                visit(deeper)
                out.append((name, text))

        visit(refs)
        return tuple(out)

    def _parts(self, schema_id: int, what: str, schema: Any) -> tuple[str, str, tuple[tuple[str, str, int], ...]]:
        """A client ``Schema``'s text, type and references, checked: anything missing is not the registry's JSON."""
        try:
            text = _checked(schema.schema_str, str)
            refs = tuple((_checked(r.name, str), _checked(r.subject, str), _checked(r.version, int))
                         for r in schema.references or ())
            return text, _checked(schema.schema_type or "AVRO", str), refs
        except (TypeError, AttributeError) as err:
            raise self._garbled(schema_id, what, err) from err

    def _ask(self, schema_id: int, what: str, call: Callable[[], _T], deadline: float, *,
             reference: bool = False) -> _T:
        if time.monotonic() > deadline:
            raise RegistryUnavailable(f"the schema registry {self.url} took more than {self.timeout:g} s to give "
                                      f"schema id {schema_id}; not asked for {what}", url=self.url,
                                      schema_id=schema_id, fix=_REACH_FIX)
        try:
            return call()
        except SchemaRegistryError as err:
            raise self._refused(schema_id, what, err, reference) from err
        except _TRANSPORT_ERRORS as err:
            waited = (f" (no answer in {self.timeout / _ATTEMPTS:g} s, {_ATTEMPTS} tries)"
                      if "Timeout" in type(err).__name__ else "")
            raise RegistryUnavailable(f"cannot reach the schema registry {self.url} for {what}: "
                                      f"{type(err).__name__}: {err or 'no answer'}{waited}", url=self.url,
                                      schema_id=schema_id, fix=_REACH_FIX) from err
        except (ValueError, TypeError, AttributeError, KeyError) as err:  # json's decode errors are ValueErrors
            raise self._garbled(schema_id, what, err) from err

    def _refused(self, schema_id: int, what: str, err: SchemaRegistryError, reference: bool) -> Exception:
        status, code = err.http_status_code, err.error_code
        said = f"HTTP {status}, code {code}: {err.error_message}"
        if status == 404 and code == _NOT_FOUND and not reference:
            return SchemaNotFound(schema_id, self.url)
        if status in (401, 403):
            verb = "refused the credentials" if status == 401 else "does not allow these credentials to read"
            return RegistryUnavailable(f"the schema registry {self.url} {verb} ({said}) asking for {what}",
                                       url=self.url, schema_id=schema_id, status=status, fix=_AUTH_FIX)
        if reference and status == 404:
            return RegistryUnavailable(f"the schema registry {self.url} lacks {what} ({said})", url=self.url,
                                       schema_id=schema_id, status=status,
                                       fix="restore the referenced subject version in the registry (a schema's "
                                       "references must stay registered while it is used)")
        return RegistryUnavailable(f"the schema registry {self.url} failed to answer {what} ({said})",
                                   url=self.url, schema_id=schema_id, status=status, fix=_REACH_FIX)

    def _garbled(self, schema_id: int, what: str, err: BaseException) -> RegistryUnavailable:
        return RegistryUnavailable(f"{self.url} answered {what} with something that is not the schema registry's "
                                   f"JSON ({type(err).__name__}: {err})", url=self.url, schema_id=schema_id,
                                   fix="check that the url is the registry's own base url (not a proxy's, a "
                                   "gateway's or a web console's page) and that the registry is healthy")


_SHARED: dict[tuple[str, str | None], Registry] = {}
_SHARED_LOCK = threading.Lock()


def _build_client(url: str, auth: str | None, timeout: float) -> SchemaRegistryClient:
    conf: dict[str, Any] = {
        "url": url,
        "timeout": timeout / _ATTEMPTS,  # httpx's, per attempt: connect, and each read
        "max.retries": _ATTEMPTS - 1,
        "retries.wait.ms": _RETRY_WAIT_MS,
        "retries.max.wait.ms": _RETRY_WAIT_MS,
    }
    if auth is not None:
        conf["basic.auth.user.info"] = auth
    try:
        return SchemaRegistryClient(conf)
    except (ValueError, TypeError) as err:
        raise UsageError(f"the schema registry url {_shown(url)} cannot be used: {redact(str(err))}",
                         fix="give the registry's base url, http(s)://host:port, its credentials in "
                         f"{ENV_SCHEMA_REGISTRY_AUTH} or {ENV_SCHEMA_REGISTRY_AUTH_FILE}, not in the url") from err


def _credentials(settings: Settings) -> str | None:
    """``user:password`` from the settings, or None; :class:`UsageError` when both are set or one is malformed."""
    if settings.schema_registry_auth and settings.schema_registry_auth_file:
        raise UsageError(f"both {ENV_SCHEMA_REGISTRY_AUTH} and {ENV_SCHEMA_REGISTRY_AUTH_FILE} are set",
                         fix="set one of the two (the file keeps the password out of the process's environment)")
    auth: str | None
    if settings.schema_registry_auth_file:
        auth = _read_auth_file(settings.schema_registry_auth_file)
        where = f"{ENV_SCHEMA_REGISTRY_AUTH_FILE}: the first line of {settings.schema_registry_auth_file}"
    else:
        auth = settings.schema_registry_auth
        where = ENV_SCHEMA_REGISTRY_AUTH
    if auth is not None and ":" not in auth:
        raise UsageError(f"{where} is not user:password",  # not shown: a secret
                         fix="write the registry's credentials as user:password (an API key as key:secret)")
    return auth


def _read_auth_file(path: str) -> str:
    try:
        with open(path, encoding="utf-8") as fh:
            return fh.readline().strip()
    except OSError as err:
        raise UsageError(f"{ENV_SCHEMA_REGISTRY_AUTH_FILE}: cannot read {path}: {err.strerror or err}",
                         fix=f"point {ENV_SCHEMA_REGISTRY_AUTH_FILE} at a readable file whose first line is "
                         "user:password (it must exist at that path on every node)") from err
