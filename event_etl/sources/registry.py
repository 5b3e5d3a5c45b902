"""The kinds of source, in one table: what is known of each without importing it, and its behaviour by name.

Every decision that depends on a source's kind is made here, from :data:`SOURCES`:

- :func:`parse_source`: a ``--source`` URL's scheme names its kind (:func:`kind_of_url`), and the kind parses the
  URL (``parse``, as each of fsspec's file systems strips its own protocol); a path without a scheme is a folder,
  an unknown scheme an error naming the nearest known one;
- :func:`open_source`: one type's session on its source (:class:`~event_etl.sources.face.SourceSession`, the face
  the engine and the controller use), opened by the kind's :class:`~event_etl.sources.face.Source` class, which
  :attr:`SourceKind.source` names and which is imported on use (as fsspec's ``known_implementations``): a kind's
  modules may need an extra (Pub/Sub's client, Kafka's);
- :meth:`SourceKind.identity`: what a checkpoint remembers of its source (:meth:`SourceSpec.identity`, the
  parsed ``--source``, lives here for that reason; :mod:`event_etl.sources` re-exports it);
- :meth:`SourceKind.check` and :meth:`SourceKind.warning`: before the job starts (the packages it needs, the
  subscription or topic exists; a line to print);
- ``event_clock``: whether progress lines show the generator's event clock;
- ``batch_unit``: what ``--max-files-per-batch`` or ``--max-events-per-batch`` counts for it (:func:`batch_cap`);
- ``shared``: what a cluster's executors read from a local folder of the driver's
  (``"input"``: the input folder; ``"checkpoint"``: the spool in the checkpoint), which
  preflight checks is mounted on every node;
- ``requires`` and ``install_hint``: the optional packages the kind needs, and how to get them
  (``executor_requires``: those the executors need too, which the cluster's preflight checks);
- ``splits`` and :func:`split_reader`: the kinds of split a kind's sessions plan, and how an executor task reads
  each (:data:`SPLIT_READERS`, the readers of :mod:`event_etl.sources.read`).
"""

from __future__ import annotations

import difflib
import importlib.util
import os
import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from event_etl.errors import ConfigError, SourceError, UsageError
from event_etl.sources.directory import SPLIT_PLAN
from event_etl.sources.face import OpenRequest, Source, SourceSession, Spooled, source_class

if TYPE_CHECKING:
    from event_etl.eventtypes import EventType
    from event_etl.sources.read import SplitReader

__all__ = ["SourceSpec", "SourceContext", "SourceKind", "SOURCES", "parse_source", "url_scheme", "kind_of_url",
           "source_folder", "source_kind", "job_source", "type_source_kind", "open_source", "spooled_in", "SPLIT_PLAN",
           "batch_cap", "batch_unit", "SPLIT_READERS", "split_reader"]


@dataclass(frozen=True)
class SourceSpec:
    """A parsed source URL: its kind and its parameters (JSON-able).

    Made by :func:`parse_source` (both are imported from :mod:`event_etl.sources` too); it lives here, beside
    :data:`SOURCES`, since what a checkpoint remembers of it depends on its kind."""

    kind: str
    params: dict[str, Any]
    url: str

    def identity(self) -> str:
        """What a checkpoint remembers of its source: same identity, same offsets meaning."""
        kind = SOURCES.get(self.kind)
        return kind.identity(self) if kind is not None else self.url


@dataclass(frozen=True)
class SourceContext:
    """What parsing a ``--source`` may need beside the URL."""

    now: int
    """The job's start (milliseconds since the epoch, UTC): fixes the generator's relative start times."""
    default_subscription: str | None = None
    """The type's ``[pubsub] subscription``: what ``pubsub:`` alone names."""


# -- parsing each kind's URL (each parser strips its own scheme) -----------------------------------------------

def _dir_path(url: str) -> str:
    """The folder a ``dir:PATH``, ``file://PATH`` or plain path names, as written."""
    if url.startswith("dir:"):
        return url[len("dir:"):]
    if url.startswith("file://"):
        return url[len("file://"):]
    if url.startswith("file:"):
        return url[len("file:"):]
    return url


