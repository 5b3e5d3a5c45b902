"""Finding duplicates: earlier batches (within the window) and earlier records of the same batch."""

from __future__ import annotations

import numpy as np

from event_etl.dedupe import KEY_DTYPE, DedupeState, find_duplicates, key_hash, rows_of


def rows(*items):
    return np.array(list(items), dtype=KEY_DTYPE)


K = {name: key_hash("i", name) for name in "abcd"}


def test_first_occurrence_in_record_order_is_kept():
    r = rows((K["a"], 0, 1, 0, 0), (K["a"], 0, 0, 0, 5), (K["b"], 0, 0, 0, 1), (K["a"], 0, 0, 0, 9))
    assert find_duplicates(r, np.zeros(0, np.uint64)).tolist() == [True, False, False, True]


def test_seen_keys_are_duplicates_and_all_rows_of_a_record_go():
    m = key_hash("m", "msg-1")
    r = rows((K["a"], 0, 0, 0, 0), (m, 0, 0, 0, 0), (K["c"], 0, 0, 0, 1))
    assert find_duplicates(r, np.array([m], np.uint64)).tolist() == [True, True, False]


def test_state_forgets_what_is_older_than_the_window_and_a_replay_does_not_see_itself():
    st = DedupeState.empty(10)
    st.add(1, rows((K["a"], 100, 0, 0, 0)))
    st.add(2, rows((K["b"], 115, 0, 0, 0)))
    assert set(st.seen_before(2).tolist()) == {K["a"]}
    assert set(st.seen_before(3).tolist()) == {K["a"], K["b"]}
    assert st.evict(111) == [1]
    assert set(st.keys.tolist()) == {K["b"]}


def test_rows_of_and_hash_are_stable():
    blob = rows((K["a"], 1, 2, 3, 4)).tobytes()
    assert rows_of([blob, b"", blob]).shape == (2,)
    assert key_hash("i", "a") == key_hash("i", "a") != key_hash("m", "a")
