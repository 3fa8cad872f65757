"""Calls that leave a metastore connection unfit for anyone else.

HMS 2.3 looks a single partition up by its name, and Derby and MySQL compare names ignoring
trailing blanks: ``ds=1 `` finds the row of ``ds=1``. The metastore then sees that the name
it found is not the one asked for and throws ("Expecting a partition with name ...") from
inside the transaction it opened, without rolling it back. Every later call on that
connection's metastore thread runs nested in that open transaction and is never committed:
writes are acknowledged and lost, and their locks block other connections. A client talking
to the metastore directly only hurts itself; through a pool of shared connections it would
hurt everyone whose call lands on that connection after it. So a call naming a partition by
a name (or values) ending with a blank is sent as usual, and its connection is closed after
the reply instead of going back to the pool: the metastore rolls the transaction back when
the connection's thread ends.
"""

from __future__ import annotations

from functools import cache
from typing import Any

from proxy import idl
from proxy.wire.errors import ProtocolError
from proxy.wire.framing import Message

# Arguments that name one partition (or carry partitions, whose values name them).
_NAMES = ("part_name", "part_vals", "new_part", "new_parts")


@cache
def _naming_fields(method: str) -> tuple[str, ...]:
    """The arguments of ``method`` that name partitions (none for most methods)."""
    try:
        spec = idl.args_class(method).thrift_spec
    except (KeyError, AttributeError, LookupError):
        return ()
    return tuple(f[1] for f in spec.values() if f[1] in _NAMES)


def _loose(value: Any) -> bool:
    """Whether ``value`` (a name, values, a partition or partitions) names a partition the
    database may match loosely: a name ends with its last value."""
    if isinstance(value, str):
        return value.endswith(" ")
    if isinstance(value, list):
        if value and all(isinstance(v, str) for v in value):
            return bool(value[-1].endswith(" "))
        return any(_loose(v) for v in value)
    values = getattr(value, "values", None)  # a Partition
    return isinstance(values, list) and _loose(values)


def spoils_connection(message: Message) -> bool:
    """Whether this call may leave the metastore's transaction open (see the module): its
    connection must not serve another call. On every forwarded call: the name decides for
    most, and only a call that names partitions has its arguments (a copy) looked at."""
    method = message.header.name
    if method not in idl.method_names():
        return False
    fields = _naming_fields(method)
    if not fields:
        return False
    try:
        args = idl.decode_args(method, message.body)
    except ProtocolError:  # the metastore refuses it before any transaction
        return False
    return any(_loose(getattr(args, name, None)) for name in fields)