def _parse_dir(url: str, context: SourceContext) -> SourceSpec:
    path = _dir_path(url)
    if not path:
        raise UsageError("--source dir: needs a folder", fix="write dir:/path/to/folder")
    path = os.path.abspath(path)
    if not os.path.isdir(path):
        raise UsageError(
            f"--source {url}: {path} is not a folder",
            fix="create it, or point --source at the folder holding the newline-delimited files",
        )
    return SourceSpec("dir", {"path": path}, url)


def _parse_generate(url: str, context: SourceContext) -> SourceSpec:
    from event_etl.sources.generator import parse_generator_params

    try:
        params = parse_generator_params(url.partition(":")[2], context.now)
    except ValueError as err:
        raise UsageError(f"--source {url}: {err}", fix="e.g. --source generate:rate=2000,speedup=60") from err
    return SourceSpec("generate", params.to_json(), url)


def _parse_pubsub(url: str, context: SourceContext) -> SourceSpec:
    from event_etl.sources.pubsub import parse_subscription

    path = url[len("pubsub:"):].strip() or (context.default_subscription or "")
    if not path:
        raise UsageError(
            "--source pubsub: names no subscription and the event type has no [pubsub] subscription",
            fix="write --source pubsub:projects/PROJECT/subscriptions/NAME, or set subscription in [pubsub] of "
            "etl.toml",
        )
    try:
        parse_subscription(path)
    except ValueError as err:
        raise UsageError(
            f"--source {url}: {err}", fix="e.g. --source pubsub:projects/my-project/subscriptions/page-view-etl"
        ) from err
    return SourceSpec("pubsub", {"subscription": path}, f"pubsub:{path}")


_KAFKA_FIX = ("write --source kafka:TOPIC and set EVENT_ETL_KAFKA_BOOTSTRAP_SERVERS=host:port (credentials, SASL and "
              "SSL go in the librdkafka properties file EVENT_ETL_KAFKA_PROPERTIES names, never in --source)")
_KAFKA_TOPIC = re.compile(r"[A-Za-z0-9._-]+")


def _parse_kafka_pattern(url: str, pattern: str) -> SourceSpec:
    """``kafka:re:PATTERN``: the topics whose names the regular expression matches whole."""
    import re

    from event_etl.settings import ENV_KAFKA_BOOTSTRAP_SERVERS, current_settings

    if not pattern:
        raise UsageError(f"--source {url}: names no pattern", fix="write e.g. kafka:re:debz-schema-A\\..*")
    try:
        re.compile(pattern)
    except re.error as err:
        raise UsageError(f"--source {url}: {pattern!r} is not a regular expression ({err})",
                         fix="write a Python regular expression that matches whole topic names, e.g. "
                             "kafka:re:cdc\\.shop\\..*") from err
    if not current_settings().kafka_bootstrap_servers:
        raise UsageError(f"--source {url}: {ENV_KAFKA_BOOTSTRAP_SERVERS} is not set", fix=_KAFKA_FIX)
    return SourceSpec("kafka", {"pattern": pattern}, f"kafka:re:{pattern}")


def _kafka_identity(spec: SourceSpec) -> str:
    if "pattern" in spec.params:
        return f"kafka:re:{spec.params['pattern']}"
    return f"kafka:{spec.params['topic']}"


def _parse_kafka(url: str, context: SourceContext) -> SourceSpec:
    """``kafka:TOPIC``; the cluster and its credentials come from the settings, not the URL."""
    from event_etl.settings import ENV_KAFKA_BOOTSTRAP_SERVERS, current_settings

    topic = url[len("kafka:"):].strip()
    if topic.startswith("//"):  # kafka://user:password@broker/topic: the URL would carry secrets into checkpoints
        raise UsageError(f"--source {url}: a kafka:// URL is not a source; the topic alone is", fix=_KAFKA_FIX)
    if not topic:
        raise UsageError("--source kafka: names no topic", fix=_KAFKA_FIX)
    if topic.startswith("re:"):  # every topic a pattern matches (event_etl.sources.kafka_pattern)
        return _parse_kafka_pattern(url, topic[3:])
    if len(topic) > 249 or not _KAFKA_TOPIC.fullmatch(topic) or topic in (".", ".."):
        raise UsageError(f"--source {url}: {topic!r} is not a Kafka topic name",
                         fix="a topic name is 1 to 249 of the characters a-z A-Z 0-9 . _ -; " + _KAFKA_FIX)
    if not current_settings().kafka_bootstrap_servers:
        raise UsageError(f"--source {url}: {ENV_KAFKA_BOOTSTRAP_SERVERS} is not set", fix=_KAFKA_FIX)
    return SourceSpec("kafka", {"topic": topic}, f"kafka:{topic}")


