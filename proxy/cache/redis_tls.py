"""TLS for the lean look-up connections: the context redis-py builds for the same URL.

The lean connection (``proxy.cache.resp``) sits beside redis-py's, to the same server, so it
must trust, present and refuse exactly what redis-py does for a ``rediss://`` URL. Rather
than a second reading of the ``ssl_*`` settings, the context is made by redis-py's own
``RedisSSLContext`` from the settings its ``SSLConnection`` takes, with that class's
defaults (certificates required, host names checked). Both lists are read from the
installed redis-py, so a setting it adds is honoured, or refused, without a change here.

What neither client could honour is refused at start-up, in one line (:func:`refusal`):
an ``ssl_*`` setting redis-py does not know (a typo would otherwise be a ``TypeError`` in a
background task, and no cache), one on a URL without TLS, or a value redis-py rejects.
"""

from __future__ import annotations

import inspect
import ssl
from collections.abc import Mapping
from typing import Any
from urllib.parse import urlsplit

from redis.asyncio.cluster import RedisCluster
from redis.asyncio.connection import RedisSSLContext, SSLConnection, parse_url
from redis.exceptions import RedisError


def _ssl_parameters(call: Any) -> dict[str, Any]:
    return {
        name: p.default
        for name, p in inspect.signature(call).parameters.items()
        if name.startswith("ssl_")
    }


# The TLS settings of a rediss:// URL, with redis-py's defaults: what SSLConnection takes
# (single Redis), and the part of it RedisCluster passes on to its nodes' connections.
SETTINGS: Mapping[str, Any] = _ssl_parameters(SSLConnection.__init__)
CLUSTER_SETTINGS = frozenset(SETTINGS) & frozenset(_ssl_parameters(RedisCluster.__init__))


def uses_tls(kwargs: Mapping[str, Any]) -> bool:
    """Does redis-py's connection for these settings (its pool's connection kwargs, and the
    name of its connection class) speak TLS?"""
    return kwargs.get("connection_class_name") == SSLConnection.__name__


def context(kwargs: Mapping[str, Any]) -> ssl.SSLContext:
    """The SSL context redis-py's SSLConnection makes from ``kwargs`` (reads the files)."""
    given = {name[len("ssl_") :]: kwargs.get(name, default) for name, default in SETTINGS.items()}
    made: ssl.SSLContext = RedisSSLContext(**given).get()
    return made


def refusal(url: str, *, cluster: bool = False) -> str | None:
    """Why ``url``'s TLS settings cannot be honoured, in one line (without the password);
    ``None`` if they can. Files are not read here: they are read at each connection, as
    redis-py does, so a renewed certificate is picked up."""
    try:
        kwargs: dict[str, Any] = dict(parse_url(url))
    except ValueError as exc:  # a value redis-py cannot parse ("Invalid ssl verify flag")
        return str(exc)
    given = sorted(name for name in kwargs if name == "ssl" or name.startswith("ssl_"))
    if not given:
        return None
    if urlsplit(url).scheme != "rediss":
        return f"{', '.join(given)}: TLS settings need a rediss:// URL"
    known = CLUSTER_SETTINGS if cluster else frozenset(SETTINGS)
    unknown = [name for name in given if name not in known]
    if unknown:
        client = "Redis Cluster client" if cluster else "client"
        return (
            f"{', '.join(unknown)}: not a TLS setting redis-py's {client} takes "
            f"(it takes {', '.join(sorted(known))})"
        )
    return _bad_value(kwargs)


def _bad_value(kwargs: Mapping[str, Any]) -> str | None:
    """The values redis-py would reject only when it connects, checked now (no files)."""
    try:
        RedisSSLContext(cert_reqs=kwargs.get("ssl_cert_reqs", SETTINGS["ssl_cert_reqs"]))
    except RedisError as exc:
        return f"ssl_cert_reqs: {exc}"
    if kwargs.get("ssl_min_version") is not None:
        try:
            ssl.TLSVersion(int(kwargs["ssl_min_version"]))
        except ValueError as exc:
            return f"ssl_min_version: {exc}"
    if kwargs.get("ssl_ciphers") is not None:
        try:
            ssl.create_default_context().set_ciphers(str(kwargs["ssl_ciphers"]))
        except ssl.SSLError as exc:
            return f"ssl_ciphers: {exc}"
    return None
