"""A randomised adversary for the proxies' coherence promise (issue 39), and its judge.

Writers bump a counter ``v`` in the parameters of tables and partitions, one write at a
time per table, through a random proxy or straight at the metastore; bursts of writes
straight at the metastore are released together by a barrier (HMS 2.3 then gives several
events one id, HIVE-16886); Redis is made to refuse writes while it serves reads (``CLIENT
PAUSE WRITE``, ``min-replicas-to-write`` unmet: NOREPLICAS); readers read through random
proxies, on long-lived and fresh connections, spelling names as clients may (upper case,
blanks around database and table names, partition names padded with blanks, which the
database matches loosely). Every call is recorded with when it started and ended, by this
process's monotonic clock.

:func:`judge` then holds every read to the README's "Coherence guarantees":

* a value older than a write acknowledged before the read started is wrong: at once for a
  write through the same proxy (read-your-writes); :data:`PEER_SLACK` later for a write
  through another proxy on the same Redis (the invalidation's delivery, at most
  ``--redis-tracking-max-lag``, 1 s); :data:`SLACK` later for any other (straight at the
  metastore, or between the stores: a notification poll of 0.3 s);
* a value no write had yet been sent for is wrong (not the metastore's);
* ``get_partitions_by_names`` must hold exactly the partitions the metastore returns for the
  same names (asked straight at it right after), ``get_partitions`` all of the table's, and
  every object must be the table or partition asked for;
* an error where the metastore answers the same call is wrong.

A write that was not acknowledged requires nothing (HMS 2.3's "Event not set up correctly"
under concurrent writes: committed but not logged, which no follower can see, as the README
says; a dropped connection): until the next acknowledged write of the object, any value it
may have left is accepted. Writers read the counter straight from the metastore before each
write, so the next write counts on from whatever the failed one left.

Readers pick their proxy at random (``read_weights``); one of them (the hot reader) reads
only tables and partitions named as written, which stay cached: a lost invalidation shows
there first. Bursts and Redis's refusals take turns, so that what a stale read missed tells
which shape it has (:func:`shapes`, :func:`report`: the event ids the metastore gave each
write are read from its log after the run, :func:`logged`).

After the workload, with every bound passed, each object is read through every proxy in
several spellings, twice (:meth:`Adversary.sweep`): whatever a shape left stale until the
TTL shows there.
"""

from tests.rig.adversary.database import create
from tests.rig.adversary.event_log import logged
from tests.rig.adversary.history import HMS, Fault, History, Read, Write
from tests.rig.adversary.judge import PEER_SLACK, SLACK, Wrong, bound, judge, lags
from tests.rig.adversary.report import SHAPES, caught, describe, report, shapes
from tests.rig.adversary.workload import Adversary

__all__ = [
    "HMS",
    "PEER_SLACK",
    "SHAPES",
    "SLACK",
    "Adversary",
    "Fault",
    "History",
    "Read",
    "Write",
    "Wrong",
    "bound",
    "caught",
    "create",
    "describe",
    "judge",
    "lags",
    "logged",
    "report",
    "shapes",
]