@dataclass(frozen=True)
class SourceKind:
    """One kind of source: what is known of it without importing its modules (see the module docstring); its
    behaviour is its :class:`~event_etl.sources.face.Source` class, named by :attr:`source` and imported on use."""

    name: str
    parse: Callable[[str, SourceContext], SourceSpec]
    """Parses a whole ``--source`` URL of this kind (scheme included) into its spec, or raises :class:`UsageError`
    with the fix."""
    usage: str
    """How a ``--source`` of this kind is written, for messages (``kafka:TOPIC``)."""
    source: str
    """The kind's :class:`~event_etl.sources.face.Source` class, ``module:Class`` (imported when a job opens)."""
    identity_of: Callable[[SourceSpec], str]
    splits: tuple[str, ...]
    """The kinds of :class:`~event_etl.sources.splits.Split` its sessions plan (:data:`SPLIT_READERS` reads them)."""
    schemes: tuple[str, ...] = ()
    """The URL schemes (before the ``:``) that name this kind; none given: its name alone."""
    bare: bool = False
    """Whether the scheme alone, without its colon, names the kind too (``generate``)."""
    folder_of: Callable[[str], str] | None = None
    """``folder_of(url)``: the local folder a URL of this kind names, as written (made absolute where a job is
    submitted); None: a kind that reads no folder of its own."""
    batch_unit: str = "events"
    """What a micro-batch's cap counts: ``files`` (``--max-files-per-batch``) or ``events``
    (``--max-events-per-batch``)."""
    event_clock: bool = False
    shared: str | None = None
    requires: tuple[str, ...] = ()
    install_hint: str | None = None
    executor_requires: tuple[str, ...] = ()
    """What the executors import to read the kind's splits beyond event_etl's own dependencies (Kafka: the client,
    they read the partitions themselves); the cluster's preflight checks it."""

    def identity(self, spec: SourceSpec) -> str:
        return self.identity_of(spec)

    def behaviour(self) -> type[Source]:
        """The kind's :class:`~event_etl.sources.face.Source` class (imported now, once)."""
        self.check_installed()
        return source_class(self.source)

    def open(self, request: OpenRequest) -> SourceSession:
        """One type's session on its source (:meth:`event_etl.sources.face.Source.open`)."""
        return self.behaviour().open(request)

    def warning(self, name: str, spec: SourceSpec, log_dir: str) -> str | None:
        """What to warn of when the job starts (Pub/Sub: a checkpoint a restart of the machine loses; Kafka:
        read_uncommitted), or None."""
        return self.behaviour().warning(name, spec.params, log_dir)

    def check(self, spec: SourceSpec) -> None:
        """What must hold before the job starts (raises with the fix): the packages it needs, and what the kind
        checks (the subscription or the topic exists)."""
        self.behaviour().check(spec.params)

    def check_installed(self) -> None:
        """Raise :class:`UsageError` with :attr:`install_hint` when a package the kind needs is missing."""
        for module in self.requires:
            try:
                found = importlib.util.find_spec(module) is not None
            except (ImportError, ValueError):
                found = False
            if not found:
                raise UsageError(f"the {self.name} source needs the Python package {module!r}, which is not installed",
                                 fix=self.install_hint or "install it")


