"""The errors a call the proxy refuses is answered with, shaped as the HMS shapes its own.

A refusal is the method's declared ``MetaException`` where it has one (every partition read
does): engines show its message as they show the metastore's, and do not take it for a
lost connection to retry on (Hive's client retries transport errors, not MetaException).
A method that declares none gets a ``TApplicationException`` with the same text.
"""

from __future__ import annotations

import functools

from proxy import idl
from proxy.wire.binary import AppErrorType, MessageType, encode_application_exception, encode_header

# The HMS's own text for hive.metastore.limit.partition.request (HiveMetaStore's
# PARTITION_NUMBER_EXCEED_LIMIT_MSG, Hive 2.3 to 4), so engines and people recognise it.
PARTITION_LIMIT_TEXT = (
    "Number of partitions scanned (=%d) on table '%s' exceeds limit (=%d). "
    "This is controlled on the metastore server by %s."
)
PARTITION_LIMIT_SETTING = "hms-cache-proxy --max-partitions-per-call"


@functools.cache
def _meta_exception_field(method: str) -> str | None:
    """The name of ``method``'s result field that carries a MetaException, if any."""
    try:
        spec = idl.result_class(method).thrift_spec
    except KeyError:
        return None
    meta = idl.module().MetaException
    for _id, field in sorted(spec.items()):
        if len(field) > 2 and field[2] is meta:
            return str(field[1])
    return None


def refusal(method: str, seqid: int, text: str) -> bytes:
    """The reply to a refused call of ``method``: its MetaException carrying ``text``, or
    a TApplicationException (INTERNAL_ERROR) if it declares none."""
    field = _meta_exception_field(method)
    if field is None:
        return encode_application_exception(method, seqid, AppErrorType.INTERNAL_ERROR, text)
    result = idl.result_class(method)(**{field: idl.module().MetaException(message=text)})
    return encode_header(method, MessageType.REPLY, seqid) + idl.encode(result)


def partition_limit_text(partitions: int, table: str, limit: int) -> str:
    return PARTITION_LIMIT_TEXT % (partitions, table, limit, PARTITION_LIMIT_SETTING)


def reply_too_large_text(method: str, table: str | None, limit: int, partitions: int | None) -> str:
    what = f" of table '{table}'" if table else ""
    many = f" ({partitions} partitions)" if partitions is not None else ""
    return (
        f"hms-cache-proxy: the metastore's reply to {method}{what}{many} is larger than "
        f"{limit} bytes ({limit / (1 << 20):g} MiB), the most a Thrift client takes by "
        f"default (--max-reply-bytes); ask for fewer partitions (a filter, or by name)"
    )


def rate_text(tenant: str, group: str, per_second: float, what: str) -> str:
    who = tenant.replace(":", " ", 1)
    return (
        f"hms-cache-proxy: {who} (group {group}) is over its {per_second:g} {what} per "
        f"second to the metastore (--limits-file); slow down, or retry in a moment"
    )
