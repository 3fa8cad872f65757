"""The version mirror's rules (proxy.cache.mirror), each a guard against a stale hit."""

from __future__ import annotations

import random

from proxy.cache.mirror import FIELD_OVERHEAD, HASH_OVERHEAD, VersionMirror

V = "hmsc:1:{t:db.t}:v"
W = "hmsc:1:{t:db.u}:v"
BEAT = "hmsc:1:{beat}:beat:x:1"


def trusted_mirror(streams: int = 1, max_lag: float = 1.0) -> VersionMirror:
    m = VersionMirror(streams, max_bytes=1 << 20, max_lag=max_lag, fence_suffix=":f")
    for i in range(streams):
        m.subscribed(i)
        m.expect(f"{BEAT}{i}", i, 10.0)
        m.invalidated([f"{BEAT}{i}".encode()], 10.001)
    return m


def test_learned_versions_are_served_while_trusted() -> None:
    m = trusted_mirror()
    m.learn(m.ticket(), V, {"table": b"3", "@": b"e1"})
    assert m.trusted(10.5)
    assert m.get({V: ["table", "@"]}) == {V: {"table": b"3", "@": b"e1"}}
    assert m.get({V: ["table", "parts"]}) is None  # a field never read is not known
    assert m.get({V: ["table"], W: ["table"]}) is None


def test_an_invalidation_forgets_the_key() -> None:
    m = trusted_mirror()
    m.learn(m.ticket(), V, {"table": b"3"})
    m.learn(m.ticket(), W, {"table": b"1"})
    m.invalidated([V.encode()], 10.1)
    assert m.get({V: ["table"]}) is None
    assert m.get({W: ["table"]}) == {W: {"table": b"1"}}


def test_a_fence_hash_invalidation_forgets_the_versions_it_guards() -> None:
    m = trusted_mirror()
    m.learn(m.ticket(), V, {"table": b"3"})
    m.invalidated([(V + ":f").encode()], 10.1)
    assert m.get({V: ["table"]}) is None


def test_a_flush_forgets_everything() -> None:
    m = trusted_mirror()
    m.learn(m.ticket(), V, {"table": b"3"})
    m.invalidated(None, 10.1)
    assert len(m) == 0 and m.bytes == 0


def test_a_reply_read_before_an_invalidation_that_arrived_first_is_not_learned() -> None:
    # The look-up's reply and the invalidation come on different connections: the
    # invalidation of a change made after Redis answered may be read here first.
    m = trusted_mirror()
    ticket = m.ticket()
    m.invalidated([V.encode()], 10.1)
    m.learn(ticket, V, {"table": b"3"})  # what Redis answered before the change
    assert m.get({V: ["table"]}) is None
    m.learn(ticket, W, {"table": b"1"})  # another key of the same look-up is fine
    assert m.get({W: ["table"]}) is not None
    later = m.ticket()
    m.learn(later, V, {"table": b"4"})
    assert m.get({V: ["table"]}) == {V: {"table": b"4"}}


def test_own_changes_forget_and_refuse_what_was_read_before_them() -> None:
    m = trusted_mirror()
    m.learn(m.ticket(), V, {"table": b"3"})
    in_flight = m.ticket()
    m.forget([V + ":f"])  # this proxy fenced the table
    assert m.get({V: ["table"]}) is None
    m.learn(in_flight, V, {"table": b"3"})
    assert m.get({V: ["table"]}) is None


def test_nothing_is_trusted_or_learned_before_the_stream_is_subscribed() -> None:
    m = VersionMirror(1, max_bytes=1 << 20, max_lag=1.0, fence_suffix=":f")
    assert m.ticket() == 0
    m.learn(m.ticket(), V, {"table": b"3"})
    assert len(m) == 0
    m.subscribed(0)
    m.learn(m.ticket(), V, {"table": b"3"})
    assert len(m) == 1
    assert not m.trusted(10.0)  # subscribed, but no beat has come back yet


def test_a_ticket_taken_before_a_resubscription_learns_nothing() -> None:
    m = trusted_mirror()
    ticket = m.ticket()
    m.lost(0)
    m.subscribed(0)
    m.learn(ticket, V, {"table": b"3"})
    assert len(m) == 0


def test_a_lost_stream_forgets_everything_and_is_not_trusted() -> None:
    m = trusted_mirror()
    m.learn(m.ticket(), V, {"table": b"3"})
    m.lost(0)
    assert len(m) == 0
    assert not m.trusted(10.1)
    assert m.ticket() == 0


def test_trust_ends_when_beats_stop_coming_back() -> None:
    m = trusted_mirror(max_lag=1.0)  # the beat sent at 10.0 came back
    assert m.trusted(10.9)
    m.expect(BEAT + "b", 0, 10.5)  # sent, never seen back (a stalled stream)
    assert not m.trusted(11.2)
    m.invalidated([(BEAT + "b").encode()], 11.3)  # it arrives late: trusted again
    assert m.trusted(11.3)
    assert m.lags[-1] == 11.3 - 10.5


def test_every_stream_of_a_cluster_must_deliver() -> None:
    m = trusted_mirror(streams=3)
    assert m.trusted(10.5)
    m.expect(BEAT + "n0", 0, 10.6)
    m.expect(BEAT + "n2", 2, 10.6)
    m.invalidated([(BEAT + "n0").encode()], 10.7)
    m.invalidated([(BEAT + "n2").encode()], 10.7)
    # node 1's newest beat back was sent at 10.0
    assert m.trusted(10.9) and not m.trusted(11.1)