SOURCES: dict[str, SourceKind] = {
    "dir": SourceKind("dir", _parse_dir, "dir:PATH", "event_etl.sources.directory:DirectorySource",
                      lambda spec: f"dir:{spec.params['path']}", ("files",), schemes=("dir", "file"),
                      folder_of=_dir_path, batch_unit="files", shared="input"),
    "generate": SourceKind("generate", _parse_generate, "generate:[k=v,...]",
                           "event_etl.sources.generate:GeneratorSource", lambda spec: "generate:", ("gen",),
                           bare=True, event_clock=True),
    "pubsub": SourceKind("pubsub", _parse_pubsub, "pubsub:projects/P/subscriptions/S",
                         "event_etl.sources.pubsub_session:PubSubSource", lambda spec: spec.url, ("seg", "spool"),
                         shared="checkpoint", requires=("google.cloud.pubsub_v1",),
                         install_hint="pip install 'event_etl[job]'"),
    "kafka": SourceKind("kafka", _parse_kafka, "kafka:TOPIC", "event_etl.sources.kafka_source:KafkaSource",
                        _kafka_identity, ("kafka",), shared=None,
                        requires=("confluent_kafka",), executor_requires=("confluent_kafka",),
                        install_hint="pip install 'event_etl[job]' (or pip install 'confluent-kafka>=2.3,<3')"),
}
"""Every kind of source, by the ``kind`` of its :class:`SourceSpec`."""

_SCHEMES: dict[str, SourceKind] = {
    scheme: kind for kind in SOURCES.values() for scheme in (kind.schemes or (kind.name,))
}
"""Every kind of source, by each scheme that names it."""

_SCHEME = re.compile(r"([A-Za-z][A-Za-z0-9+.-]*):")
"""A URL's scheme (RFC 3986): a letter, then letters, digits, ``+``, ``.`` or ``-``, then a colon, at the start."""


def url_scheme(url: str) -> str | None:
    """The scheme a ``--source`` starts with (``pubsub`` of ``pubsub:projects/...``), or None for a path without one:
    ``in``, ``./a:b`` and ``/tmp/x:y`` (a colon later in a path is part of a name), or a drive (``C:\\in``)."""
    m = _SCHEME.match(url)
    if m is None or (len(m.group(1)) == 1 and url[2:3] in ("\\", "/")):
        return None
    return m.group(1)


def kind_of_url(url: str) -> SourceKind:
    """The kind a ``--source`` URL names by its scheme; a path without a scheme is a folder (``dir``).

    Raises :class:`UsageError` for an unknown scheme, naming the nearest known one and every kind's form (a
    misspelled ``pubsb:projects/...`` is not taken for a folder of that name)."""
    url = url.strip()
    scheme = url_scheme(url)
    if scheme is None:
        bare = [kind for kind in SOURCES.values() if kind.bare and url in (kind.schemes or (kind.name,))]
        return bare[0] if bare else SOURCES["dir"]
    kind = _SCHEMES.get(scheme)
    if kind is not None:
        return kind
    close = difflib.get_close_matches(scheme.lower(), list(_SCHEMES), n=1)
    raise UsageError(
        f"--source {url}: unknown source kind {scheme + ':'!r}",
        fix=(f"did you mean {close[0]}:? " if close else "")
        + f"known: {', '.join(k.usage for k in SOURCES.values())}; a path without a scheme is a folder too "
        "(./NAME or dir:NAME for a folder whose name holds a colon)",
    )


def parse_source(url: str, *, now: int, default_subscription: str | None = None) -> SourceSpec:
    """Parse a ``--source`` value: its scheme names the kind (:func:`kind_of_url`), which parses the rest.

    ``now`` fixes relative generator start times; ``pubsub:`` alone means ``default_subscription`` (the type's
    ``[pubsub] subscription``).  Raises :class:`UsageError` with the fix."""
    if url is None or not str(url).strip():
        forms = [k.usage for k in SOURCES.values()]
        raise UsageError("empty --source", fix=f"use {', '.join(forms)} or a folder path")
    url = str(url).strip()
    return kind_of_url(url).parse(url, SourceContext(now, default_subscription))


def job_source(event_type: EventType, url: str | None, *, now: int) -> SourceSpec:
    """The source a job of ``event_type`` reads: ``url`` (``--source``) if given, else the type's ``source`` setting,
    whose errors name its ``etl.toml`` and the field (a user who passed no ``--source`` is not told about one)."""
    if url is not None:
        return parse_source(url, now=now, default_subscription=event_type.pubsub.get("subscription"))
    try:
        return parse_source(event_type.source, now=now, default_subscription=event_type.pubsub.get("subscription"))
    except UsageError as err:
        raise _setting_error(event_type, err) from err


