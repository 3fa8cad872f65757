"""How the adversary spells names, as clients may: upper case, blanks around database and
table names, partition names padded with blanks (which the database matches loosely).

Not sent: ``get_partition`` and ``get_partition_by_name`` with a padded partition name.
HMS 2.3.10 answers them "Expecting a partition with name ds=p0 , but metastore is returning
a partition with name ds=p0." and leaves the transaction of that connection's handler open:
every later call on the connection runs inside it, writes are acknowledged but rolled back
when it closes, and its Derby locks stall other connections (seen here, straight at the
metastore). Through a proxy, whose metastore connections are pooled, that would poison the
pool, which is not what this test is about.
"""

from __future__ import annotations

import random
from collections.abc import Callable

from tests.rig.adversary.database import VALUES, pname

Spell = Callable[[str], str]
DB_SPELLINGS: list[Spell] = [
    lambda n: n,
    str.upper,
    lambda n: " " + n,
    lambda n: n + " ",
]
TABLE_SPELLINGS: list[Spell] = [
    lambda n: n,
    str.upper,
    lambda n: n + " ",
    lambda n: " " + n.upper() + " ",
]
# What HMS 2.3 takes in a write: alter_table trims nothing (a blank makes it a rename to a
# table that exists, refused), alter_partition(s) trims.
TABLE_WRITES: list[tuple[Spell, Spell]] = [
    (DB_SPELLINGS[0], TABLE_SPELLINGS[0]),
    (DB_SPELLINGS[1], TABLE_SPELLINGS[1]),
    (DB_SPELLINGS[0], TABLE_SPELLINGS[1]),
]
PARTITION_WRITES: list[tuple[Spell, Spell]] = [
    (DB_SPELLINGS[0], TABLE_SPELLINGS[0]),
    (DB_SPELLINGS[1], TABLE_SPELLINGS[1]),
    (DB_SPELLINGS[2], TABLE_SPELLINGS[2]),
    (DB_SPELLINGS[0], TABLE_SPELLINGS[3]),
]
# Each database spelling and each table spelling at least once.
SWEEP_SPELLINGS: list[tuple[Spell, Spell]] = [
    (DB_SPELLINGS[0], TABLE_SPELLINGS[0]),
    (DB_SPELLINGS[1], TABLE_SPELLINGS[1]),
    (DB_SPELLINGS[3], TABLE_SPELLINGS[2]),
    (DB_SPELLINGS[2], TABLE_SPELLINGS[3]),
]
# Partition names in get_partitions_by_names, with their weights: Derby ignores trailing
# blanks (a padded name finds the partition), not leading ones nor case.
NAME_FORMS: list[tuple[Callable[[str], list[str]], float]] = [
    (lambda n: [n], 0.45),
    (lambda n: [n + " "], 0.2),
    (lambda n: [n + "  "], 0.05),
    (lambda n: [n, n + " "], 0.2),
    (lambda n: [" " + n], 0.05),
    (lambda n: [n.upper()], 0.05),
]


def pick_spelling(rng: random.Random, spellings: list[Spell], as_written: float) -> Spell:
    return spellings[0] if rng.random() < as_written else rng.choice(spellings[1:])


def by_names(rng: random.Random) -> list[str]:
    names: list[str] = []
    for v in rng.sample(VALUES, rng.randint(1, len(VALUES))):
        (form,) = rng.choices([f for f, _ in NAME_FORMS], weights=[w for _, w in NAME_FORMS])
        names += form(pname(v))
    if rng.random() < 0.1:
        names.append(pname("zz"))
    rng.shuffle(names)
    return names