def test_its_standing_says_what_the_rule_says_whatever_the_streams_do() -> None:
    # Hits answered again read trust off Standing.until (two attributes, no loop): it must
    # agree with rule 1 as stated over the streams, after every change to them.
    rng = random.Random(7)
    m = VersionMirror(2, max_bytes=1 << 20, max_lag=1.0, fence_suffix=":f")
    now, beats = 10.0, 0

    def rule(at: float) -> bool:
        streams = m._streams
        return bool(streams) and all(
            s.subscribed and s.confirmed_at is not None and at - s.confirmed_at <= m.max_lag
            for s in streams
        )

    for _ in range(3000):
        now += rng.random() * 0.3
        streams = len(m._streams)
        step = rng.random()
        if step < 0.05:
            m.reset(rng.randrange(0, 4))
        elif step < 0.15 and streams:
            m.subscribed(rng.randrange(streams))
        elif step < 0.2 and streams:
            m.lost(rng.randrange(streams))
        elif step < 0.6 and streams:
            beats += 1
            m.expect(f"{BEAT}{beats}", rng.randrange(streams), now - rng.random())
        elif m._beats:
            key = rng.choice(sorted(m._beats))
            m.invalidated([key.encode()], now)
        for at in (now, now + 0.5, now + 1.0, now + 2.0):
            assert m.trusted(at) == rule(at), (at, m._streams)
            assert m.standing.at(at) == rule(at)


def test_memory_is_bounded_in_bytes() -> None:
    m = VersionMirror(1, max_bytes=50_000, max_lag=1.0, fence_suffix=":f")
    m.subscribed(0)
    for i in range(2_000):
        m.learn(m.ticket(), f"hmsc:1:{{t:db.t{i}}}:v", {f"p{j}": b"1" for j in range(5)})
    assert m.bytes <= 50_000
    assert 0 < len(m) < 2_000
    assert m.get({"hmsc:1:{t:db.t1999}:v": ["p0"]}) is not None  # the newest stay
    assert m.get({"hmsc:1:{t:db.t0}:v": ["p0"]}) is None


def test_invalidations_remembered_for_tickets_are_bounded() -> None:
    m = trusted_mirror()
    ticket = m.ticket()
    m.invalidated([f"hmsc:1:{{t:db.k{i}}}:v".encode() for i in range(60_000)], 10.1)
    m.learn(ticket, V, {"table": b"3"})  # its key's invalidation may have been forgotten
    assert len(m) == 0
    m.learn(m.ticket(), V, {"table": b"3"})
    assert len(m) == 1


def test_invalidations_of_entries_are_ignored() -> None:
    # Every fill and expiry of a cached entry under the prefix is announced too: they change
    # no version, and must not crowd the invalidations remembered for tickets in flight.
    m = trusted_mirror()
    m.learn(m.ticket(), V, {"table": b"3"})
    ticket = m.ticket()
    m.invalidated([b"hmsc:1:{t:db.t}:e:get_table:00ff", b"hmsc:1:{t:db.t}:p:v:ab"], 10.1)
    assert m.get({V: ["table"]}) is not None
    m.learn(ticket, W, {"table": b"1"})
    assert m.get({W: ["table"]}) is not None


def test_a_beat_of_an_earlier_set_of_streams_vouches_for_nothing() -> None:
    m = trusted_mirror(streams=2)
    m.expect(BEAT + "old", 1, 10.5)
    m.reset(2)  # a new topology: stream 1 is another node now
    m.subscribed(0)
    m.subscribed(1)
    m.expect(BEAT + "new0", 0, 10.55)
    m.invalidated([(BEAT + "new0").encode(), (BEAT + "old").encode()], 10.6)
    assert not m.trusted(10.7)  # stream 1 has delivered nothing of its own
    m.expect(BEAT + "new1", 1, 10.65)
    m.invalidated([(BEAT + "new1").encode()], 10.7)
    assert m.trusted(10.7)


def test_a_scope_moves_with_anything_a_hit_judged_under_it_read() -> None:
    # A hit judged under a scope is served again without being judged (see
    # WholeReads.judged_now) while its mark stands: every change to what get() answers for
    # its hashes must move it, and nothing else may.
    m = VersionMirror(
        1, max_bytes=HASH_OVERHEAD + 2 * FIELD_OVERHEAD + 200, max_lag=1.0, fence_suffix=":f"
    )
    m.subscribed(0)
    scope, other = m.standing.scopes.of((V,)), m.standing.scopes.of((W,))
    seen = [scope.mark]

    def moved() -> bool:
        seen.append(scope.mark)
        return seen[-1] != seen[-2]

    m.learn(m.ticket(), V, {"table": b"3"})
    assert not moved()  # something new: nothing judged by it yet
    m.learn(m.ticket(), V, {"table": b"3", "@": b"e1"})
    assert not moved()  # the same value again, and a new field
    m.learn(m.ticket(), V, {"table": b"4"})
    assert moved()  # a newer value
    m.invalidated([V.encode()], 10.1)
    assert moved()
    m.learn(m.ticket(), V, {"table": b"5"})
    m.invalidated([(V + ":f").encode()], 10.2)  # a fence on it
    assert moved()
    before = other.mark
    m.invalidated([W.encode()], 10.3)  # another hash
    assert not moved() and other.mark != before
    before = other.mark
    m.learn(m.ticket(), V, {"table": b"6"})
    assert not moved()  # (dropped above: new again)
    m.forget([V])  # this proxy changed it
    assert moved() and other.mark == before
    m.learn(m.ticket(), V, {"table": b"7"})
    m.learn(m.ticket(), W, {"table": b"1", "x": b"y" * 150})
    assert moved() and len(m) == 1  # crowded out of the mirror's bytes
    before = other.mark
    m.invalidated(None, 10.4)  # the database flushed: everything forgotten
    assert moved() and other.mark != before
    before = other.mark
    m.lost(0)  # a stream lost: everything forgotten
    assert moved() and other.mark != before
