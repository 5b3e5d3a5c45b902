"""What the Kafka integration tests share: a page view event as producers send it, and the sink a Kafka job wrote,
by hour (the ids of its timely and late files, its marker)."""

from __future__ import annotations

import io
import uuid

from event_etl.rules.buckets import MARKER_NAME, parse_hour_dir
from event_etl.rules.manifest import Manifest
from event_etl.storage import Storage

__all__ = ["kafka_sink_content", "page_view_event"]


def page_view_event(event_time: int) -> dict:
    eid = str(uuid.uuid4())
    return {"event_id": eid, "event_time": event_time, "anonymous_id": "a1", "session_id": "s1", "product_id": "p1",
            "page_url": "https://shop.example.com/p/1", "device_type": "MOBILE"}


def kafka_sink_content(sink: str) -> dict[int, dict]:
    import fastavro

    st = Storage(sink)
    out: dict[int, dict] = {}
    for day in st.list_dirs("page_view"):
        if not day.startswith("dt="):
            continue
        for h in st.list_dirs(f"page_view/{day}"):
            rel = f"page_view/{day}/{h}"
            entry: dict = {"ids": [], "late": [], "marker": None}
            for name in st.list_files(rel):
                if name == MARKER_NAME:
                    entry["marker"] = Manifest.from_bytes(st.read(f"{rel}/{name}"))
                elif name.endswith(".avro"):
                    recs = list(fastavro.reader(io.BytesIO(st.read(f"{rel}/{name}"))))
                    entry["late" if name.startswith("late-") else "ids"].extend(str(r["event_id"]) for r in recs)
            out[parse_hour_dir(rel)[1]] = entry
    return out
