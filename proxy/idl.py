"""The Hive Metastore IDL, loaded once with thriftpy2, behind a small typed surface.

thriftpy2 builds classes at run time from ``idl/*.thrift``, so nothing here is generated or
checked in. The rest of the proxy never touches thriftpy2's dynamic module directly: it asks
this module whether a method exists, and decodes the few argument structs it needs.
"""

from __future__ import annotations

import functools
from pathlib import Path
from types import ModuleType
from typing import Any

import thriftpy2
from thriftpy2.protocol.cybin import TCyBinaryProtocolFactory  # type: ignore[attr-defined]
from thriftpy2.transport.memory import TCyMemoryBuffer  # type: ignore[attr-defined]

from proxy import conform
from proxy.wire.binary import MessageType, encode_header
from proxy.wire.errors import ProtocolError

_PROTOCOL = TCyBinaryProtocolFactory()


def idl_dir() -> Path:
    """Where the ``.thrift`` files are: the repository's ``idl/``, or the copy in the wheel."""
    here = Path(__file__).resolve().parent
    for candidate in (here / "_idl", here.parent / "idl"):
        if (candidate / "hive_metastore.thrift").is_file():
            return candidate
    raise FileNotFoundError("idl/hive_metastore.thrift not found next to the proxy package")


@functools.cache
def module() -> ModuleType:
    directory = idl_dir()
    return thriftpy2.load(
        str(directory / "hive_metastore.thrift"),
        module_name="hive_metastore_thrift",
        include_dirs=[str(directory)],
    )


def _service_classes() -> tuple[Any, ...]:
    hms = module().ThriftHiveMetastore
    return (hms, module().fb303.FacebookService)


@functools.cache
def method_names() -> frozenset[str]:
    """Every method of ThriftHiveMetastore, fb303's included."""
    names: set[str] = set()
    for service in _service_classes():
        names.update(service.thrift_services)
    return frozenset(names)


@functools.cache
def oneway_methods() -> frozenset[str]:
    out = set()
    for service in _service_classes():
        for name in service.thrift_services:
            result = getattr(service, f"{name}_result", None)
            if result is not None and getattr(result, "oneway", False):
                out.add(name)
    return frozenset(out)


def args_class(method: str) -> Any:
    for service in _service_classes():
        cls = getattr(service, f"{method}_args", None)
        if cls is not None:
            return cls
    raise KeyError(method)


def result_class(method: str) -> Any:
    for service in _service_classes():
        cls = getattr(service, f"{method}_result", None)
        if cls is not None:
            return cls
    raise KeyError(method)


def decode(cls: Any, data: bytes) -> Any:
    """Decode one struct of class ``cls`` from ``data``; fields it does not know are skipped."""
    obj = cls()
    try:
        _PROTOCOL.get_protocol(TCyMemoryBuffer(data)).read_struct(obj)
    except Exception as exc:  # thriftpy2 raises several unrelated types for bad input
        raise ProtocolError(f"cannot decode {cls.__name__}: {exc}") from exc
    return obj


def encode(obj: Any) -> bytes:
    buf = TCyMemoryBuffer()
    _PROTOCOL.get_protocol(buf).write_struct(obj)
    return bytes(buf.getvalue())


def decode_args(method: str, body: bytes) -> Any:
    """A client's call arguments. Checked against the IDL first: thriftpy2 believes the IDL
    over the wire, which a hostile client can exploit (see :mod:`proxy.conform`). Replies
    come from the metastore's own Thrift serializer and are decoded as they are."""
    cls = args_class(method)
    conform.check(cls, body)
    return decode(cls, body)


def decode_result(method: str, body: bytes) -> Any:
    return decode(result_class(method), body)


def encode_call(method: str, seqid: int, **args: Any) -> bytes:
    """A complete CALL message, for the calls the proxy makes itself (and for tests)."""
    return encode_header(method, MessageType.CALL, seqid) + encode(args_class(method)(**args))