def type_source_kind(event_type: EventType) -> SourceKind:
    """The kind of the type's ``source`` setting, by its scheme (what ``check`` and ``types`` can say without the
    environment a job runs in); :class:`ConfigError` naming its etl.toml and the field for an unknown one."""
    try:
        return kind_of_url(event_type.source)
    except UsageError as err:
        raise _setting_error(event_type, err) from err


def _setting_error(event_type: EventType, err: UsageError) -> ConfigError:
    """A ``--source`` error about the type's ``source`` setting, said of its etl.toml and the field."""
    message = re.sub(r"^(empty )?--source( \S+)?:? ?", "", err.message) or "empty"
    return ConfigError(f"{event_type.source!r}: {message}", file=event_type.settings_file, field="source",
                       fix=(err.fix or "").replace("--source", "source"))


def source_folder(url: str) -> str | None:
    """The local folder a ``--source`` names, as written (``dir:PATH``, ``file://PATH`` or a path), without looking
    at it; None for a source of another kind, or a URL of an unknown scheme (an error when the job parses it)."""
    url = url.strip()
    try:
        kind = kind_of_url(url)
    except UsageError:
        return None
    return kind.folder_of(url) if kind.folder_of is not None else None


def source_kind(kind: str) -> SourceKind:
    try:
        return SOURCES[kind]
    except KeyError:
        raise ValueError(f"unknown source kind {kind!r}") from None


def spooled_in(source_root: str | os.PathLike[str]) -> Spooled | None:
    """What a checkpoint's spool holds (``source_root``: its ``etl/source`` folder, a folder per kind), read only;
    None when no kind keeps a spool there."""
    for kind in SOURCES.values():
        folder = os.path.join(source_root, kind.name)
        if os.path.isdir(folder):
            found = source_class(kind.source).spooled_at(folder)
            if found is not None:
                return found
    return None


def open_source(request: OpenRequest) -> SourceSession:
    """One type's session on the source its spec names (``request.spec``: ``kind``, ``params``, ``log_dir``,
    limits), opened by the kind's :class:`~event_etl.sources.face.Source`."""
    return source_kind(request.spec["kind"]).open(request)


def batch_unit(spec: dict[str, Any]) -> str:
    """What the cap of a micro-batch of this source counts: ``files`` or ``events`` (:attr:`SourceKind.batch_unit`)."""
    return source_kind(spec["kind"]).batch_unit


def batch_cap(spec: dict[str, Any]) -> int:
    """The most a micro-batch takes of the source: files of a folder, else events (``--max-files-per-batch``,
    ``--max-events-per-batch``)."""
    return int(spec[f"max_{batch_unit(spec)}_per_batch"])


def _files_reader() -> SplitReader:
    from event_etl.sources.read import FilesReader

    return FilesReader()


def _generator_reader() -> SplitReader:
    from event_etl.sources.read import GeneratorReader

    return GeneratorReader()


def _segments_reader() -> SplitReader:
    from event_etl.sources.read import SegmentsReader

    return SegmentsReader()


def _kafka_reader() -> SplitReader:
    from event_etl.sources.read import KafkaReader

    return KafkaReader()


def _spool_reader() -> SplitReader:
    from event_etl.sources.read import SpoolReader

    return SpoolReader()


SPLIT_READERS: dict[str, Callable[[], SplitReader]] = {
    "files": _files_reader,  # a folder's files (the dir source)
    "gen": _generator_reader,  # the generator
    "seg": _segments_reader,  # Pub/Sub messages spooled in segments
    "spool": _spool_reader,  # release 0.1.0's Pub/Sub spool files
    "kafka": _kafka_reader,  # an offset range of a Kafka partition
}
"""The reader of every kind of :class:`~event_etl.sources.splits.Split`, by its ``kind``."""


def split_reader(kind: str) -> SplitReader:
    """How an executor task reads a split of ``kind`` (raises :class:`SourceError` for an unknown kind)."""
    make = SPLIT_READERS.get(kind)
    if make is None:
        raise SourceError(f"unknown split kind {kind!r}")
    return make()
