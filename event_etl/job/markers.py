"""Markers (the controller's marking steps): writing an hour's ``_COMPLETE`` once the watermark has passed it,
saving the state that records it, and adopting at start the markers a killed step wrote before it saved.

A marker is built from the hour's ledger and checked against the folder's listing (:mod:`event_etl.rules.manifest`),
written create-only, in hour order, each recording the watermark that completed it; which hours a state
completes is :func:`event_etl.rules.completeness.hours_to_mark`.  :class:`MarkerWriter` is a collaborator of
:class:`~event_etl.job.controller.Controller`, given at construction what it works with (the type's
:class:`~event_etl.job.context.TypeContext`: the type, the sink, the checkpoint, the lease guard; and the
:class:`~event_etl.job.merges.Merger` that merges an hour before its marker), and handed the state whose hours it
marks; the controller saves the state that records them.
"""

from __future__ import annotations

from dataclasses import replace

from event_etl import faults
from event_etl.errors import IntegrityError
from event_etl.job.context import TypeContext
from event_etl.job.merges import Merger
from event_etl.rules.buckets import MARKER_NAME, hour_dir
from event_etl.rules.completeness import hours_to_mark
from event_etl.rules.manifest import Manifest, build_manifest, compare_listing
from event_etl.rules.watermark import WatermarkState
from event_etl.timeutil import HOUR_MS

__all__ = ["MarkerWriter"]


class MarkerWriter:
    """Writes the markers of the hours a state completes, and finds those a killed step wrote (see the module
    docstring)."""

    def __init__(self, ctx: TypeContext, *, merger: Merger) -> None:
        self.et = ctx.event_type
        self.storage = ctx.storage
        self.ckpt = ctx.checkpoint
        self.merger = merger
        self.guard = ctx.guard  # raises if this job may no longer write (it lost its lease)

    def mark(
        self, state: WatermarkState, now: int, closed_by: str = "watermark"
    ) -> tuple[WatermarkState, list[Manifest]]:
        """Mark the hours ``state`` completes (at most a step's worth, oldest first).

        ``closed_by`` (recorded in each manifest) says what moved the watermark past the hour:
        ``watermark`` (events), ``idle`` (a quiet source, by the clock) or ``drain`` (end of input)."""
        marked = []
        for hour in hours_to_mark(state.first_hour, state.marked_through, state.watermark):
            assert state.watermark is not None  # it passed the hour
            self.guard()
            faults.point("before_marker", str(hour))
            marked.append(self._write_marker(hour, state.watermark, now, state.last_batch_id, closed_by))
            faults.point("after_marker", str(hour))
            state = replace(state, marked_through=hour)
        return state, marked

    def written_after(self, state: WatermarkState) -> list[Manifest]:
        """Markers this job wrote after ``state`` was saved (it was killed in between), to be taken as written.

        Markers are written oldest first, so they are the hours right after ``marked_through``
        that hold one.  Each must list exactly the files of this job's ledger."""
        if state.first_hour is None:
            return []
        hour = state.first_hour if state.marked_through is None else max(state.first_hour,
                                                                          state.marked_through + HOUR_MS)
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
        return adopted

    def drop_marked_ledgers(self, done: int | None) -> None:
        """Ledgers of hours marked (through ``done``) and saved that a kill left (in the middle of dropping one):
        nothing reads them."""
        if done is None:
            return
        for hour in self.ckpt.ledger_hours():
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
            if self.merger.merge_hour(hour, listing, final=True):
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
