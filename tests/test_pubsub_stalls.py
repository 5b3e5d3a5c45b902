"""The bookkeeping of a fetcher's outages and full disks (event_etl.sources.pubsub_stalls), on a clock passed in."""

from event_etl.sources.pubsub_stalls import WAIT_CAP, WAIT_FIRST, Stalls


def test_an_outage_waits_by_its_age_and_gives_up_after_the_timeout():
    st = Stalls(outage_timeout=30.0)
    at, tries = 100.0, []
    while (wait := st.outage(at)) is not None:
        tries.append(at - 100.0)
        at += wait
    assert tries == [0.0, 0.5, 1.0, 2.0, 4.0, 8.0, 16.0, 26.0]  # the next try, 36 s in, is past the timeout
    assert st.down(at) == "Pub/Sub unreachable for 36s: retrying"


def test_an_answer_ends_the_outage_and_the_next_one_starts_again_from_the_shortest_wait():
    st = Stalls(outage_timeout=30.0)
    assert st.outage(0.0) == WAIT_FIRST and st.outage(20.0) == WAIT_CAP
    st.answered()
    assert st.down(21.0) is None
    assert st.outage(25.0) == WAIT_FIRST and st.outage_since == 25.0  # not 0 s: a new outage, not 25 s old


def test_a_full_disk_says_so_once_is_down_and_lasts_until_room_is_found():
    st = Stalls(outage_timeout=10.0)
    assert st.disk_full_wait(0.0) == WAIT_FIRST and not st.room_again()  # never full: nothing to say
    assert st.disk_full(5.0, "No space left on device") == (True, False)  # the first: the fetcher logs it
    assert st.disk_full(9.0, "No space left on device") == (False, False)
    assert st.disk_full_wait(9.0) == 4.0
    assert st.down(12.0) == "the spool's disk is full (No space left on device) for 7s: pulling waits for room"
    assert st.disk_full(15.5, "Disk quota exceeded") == (False, True)  # past the timeout: the job stops
    assert st.room_again() and st.down(16.0) is None and st.disk_error is None


def test_a_full_disk_is_reported_before_an_outage():
    st = Stalls(outage_timeout=60.0)
    st.outage(0.0)
    st.disk_full(1.0, "No space left on device")
    assert (st.down(3.0) or "").startswith("the spool's disk is full")
    st.room_again()
    assert st.down(3.0) == "Pub/Sub unreachable for 3s: retrying"
