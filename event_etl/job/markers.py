"""Markers (the controller's marking steps): writing an hour's ``_COMPLETE`` once the watermark has passed it,
saving the state that records it, and adopting at start the markers a killed step wrote before it saved.

A marker is built from the hour's ledger and checked against the folder's listing (:mod:`event_etl.rules.manifest`),
written create-only, in hour order, each recording the watermark that completed it; which hours a state
completes is :func:`event_etl.rules.completeness.hours_to_mark`.  :class:`MarkerSteps` is a part of
:class:`~event_etl.job.controller.Controller` and works on its state: ``et``, ``storage``, ``ckpt``, ``state``,
``clock``, ``hours_marked``, ``_guard``, ``_emit`` and (before a marker) ``_merge_hour``.
"""

from __future__ import annotations

from dataclasses import replace

from event_etl import faults
from event_etl.errors import IntegrityError
from event_etl.rules.buckets import MARKER_NAME, hour_dir
from event_etl.rules.completeness import hours_to_mark
from event_etl.rules.manifest import Manifest, build_manifest, compare_listing
from event_etl.rules.watermark import WatermarkState
from event_etl.timeutil import HOUR_MS

__all__ = ["MarkerSteps"]


class MarkerSteps:
    """The marking steps of a :class:`~event_etl.job.controller.Controller` (see the module docstring)."""

    def _mark(
        self, state: WatermarkState, now: int, closed_by: str = "watermark"
    ) -> tuple[WatermarkState, list[Manifest]]:
        """Mark the hours ``state`` completes (at most a step's worth, oldest first).

        ``closed_by`` (recorded in each manifest) says what moved the watermark past the hour:
        ``watermark`` (events), ``idle`` (a quiet source, by the clock) or ``drain`` (end of input)."""
        marked = []
        for hour in hours_to_mark(state.first_hour, state.marked_through, state.watermark):
            self._guard()
            faults.point("before_marker", str(hour))
            marked.append(self._write_marker(hour, state.watermark, now, state.last_batch_id, closed_by))
            faults.point("after_marker", str(hour))
            state = replace(state, marked_through=hour)
        return state, marked

    def _commit_state(self, new: WatermarkState, marked: list[Manifest]) -> None:
        self.ckpt.save_state(new)
        faults.point("state_saved", str(new.last_batch_id))
        self.state = new
        for m in marked:
            self.ckpt.drop_ledger(m.hour)
            self.hours_marked.append(m.hour)
            self._emit("marker", m)

    def _adopt_markers(self) -> list[Manifest]:
        """Markers this job wrote after its last saved state (it was killed in between): take them as written.

        Markers are written oldest first, so they are the hours right after ``marked_through``
        that hold one.  Each must list exactly the files of this job's ledger; the watermark
        moves to the one that completed them."""
        st = self.state
        if st.first_hour is None:
            return []
        hour = st.first_hour if st.marked_through is None else max(st.first_hour, st.marked_through + HOUR_MS)
        adopted: list[Manifest] = []
        while True:
            rel = f"{hour_dir(self.et.name, hour)}/{MARKER_NAME}"
            try:
                data = self.storage.read(rel)
            except FileNotFoundError:
                break
            m = Manifest.from_bytes(data)
            entries = self.ckpt.read_ledger(hour)
            if set(m.files) != set(entries):
                raise IntegrityError(
                    f"{self.storage.display(rel)} lists other files than this job wrote "
                    f"({compare_listing(entries, {f.name: f.bytes for f in m.files}).describe()})",
                    fix="another job wrote this hour: make sure only one job writes each event type to each sink",
                )
            adopted.append(m)
            hour += HOUR_MS
        if adopted:
            new = replace(st.with_watermark(max(m.watermark for m in adopted)), marked_through=adopted[-1].hour)
            # The step that wrote them (a tick or a drain) was killed before it had marked every hour that watermark
            # completes: finish it now, before a batch judges events by that watermark (late for an hour not marked)
            new, rest = self._mark(new, self.clock(), adopted[-1].extra.get("closed_by", "watermark"))
            self._commit_state(new, adopted + rest)
            self._emit("adopted", adopted)
        return adopted

    def _drop_marked_ledgers(self) -> None:
        """Ledgers of hours marked and saved that a kill left (in the middle of dropping one): nothing reads them."""
        done = self.state.marked_through
        for hour in self.ckpt.ledger_hours() if done is not None else []:
            if hour <= done:
                self.ckpt.drop_ledger(hour)

    def _write_marker(self, hour: int, watermark: int, now: int, last_batch: int, closed_by: str) -> Manifest:
        rel_dir = hour_dir(self.et.name, hour)
        listing = self.storage.list_files(rel_dir)
        marker_rel = f"{rel_dir}/{MARKER_NAME}"
        existing = None
        if MARKER_NAME in listing:
            existing = Manifest.from_bytes(self.storage.read(marker_rel))
        else:
            for name in list(listing):
                if name.startswith(".") and name.endswith(".tmp"):
                    self.storage.delete(f"{rel_dir}/{name}")  # leftovers of attempts killed mid-write
                    del listing[name]
            if self._merge_hour(hour, listing, final=True):
                listing = self.storage.list_files(rel_dir)
        entries = self.ckpt.read_ledger(hour)
        if existing is not None:  # written before a crash; the replayed batch must agree with it
            if set(existing.files) != set(entries):
                raise IntegrityError(
                    f"{self.storage.display(marker_rel)} already exists and lists other files than this job wrote "
                    f"({compare_listing(entries, {f.name: f.bytes for f in existing.files}).describe()})",
                    fix="another job wrote this hour: make sure only one job writes each event type to each sink",
                )
            return existing
        diff = compare_listing(entries, listing)
        if not diff.ok:
            raise IntegrityError(
                f"cannot mark {self.storage.display(rel_dir)} complete: its files differ from what this job wrote "
                f"({diff.describe()})",
                fix="another writer or a manual change touched this hour; restore the files, or move the hour aside",
            )
        manifest = build_manifest(
            event_type=self.et.name,
            hour=hour,
            files=entries,
            watermark=watermark,
            completed_at=now,
            schema_fingerprint=f"crc64avro:{self.et.fingerprint}",
            # the last micro-batch whose data the hour can hold: later batches found it complete
            extra={"last_batch": last_batch, "closed_by": closed_by},
        )
        if not self.storage.create_only(marker_rel, manifest.to_bytes()):
            other = Manifest.from_bytes(self.storage.read(marker_rel))
            if set(other.files) != set(manifest.files):
                raise IntegrityError(
                    f"{self.storage.display(marker_rel)} was created by another writer with other files",
                    fix="make sure only one job writes each event type to each sink",
                )
            return other
        return manifest

    def unmarked_complete_hours(self) -> bool:
        """Whether hours the watermark has passed still wait for their marker (a jump of event time)."""
        st = self.state
        return bool(hours_to_mark(st.first_hour, st.marked_through, st.watermark, limit=1))
