"""The job's Pub/Sub fetcher alone (no Spark) against a paced publisher on the emulator (issue 22).

    .venv/bin/python bench/fetcher_live.py --rate 20000 --seconds 60 --hold 5

``bench/pubsub.py --scenarios readers`` shows what plain loops sustain; this runs
:class:`event_etl.sources.pubsub_fetch.Fetcher` (its settings from ``EVENT_ETL_PUBSUB_*``, e.g.
``EVENT_ETL_PUBSUB_STREAMS=2``; by default the job's own against the emulator: 1 stream) into a spool
in a temporary folder while a publisher
(:class:`bench.pubsub.Publishers`, ``--publishers`` processes) sends ``--rate`` messages/s for
``--seconds``; every ``--hold`` seconds it acknowledges the segments written so far and deletes
them, as a job whose batches are saved every ``--hold`` seconds would (and at once when every message
has been pulled, as the saving loop of ``bench/pubsub.py`` saves when it has them all).  Prints the progress every
10 s and how long after the publisher stopped everything was acknowledged (gives up after
``--give-up`` seconds).  Nothing is written to RESULTS.md.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.pubsub import PROJECT, Emulator, Publishers, create, default_speedup, fast_clock


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rate", type=int, default=20_000)
    ap.add_argument("--seconds", type=float, default=60)
    ap.add_argument("--hold", type=float, default=5.0, help="seconds between acknowledgements (a batch's cycle)")
    ap.add_argument("--publishers", type=int, default=2)
    ap.add_argument("--give-up", type=float, default=600.0)
    args = ap.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="event_etl-fetcher-live-") as work:
        emu = Emulator(Path(work)).start()
        os.environ["PUBSUB_EMULATOR_HOST"] = emu.host
        try:
            from event_etl.sources.pubsub_fetch import Fetcher, FetchSettings

            name = f"fetcher-live-{int(time.time())}"
            topic, sub = f"projects/{PROJECT}/topics/{name}", f"projects/{PROJECT}/subscriptions/{name}"
            create(topic, [sub])
            count = int(args.rate * args.seconds)
            clock = fast_clock(args.seconds + 60, default_speedup(5.0), time.time() + 5)
            pubs = Publishers(emu.host, topic, count=count, workers=args.publishers, seed=7, clock=clock,
                              rate=args.rate)
            spool = Path(work) / "spool"
            fetcher = Fetcher(sub, spool, settings=FetchSettings.from_env(emulator=True)).start()  # as the job would
            t0 = next_print = time.time()
            try:
                acked_at = time.time()
                while fetcher.acked < count and time.time() - t0 < args.give_up:
                    time.sleep(0.05)
                    if time.time() - acked_at < args.hold and fetcher.pulled < count:
                        continue  # as a batch would: every --hold seconds, or at once when all has come
                    acked_at = time.time()
                    with fetcher.lock:
                        names = [n for n, h in fetcher.held.items() if h.written]
                    fetcher.ack(names)
                    for n in names:
                        (spool / "segments" / n).unlink(missing_ok=True)
                    if time.time() >= next_print:
                        next_print += 10
                        print(f"{time.time() - t0:5.0f} s: pulled {fetcher.pulled:,}, acknowledged {fetcher.acked:,}",
                              flush=True)
                done = time.time()
                sent = pubs.join()
            finally:
                fetcher.stop()
            verdict = (f"acknowledged all {count:,} {done - sent['t1']:.1f} s after the publisher stopped"
                       if fetcher.acked >= count else f"gave up: {fetcher.acked:,} of {count:,} acknowledged")
            print(f"fetcher ({fetcher.describe()}; acknowledging every {args.hold:g} s) against {args.rate:,} msg/s "
                  f"for {args.seconds:g} s: {verdict}; requests {fetcher.stats()['requests']}")
        finally:
            emu.stop()


if __name__ == "__main__":
    main()
