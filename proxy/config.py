"""Every setting of the proxy, in one table, and how the effective configuration is built.

Each option has one name and three spellings: the flag ``--upstream-read-timeout``, the
environment variable ``HMS_CACHE_PROXY_UPSTREAM_READ_TIMEOUT`` and the TOML key
``upstream_read_timeout``. Precedence: flag > environment > file > default. Values from all
sources go through the same parser, so a bad value is reported the same way wherever it came
from, with the source named; all problems are reported at once, one line each.
"""

from __future__ import annotations

import itertools
import os
import re
import tomllib
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from proxy.urls import redact_url as redact_url  # where it lived before proxy.urls
from proxy.wire.framing import Transport

ENV_PREFIX = "HMS_CACHE_PROXY_"
# What Kubernetes puts in every pod's environment for a Service named ``hms-cache-proxy``
# (service links): HMS_CACHE_PROXY_SERVICE_HOST, HMS_CACHE_PROXY_PORT_9083_TCP_ADDR, ...
SERVICE_LINK = re.compile(r"SERVICE_(HOST|PORT(_\w+)?)|PORT(_\d+_(TCP|UDP|SCTP)(_\w+)?)?")


class ConfigError(Exception):
    """The configuration has problems; ``problems`` holds one line for each."""

    def __init__(self, problems: list[str]) -> None:
        super().__init__("\n".join(problems))
        self.problems = problems


@dataclass(frozen=True, slots=True)
class HostPort:
    host: str
    port: int

    def __str__(self) -> str:
        return f"[{self.host}]:{self.port}" if ":" in self.host else f"{self.host}:{self.port}"


@dataclass(frozen=True, slots=True)
class Endpoint:
    """One upstream metastore, from a ``thrift://host:port`` URI."""

    host: str
    port: int

    def __str__(self) -> str:
        return f"thrift://{HostPort(self.host, self.port)}"


# ---------------------------------------------------------------------------------------------
# Parsers: text (or a TOML value) -> typed value; ValueError carries the reason.


def parse_host_port(text: Any) -> HostPort:
    text = str(text).strip()
    host, sep, port = text.rpartition(":")
    if not sep or not port.isdigit():
        raise ValueError(f"expected HOST:PORT, got {text!r}")
    number = int(port)
    if not 0 <= number <= 65535:
        raise ValueError(f"port {number} is out of range")
    host = host.strip("[]") or "0.0.0.0"
    return HostPort(host, number)


def parse_upstreams(text: Any) -> tuple[Endpoint, ...]:
    items = text if isinstance(text, list) else str(text).split(",")
    endpoints = []
    for item in (str(i).strip() for i in items):
        if not item:
            continue
        parts = urlsplit(item)
        if parts.scheme != "thrift":
            raise ValueError(f"{item!r} is not a thrift://host:port URI")
        if not parts.hostname or parts.port is None:
            raise ValueError(f"{item!r} needs a host and a port")
        endpoints.append(Endpoint(parts.hostname, parts.port))
    if not endpoints:
        raise ValueError("no thrift:// URI given")
    return tuple(endpoints)


def parse_redis_url(text: Any) -> str | None:
    text = str(text).strip()
    if not text:
        return None
    scheme = urlsplit(text).scheme
    if scheme not in ("redis", "rediss", "unix"):
        raise ValueError(f"expected a redis://, rediss:// or unix:// URL, got scheme {scheme!r}")
    return str(text)


def parse_seconds(text: Any) -> float:
    value = float(text)
    if not value > 0:
        raise ValueError(f"must be a positive number of seconds, got {text!r}")
    return value


def parse_non_negative_seconds(text: Any) -> float:
    value = float(text)
    if value < 0:
        raise ValueError(f"must not be negative, got {text!r}")
    return value


def parse_non_negative_rate(text: Any) -> float:
    value = float(text)
    if not 0 <= value < float("inf"):
        raise ValueError(f"must be a number from 0 up, got {text!r}")
    return value


def parse_optional_path(text: Any) -> str | None:
    text = str(text).strip()
    return text or None


def parse_audit_target(text: Any) -> str | None:
    value = str(text).strip()
    if value.lower() in ("", "none", "off"):
        return None
    return "stdout" if value.lower() in ("stdout", "-") else value


def parse_optional_principal(text: Any) -> str | None:
    text = str(text).strip()
    if text and (text.count("@") > 1 or text.startswith(("@", "/"))):
        raise ValueError(f"expected service/host@REALM, got {text!r}")
    return text or None


def parse_names(text: Any) -> tuple[str, ...]:
    items = text if isinstance(text, list) else str(text).split(",")
    return tuple(str(i).strip() for i in items if str(i).strip())


def parse_qops(text: Any) -> tuple[str, ...]:
    names = {"authentication": "auth", "integrity": "auth-int", "privacy": "auth-conf"}
    qops = []
    for name in parse_names(text):
        qop = names.get(name.lower(), name.lower())
        if qop not in names.values():
            raise ValueError(f"expected authentication, integrity or privacy, got {name!r}")
        if qop not in qops:
            qops.append(qop)
    if not qops:
        raise ValueError("name at least one of authentication, integrity, privacy")
    return tuple(qops)


def parse_optional_marker(text: Any) -> str | None:
    text = str(text).strip()
    if text and "=" not in text:
        raise ValueError(f"expected PARAMETER=VALUE, got {text!r}")
    return text or None


def tls_problems(options: Options) -> list[str]:
    """Certificates and keys come in pairs, and every file named must be readable."""
    problems = []
    pairs = (
        ("tls_cert", "tls_key"),
        ("upstream_tls_cert", "upstream_tls_key"),
        ("admin_tls_cert", "admin_tls_key"),
    )
    for cert, key in pairs:
        if bool(getattr(options, cert)) != bool(getattr(options, key)):
            problems.append(f"{cert}, {key}: give both or neither")
    if options.tls_client_ca and not options.tls_cert:
        problems.append("tls_client_ca: needs tls_cert and tls_key (TLS on --listen)")
    for name in (
        "tls_cert",
        "tls_key",
        "tls_client_ca",
        "upstream_tls_ca",
        "upstream_tls_cert",
        "upstream_tls_key",
        "admin_tls_cert",
        "admin_tls_key",
    ):
        path = getattr(options, name)
        if path and not os.access(path, os.R_OK):
            problems.append(f"{name}: cannot read {path}")
    upstream_files = options.upstream_tls_ca or options.upstream_tls_cert
    if upstream_files and options.upstream_tls != "on":
        problems.append("upstream_tls_ca/cert: set upstream_tls on to use them")
    return problems


def kerberos_problems(options: Options) -> list[str]:
    """What SASL on either side needs, said before anything starts."""
    problems = []
    client = options.client_auth == "kerberos"
    upstream = options.upstream_auth == "kerberos"
    missing = [
        name for name in ("kerberos_principal", "kerberos_keytab") if not getattr(options, name)
    ]
    if (client or upstream) and missing:
        side = "client_auth" if client else "upstream_auth"
        problems.append(f"{side} kerberos: needs {' and '.join(missing)}")
    if options.kerberos_keytab and not os.access(options.kerberos_keytab, os.R_OK):
        problems.append(f"kerberos_keytab: cannot read {options.kerberos_keytab}")
    if upstream and not options.upstream_principal:
        problems.append(
            "upstream_auth kerberos: needs upstream_principal (the HMS's "
            "hive.metastore.kerberos.principal, e.g. hive/_HOST@REALM)"
        )
    if upstream and not client and options.upstream_identity == "end-user":
        problems.append(
            "upstream_identity end-user: needs client_auth kerberos (the proxy runs calls as "
            "users it has authenticated); or set upstream_identity proxy"
        )
    if client and options.client_transport is Transport.FRAMED:
        problems.append("client_auth kerberos: SASL has its own frames; client_transport buffered")
    if upstream and options.upstream_transport is Transport.FRAMED:
        problems.append(
            "upstream_auth kerberos: SASL has its own frames; upstream_transport buffered"
        )
    if (client or upstream) and not _have_gssapi():
        problems.append(
            "client_auth/upstream_auth kerberos: needs the gssapi package "
            "(pip install 'hms-cache-proxy[kerberos]'; it builds against MIT krb5, libkrb5-dev)"
        )
    return problems


# The default of the metastore's hive.txn.timeout: a lock not heartbeated for this long is
# aborted by the HMS, so it may be held this long after the proxy last saw it.
HIVE_TXN_TIMEOUT_DEFAULT = 300.0


def option_warnings(options: Options) -> list[str]:
    """Settings that are allowed but may not do what was meant, said once at start-up."""
    warnings = []
    fence = options.lock_fence_seconds
    if options.cache == "on" and 0 < fence < HIVE_TXN_TIMEOUT_DEFAULT:
        warnings.append(
            f"lock_fence_seconds {fence:g} is below the metastore's hive.txn.timeout default "
            f"({HIVE_TXN_TIMEOUT_DEFAULT:g} s): a fence whose unlock does not come may end "
            "before the HMS's lock does, and a read inside that lock may then be served "
            "from the cache"
        )
    return warnings


def _have_gssapi() -> bool:
    import importlib.util

    return importlib.util.find_spec("gssapi") is not None


WILDCARDS = ("0.0.0.0", "::", "")


def collide(a: HostPort, b: HostPort) -> bool:
    """Whether two listen addresses would fight over a port: the same port on the same
    host, or on any host when either is a wildcard (0.0.0.0:9090 takes 127.0.0.1:9090)."""
    if a.port != b.port or a.port == 0:
        return False
    return a.host == b.host or a.host in WILDCARDS or b.host in WILDCARDS


def is_loopback(host: str) -> bool:
    import ipaddress

    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def parse_size(text: Any) -> int:
    """Bytes, with an optional binary suffix: ``64MiB``, ``512k``, ``1G``."""
    raw = str(text).strip().lower().removesuffix("b").removesuffix("i")
    scale = 1
    for suffix, factor in (("k", 1 << 10), ("m", 1 << 20), ("g", 1 << 30)):
        if raw.endswith(suffix):
            raw, scale = raw[:-1], factor
            break
    value = int(float(raw) * scale)
    if value <= 0:
        raise ValueError(f"must be a positive size, got {text!r}")
    return value


def parse_count(text: Any) -> int:
    value = int(text)
    if value < 0:
        raise ValueError(f"must not be negative, got {text!r}")
    return value


def choice(*allowed: str) -> Callable[[Any], str]:
    def parse(text: Any) -> str:
        value = str(text).strip().lower()
        if value not in allowed:
            raise ValueError(f"expected one of {', '.join(allowed)}, got {text!r}")
        return value

    return parse


def parse_transport(text: Any) -> Transport:
    return Transport(choice("buffered", "framed")(text))


# ---------------------------------------------------------------------------------------------
# The options. Defaults name the engine value they are chosen against.


def _opt(
    default: Any,
    parse: Callable[[Any], Any],
    help: str,
    *,
    metavar: str = "",
    secret: bool = False,
) -> Any:
    return field(
        default=default,
        metadata={"parse": parse, "help": help, "metavar": metavar, "secret": secret},
    )


@dataclass(frozen=True)
class Options:
    listen: HostPort = _opt(
        HostPort("0.0.0.0", 9083),
        parse_host_port,
        "where engines connect; 9083 is the port they expect a metastore on",
        metavar="HOST:PORT",
    )
    upstream: tuple[Endpoint, ...] = _opt(
        (),
        parse_upstreams,
        "the Hive Metastore(s), a comma list like Trino's hive.metastore.uri: the first "
        "reachable one is used, the next on connect failure",
        metavar="thrift://HOST:PORT[,...]",
    )
    redis: str | None = _opt(
        None,
        parse_redis_url,
        "Redis for the shared cache (redis://, rediss://, unix://); without it an embedded "
        "in-process cache is used",
        metavar="URL",
        secret=True,
    )
    metrics_listen: HostPort = _opt(
        HostPort("0.0.0.0", 9090),
        parse_host_port,
        "where Prometheus scrapes /metrics",
        metavar="HOST:PORT",
    )
    client_transport: Transport = _opt(
        Transport.BUFFERED,
        parse_transport,
        "Thrift transport engines use: buffered (every engine's default) or framed",
        metavar="buffered|framed",
    )
    upstream_transport: Transport = _opt(
        Transport.BUFFERED,
        parse_transport,
        "Thrift transport of the metastore: buffered (Hive's default) or framed",
        metavar="buffered|framed",
    )
    upstream_connect_timeout: float = _opt(
        2.0,
        parse_seconds,
        "seconds to connect to one metastore before trying the next (not how long a call "
        "waits for a connection at --upstream-max-connections: that is the read timeout)",
        metavar="SECONDS",
    )
    upstream_read_timeout: float = _opt(
        600.0,
        parse_seconds,
        "seconds the metastore may stay silent during a call (like a socket timeout); as "
        "long as Hive's and Spark's client wait, so that the proxy never gives up on a call "
        "before its client would (a client that gives up sooner, Trino at 10 s, retries); "
        "also how long a call waits its turn for a connection at --upstream-max-connections",
        metavar="SECONDS",
    )
    upstream_max_connections: int = _opt(
        64,
        parse_count,
        "connections to the metastore at most (Hive's server runs 200 threads by default); "
        "at the limit a call waits its turn (round-robin across users), up to the read "
        "timeout; reads may hold all but an eighth, the rest is kept for writes",
        metavar="N",
    )
    upstream_max_idle: int = _opt(
        16,
        parse_count,
        "idle metastore connections kept for reuse (Trino opens one connection per call)",
        metavar="N",
    )
    upstream_idle_timeout: float = _opt(
        60.0,
        parse_seconds,
        "seconds an idle metastore connection is kept before it is closed",
        metavar="SECONDS",
    )
    max_request_bytes: int = _opt(
        64 << 20,
        parse_size,
        "largest request accepted from a client (64 MiB holds add_partitions of ~50,000)",
        metavar="BYTES",
    )
    max_reply_bytes: int = _opt(
        100 << 20,
        parse_size,
        "largest reply to a client's read: the 100 MiB Thrift 0.14+ clients take (Trino, "
        "Spark 4, Hive 4; a partition is ~0.5 KB with 3 columns, ~1.1 KB with 20); a bigger "
        "one is answered with a "
        "MetaException naming the table and the limit, not a connection cut mid-reply; "
        "replies are held whole before they are sent, at most this much per call",
        metavar="BYTES",
    )
    max_partitions_per_call: int = _opt(
        0,
        parse_count,
        "calls for partition objects that would return more are refused with the HMS's own "
        "MetaException for hive.metastore.limit.partition.request (counted by the metastore "
        "before they are sent); 0: no limit. 100 MiB divided by your widest table's "
        "partition size keeps a call within a client's limit (~90,000 at 1.1 KB); lower "
        "it to what your largest legitimate scan needs",
        metavar="N",
    )
    heavy_partitions: int = _opt(
        10_000,
        parse_count,
        "a call for partition objects returning more than this many (or that may: an "
        "expression over a bigger table) is heavy: it waits in a line of its own, limited "
        "by --heavy-max-concurrent, so small calls never wait behind it; calls are costed "
        "by a partition count asked of the metastore (see --partition-count-ttl); 0: off",
        metavar="N",
    )
    heavy_max_concurrent: int = _opt(
        4,
        parse_count,
        "heavy calls at the metastore at once (each builds a reply of megabytes in its "
        "heap); 0: heavy calls are not told apart",
        metavar="N",
    )
    limits_file: str | None = _opt(
        None,
        parse_optional_path,
        "per-user and per-address rate limits (calls/s, partitions/s) by group, in TOML "
        "(see docs/protections.md); read again within seconds of a change",
        metavar="PATH",
    )
    audit_log: str | None = _opt(
        None,
        parse_audit_target,
        "one JSON line per call (time, user, address, method, table, partitions, bytes, "
        "outcome, cache, latency): stdout, or a file rotated by size; none: off",
        metavar="stdout|PATH",
    )
    audit_log_max_bytes: int = _opt(
        100 << 20,
        parse_size,
        "size at which the audit log file is rotated",
        metavar="BYTES",
    )
    audit_log_backups: int = _opt(
        5,
        parse_count,
        "rotated audit log files kept (audit.log.1 the newest)",
        metavar="N",
    )
    partition_count_ttl: float = _opt(
        30.0,
        parse_seconds,
        "seconds a table's partition count (asked of the metastore, to cost a call before "
        "it is sent) is trusted",
        metavar="SECONDS",
    )
    client_message_timeout: float = _opt(
        30.0,
        parse_seconds,
        "seconds a client may take to send one request, from its first byte to its last (a "
        "client trickling bytes is closed: slow-loris)",
        metavar="SECONDS",
    )
    client_idle_timeout: float = _opt(
        600.0,
        parse_non_negative_seconds,
        "seconds a client connection may stay without starting a request before it is "
        "closed (Hive's and Spark's clients reconnect by themselves); 0: never",
        metavar="SECONDS",
    )
    max_client_connections: int = _opt(
        4096,
        parse_count,
        "client connections at most; one more gets a TApplicationException saying so and is "
        "closed; 0: no limit",
        metavar="N",
    )
    tls_cert: str | None = _opt(
        None,
        parse_optional_path,
        "PEM certificate (chain) engines see: TLS on --listen (Hive's and Trino's SSL "
        "metastore clients); with --tls-key",
        metavar="PATH",
    )
    tls_key: str | None = _opt(
        None, parse_optional_path, "PEM private key of --tls-cert", metavar="PATH"
    )
    tls_client_ca: str | None = _opt(
        None,
        parse_optional_path,
        "PEM CA bundle: engines must present a certificate it signed (mutual TLS)",
        metavar="PATH",
    )
    upstream_tls: str = _opt(
        "off",
        choice("on", "off"),
        "TLS to the metastore (hive.metastore.use.SSL on the HMS); its certificate and host "
        "name are verified",
        metavar="on|off",
    )
    upstream_tls_ca: str | None = _opt(
        None,
        parse_optional_path,
        "PEM CA bundle to verify the metastore's certificate (default: the system's)",
        metavar="PATH",
    )
    upstream_tls_cert: str | None = _opt(
        None,
        parse_optional_path,
        "PEM client certificate for the metastore, if it asks for one; with --upstream-tls-key",
        metavar="PATH",
    )
    upstream_tls_key: str | None = _opt(
        None, parse_optional_path, "PEM private key of --upstream-tls-cert", metavar="PATH"
    )
    client_auth: str = _opt(
        "none",
        choice("none", "kerberos"),
        "kerberos: engines authenticate with SASL GSSAPI (hive.metastore.sasl.enabled) as "
        "to a Kerberized metastore, or DIGEST-MD5 with a metastore delegation token",
        metavar="none|kerberos",
    )
    kerberos_principal: str | None = _opt(
        None,
        parse_optional_principal,
        "the proxy's own principal (service/host@REALM; _HOST is this host's name): engines "
        "name it as hive.metastore.kerberos.principal, and the proxy logs in as it upstream",
        metavar="PRINCIPAL",
    )
    kerberos_keytab: str | None = _opt(
        None, parse_optional_path, "keytab holding --kerberos-principal's keys", metavar="PATH"
    )
    kerberos_local_realms: tuple[str, ...] = _opt(
        (),
        parse_names,
        "realms whose principals map to a short user name (Hadoop's default auth_to_local "
        "rule: alice@REALM and alice/host@REALM are alice), others are refused; none given: "
        "the realm of --kerberos-principal",
        metavar="REALM,...",
    )
    upstream_auth: str = _opt(
        "none",
        choice("none", "kerberos"),
        "kerberos: SASL to a Kerberized metastore (hive.metastore.sasl.enabled on the HMS), "
        "logged in from --kerberos-keytab",
        metavar="none|kerberos",
    )
    upstream_principal: str | None = _opt(
        None,
        parse_optional_principal,
        "the metastore's principal, as engines write hive.metastore.kerberos.principal "
        "(_HOST is the metastore's host in --upstream)",
        metavar="PRINCIPAL",
    )
    upstream_identity: str = _opt(
        "end-user",
        choice("end-user", "proxy"),
        "end-user: every call runs at the metastore as the engine's authenticated user "
        "(a delegation token per user; the HMS must grant the proxy hadoop.proxyuser rights); "
        "proxy: every call runs as --kerberos-principal",
        metavar="end-user|proxy",
    )
    sasl_qop: tuple[str, ...] = _opt(
        ("auth",),
        parse_qops,
        "SASL protection, as hadoop.rpc.protection: authentication, integrity, privacy (a "
        "comma list); engines may choose any listed; towards the metastore, the weakest it "
        "offers that is at least the weakest listed",
        metavar="LIST",
    )
    drain_timeout: float = _opt(
        20.0,
        parse_seconds,
        "on SIGTERM, seconds in-flight calls get to finish (Kubernetes waits 30 s by default)",
        metavar="SECONDS",
    )
    cache: str = _opt(
        "on",
        choice("on", "off"),
        "answer reads from the cache (off: a plain proxy)",
        metavar="on|off",
    )
    cache_scope: str = _opt(
        "auto",
        choice("auto", "shared", "user"),
        "user: entries are per user (the authenticated one with --client-auth kerberos, else "
        "set_ugi's user and groups), so no user is ever served a reply fetched for another; "
        "shared: one cache for everyone, which bypasses the metastore's read authorisation "
        "for cached replies; auto: user with --client-auth kerberos, else shared",
        metavar="auto|shared|user",
    )
    memory_cache_bytes: int = _opt(
        256 << 20,
        parse_size,
        "without --redis, the embedded cache's size (an eighth of it a decoded front of the "
        "hottest replies); with it, the in-process copy of decoded replies in front of Redis "
        "(and, with --redis-tracking on, up to an eighth more for the versions)",
        metavar="BYTES",
    )
    cache_max_entry_bytes: int = _opt(
        64 << 20,
        parse_size,
        "largest reply cached (bigger ones are streamed through only)",
        metavar="BYTES",
    )
    redis_timeout: float = _opt(
        0.05,
        parse_seconds,
        "seconds a Redis operation may take before the call is answered from the metastore",
        metavar="SECONDS",
    )
    redis_mode: str = _opt(
        "auto",
        choice("auto", "single", "cluster"),
        "single Redis or Redis Cluster; auto asks the server",
        metavar="auto|single|cluster",
    )
    redis_key_prefix: str = _opt(
        "hmsc:1:", str, "prefix of every key this proxy writes to Redis", metavar="PREFIX"
    )
    redis_tracking: str = _opt(
        "on",
        choice("on", "off"),
        "on: the versions hits depend on are kept in process, coherent through Redis's "
        "client-side caching invalidations (CLIENT TRACKING BCAST), so a hit costs no Redis "
        "round trip, and a write through another proxy is seen within the invalidation's "
        "delivery (at most --redis-tracking-max-lag); off: versions are read from Redis on "
        "every hit",
        metavar="on|off",
    )
    redis_tracking_max_lag: float = _opt(
        1.0,
        parse_seconds,
        "longest an invalidation stream may go without delivering this proxy's beat before "
        "hits read versions from Redis again (the bound on seeing a write made through "
        "another proxy)",
        metavar="SECONDS",
    )
    redis_write_trust: float = _opt(
        2.0,
        parse_seconds,
        "a proxy serves from Redis only while Redis took one of its writes (a probe every "
        "0.25 s) within this long, and again this long after writes are taken again; a "
        "write's or lock's fence that Redis refuses while it serves reads (paused, "
        "NOREPLICAS, MISCONF, READONLY, OOM) is retried this long before the call goes "
        "ahead, so that no proxy serves what it changes from the old versions",
        metavar="SECONDS",
    )
    ttl_catalog: float = _opt(
        60.0, parse_seconds, "seconds database lists (and privileges) are cached", metavar="SECONDS"
    )
    ttl_database: float = _opt(
        60.0,
        parse_seconds,
        "seconds database objects and table lists are cached",
        metavar="SECONDS",
    )
    ttl_table: float = _opt(
        60.0,
        parse_seconds,
        "seconds table objects, fields and schemas are cached",
        metavar="SECONDS",
    )
    ttl_partitions: float = _opt(
        60.0,
        parse_seconds,
        "seconds partition names and partition objects are cached",
        metavar="SECONDS",
    )
    ttl_statistics: float = _opt(
        15.0,
        parse_seconds,
        "seconds column statistics are cached (shorter than the rest: HMS 2.3 and 3.1 log no "
        "event for a statistics update made straight at the metastore)",
        metavar="SECONDS",
    )
    ttl_functions: float = _opt(
        300.0, parse_seconds, "seconds function definitions are cached", metavar="SECONDS"
    )
    ttl_negative: float = _opt(
        15.0,
        parse_seconds,
        "seconds a NoSuchObjectException for a table or database is cached (a create "
        "through the proxy clears it at once)",
        metavar="SECONDS",
    )
    notifications: str = _opt(
        "auto",
        choice("auto", "on", "off"),
        "follow the metastore's notification log to see writes that bypass the proxy; auto: "
        "when the metastore serves it, else TTLs only",
        metavar="auto|on|off",
    )
    notification_poll: float = _opt(
        1.0, parse_seconds, "seconds between polls of the notification log", metavar="SECONDS"
    )
    notification_window: float = _opt(
        10.0,
        parse_seconds,
        "how late an event may become visible in the notification log: each poll re-reads "
        "this far back (at most 1,000 events) for events that share an id with one applied "
        "or commit out of id order (HMS 2.3, HIVE-16886), and an id missing this long is a "
        "gap (the cache is flushed)",
        metavar="SECONDS",
    )
    follower_lease: float = _opt(
        5.0,
        parse_seconds,
        "seconds the notification follower's lease lasts; another proxy takes over this long "
        "after the follower dies",
        metavar="SECONDS",
    )
    write_fence_seconds: float = _opt(
        60.0,
        parse_seconds,
        "how long a write's fence holds if its proxy dies before invalidating: no proxy "
        "caches what the write changes until then",
        metavar="SECONDS",
    )
    lock_fence_seconds: float = _opt(
        300.0,
        parse_non_negative_seconds,
        "while an HMS lock on a table is held or waited for, reads of the table's object go "
        "to the metastore (Iceberg's commit check); a fence whose unlock never comes ends "
        "after this long: at least the metastore's hive.txn.timeout (300 s by default). "
        "0: no fences (unsafe for Iceberg and other lock-based writers)",
        metavar="SECONDS",
    )
    cache_iceberg_tables: str = _opt(
        "auto",
        choice("auto", "on", "off"),
        "serve Iceberg table objects (table_type=ICEBERG) from the cache: auto: while the "
        "notification log is followed (a commit made elsewhere is then seen within a poll); "
        "on: always (within the TTL without the log); off: never",
        metavar="auto|on|off",
    )
    iceberg_expected_location: str = _opt(
        "on",
        choice("on", "off"),
        "add expected_parameter_key=metadata_location (HIVE-26882) to an Iceberg commit (an "
        "alter that moves the table's metadata_location; one get_table to tell) that lacks "
        "it, so that the metastore refuses a commit on a stale base instead of replacing "
        "another writer's commit",
        metavar="on|off",
    )
    stale_if_error: float = _opt(
        0.0,
        parse_non_negative_seconds,
        "while the metastore is unreachable, serve cached reads up to this many seconds past "
        "their TTL (0: never)",
        metavar="SECONDS",
    )
    freshness_check_rate: float = _opt(
        0.0,
        parse_non_negative_rate,
        "cache hits re-read from the metastore a second, at most, each compared with what "
        "was served: a reply that differs with no write in between is counted "
        "(hmsproxy_freshness_checks_total), logged, and its table answered from the "
        "metastore for --freshness-quarantine (0: off)",
        metavar="PER_SECOND",
    )
    freshness_quarantine: float = _opt(
        300.0,
        parse_non_negative_seconds,
        "seconds a table whose cached reply the freshness check found stale is answered from "
        "the metastore, by every proxy sharing the store (0: only invalidated)",
        metavar="SECONDS",
    )
    admin_listen: HostPort = _opt(
        HostPort("127.0.0.1", 9091),
        parse_host_port,
        "gRPC admin API and health service (Kubernetes probes)",
        metavar="HOST:PORT",
    )
    admin_tls_cert: str | None = _opt(
        None,
        parse_optional_path,
        "PEM certificate (chain) of the admin port: TLS for the admin and listing APIs, so the "
        "bearer token never crosses the network in the clear; with --admin-tls-key",
        metavar="PATH",
    )
    admin_tls_key: str | None = _opt(
        None, parse_optional_path, "PEM private key of --admin-tls-cert", metavar="PATH"
    )
    admin_token_file: str | None = _opt(
        None,
        parse_optional_path,
        "file holding the bearer token admin calls must carry; required when --admin-listen "
        "is not a loopback address",
        metavar="PATH",
    )
    seal_after: float = _opt(
        3600.0,
        parse_non_negative_seconds,
        "a partition not altered for this long (transient_lastDdlTime) is sealed: its file "
        "listing may be cached",
        metavar="SECONDS",
    )
    seal_marker: str | None = _opt(
        None,
        parse_optional_marker,
        "a partition parameter that seals a partition at once, as PARAMETER=VALUE",
        metavar="PARAM=VALUE",
    )
    seal_marker_file: str | None = _opt(
        None,
        parse_optional_path,
        "also require this file in the directory before a partition counts as sealed (e.g. "
        "_SUCCESS)",
        metavar="NAME",
    )
    ttl_listings: float = _opt(
        3600.0,
        parse_seconds,
        "seconds a sealed partition's file listing is cached",
        metavar="SECONDS",
    )
    listing_concurrency: int = _opt(
        16,
        parse_count,
        "directories listed at once for one table listing (object stores answer each listing "
        "in tens of milliseconds)",
        metavar="N",
    )
    s3_endpoint_url: str | None = _opt(
        None, parse_optional_path, "S3 endpoint for s3:// locations (default: AWS)", metavar="URL"
    )
    s3_region: str | None = _opt(None, parse_optional_path, "S3 region", metavar="REGION")
    s3_access_key: str | None = _opt(
        None,
        parse_optional_path,
        "S3 access key (default: the usual AWS credential chain)",
        metavar="KEY",
        secret=True,
    )
    s3_secret_key: str | None = _opt(
        None, parse_optional_path, "S3 secret key", metavar="SECRET", secret=True
    )
    status_show_names: str = _opt(
        "off",
        choice("on", "off"),
        "on: the status page (/ on the metrics port) names the busiest tables; off: it shows a "
        "short hash of each name instead",
        metavar="on|off",
    )
    ready_without_redis: str = _opt(
        "on",
        choice("on", "off"),
        "on: stay ready while Redis is down (serving from the metastore, degraded); off: "
        "report not ready",
        metavar="on|off",
    )
    log_level: str = _opt(
        "info", choice("debug", "info", "warning", "error"), "log level", metavar="LEVEL"
    )
    malloc_trim_seconds: float = _opt(
        60.0,
        parse_non_negative_seconds,
        "every this long, give the memory the allocator keeps free back to the operating "
        "system (glibc's malloc_trim: a few ms on the event loop); 0: never",
        metavar="SECONDS",
    )
    fast_paths: str = _opt(
        "on",
        choice("on", "off"),
        "for development and tests: off serves every client connection with a task from its "
        "first byte and answers every call the ordinary, awaited way (no answer kept for a "
        "call asked again, no hit answered or call forwarded from the sockets' callbacks); "
        "the replies and the metrics are the same either way (tests/unit/test_fast_paths.py)",
        metavar="on|off",
    )
    forward_at_once: str = _opt(
        "on",
        choice("on", "off"),
        "gone (it turned off one fast path); accepted so that configurations that set it "
        "still start, with a warning for off: --fast-paths off turns every fast path off",
        metavar="on|off",
    )
    event_loop: str = _opt(
        "auto",
        choice("auto", "uvloop", "asyncio"),
        "the event loop: uvloop (libuv, faster sockets and timers), asyncio (the standard "
        "library's), auto: uvloop where it is installed, else asyncio",
        metavar="auto|uvloop|asyncio",
    )

    @property
    def per_user_cache(self) -> bool:
        """Whether cache entries are kept per user (``cache_scope``, ``auto`` resolved)."""
        if self.cache_scope == "auto":
            return self.client_auth == "kerberos"
        return self.cache_scope == "user"

    def printable(self) -> dict[str, Any]:
        """The effective configuration as TOML-ready values, secrets redacted."""
        out: dict[str, Any] = {}
        for f in fields(self):
            value = getattr(self, f.name)
            if f.metadata["secret"] and isinstance(value, str):
                value = redact_url(value) if "://" in value else "***"
            if isinstance(value, tuple):
                value = ",".join(str(v) for v in value)
            elif isinstance(value, Transport):
                value = value.value
            elif isinstance(value, HostPort):
                value = str(value)
            out[f.name] = value
        return out


def option_fields() -> tuple[Any, ...]:
    return fields(Options)


def env_name(name: str) -> str:
    return ENV_PREFIX + name.upper()


def flag_name(name: str) -> str:
    return "--" + name.replace("_", "-")


def load(
    flags: Mapping[str, Any],
    env: Mapping[str, str] | None = None,
    config_file: Path | None = None,
    *,
    require_upstream: bool = True,
) -> Options:
    """Merge the sources (flag > env > file > default), parse, validate. Raises ConfigError."""
    env = os.environ if env is None else env
    problems: list[str] = []
    file_values: dict[str, Any] = {}
    known = {f.name for f in option_fields()}
    unreadable = False  # then what the file would have said is not known: say only that
    if config_file is not None:
        try:
            file_values = tomllib.loads(config_file.read_text())
        except OSError as exc:
            unreadable = True
            problems.append(f"config file {config_file}: {exc.strerror or exc}")
        except tomllib.TOMLDecodeError as exc:
            unreadable = True
            problems.append(f"config file {config_file}: not valid TOML: {exc}")
        for key in sorted(set(file_values) - known):
            problems.append(f"config file {config_file}: unknown option {key!r}")
    for key in sorted(k for k in env if k.startswith(ENV_PREFIX)):
        if key[len(ENV_PREFIX) :].lower() in known or key == ENV_PREFIX + "CONFIG":
            continue
        if SERVICE_LINK.fullmatch(key[len(ENV_PREFIX) :]):
            continue  # Kubernetes' variables for a Service named hms-cache-proxy, not ours
        problems.append(f"environment {key}: unknown option")
    values: dict[str, Any] = {}
    given: set[str] = set()
    for f in option_fields():
        for source, raw in (
            (flag_name(f.name), flags.get(f.name)),
            (env_name(f.name), env.get(env_name(f.name))),
            (f"config file key {f.name!r}", file_values.get(f.name)),
        ):
            if raw is None:
                continue
            given.add(f.name)
            try:
                values[f.name] = f.metadata["parse"](raw)
            except (ValueError, TypeError) as exc:
                problems.append(f"{source}: {exc}")
            break
    options = Options(**values)
    if require_upstream and "upstream" not in given and not unreadable:
        problems.append(
            f"upstream: no metastore given (use {flag_name('upstream')} thrift://HOST:9083 "
            f"or {env_name('upstream')})"
        )
    if options.upstream_max_idle > options.upstream_max_connections:
        problems.append("upstream_max_idle: cannot exceed upstream_max_connections")
    if options.upstream_max_connections == 0:
        problems.append("upstream_max_connections: must be at least 1")
    if not is_loopback(options.admin_listen.host) and not options.admin_token_file:
        problems.append(
            f"admin_token_file: required because admin_listen {options.admin_listen} is not "
            "loopback (anyone who reaches the port could flush the cache)"
        )
    elif options.admin_token_file:
        try:
            if not Path(options.admin_token_file).read_text().strip():
                problems.append(f"admin_token_file: {options.admin_token_file} is empty")
        except OSError as exc:
            problems.append(f"admin_token_file: {exc}")
    problems += tls_problems(options)
    problems += kerberos_problems(options)
    if options.audit_log and options.audit_log != "stdout":
        folder = Path(options.audit_log).parent
        if not folder.is_dir() or not os.access(folder, os.W_OK):
            problems.append(f"audit_log: cannot write in {folder}")
        elif Path(options.audit_log).is_dir():
            problems.append(f"audit_log: {options.audit_log} is a directory, not a file")
    if not 4 << 10 <= options.max_reply_bytes < 2 << 30:
        problems.append("max_reply_bytes: from 4 KiB to under 2 GiB (Thrift's own bound)")
    if options.limits_file:
        from proxy.guard.limits import LimitsError, parse

        try:
            parse(Path(options.limits_file).read_text())
        except (OSError, UnicodeDecodeError, LimitsError) as exc:
            problems.append(f"limits_file: {options.limits_file}: {exc}")
    if options.redis:
        # Here, not in the option's parser: with redis_mode cluster, redis-py's cluster client
        # takes fewer TLS settings. Imported here so that only a proxy with Redis loads it.
        from proxy.cache.redis_tls import refusal

        refused = refusal(options.redis, cluster=options.redis_mode == "cluster")
        if refused:
            problems.append(f"redis: {refused}")
    named = {
        "listen": options.listen,
        "metrics_listen": options.metrics_listen,
        "admin_listen": options.admin_listen,
    }
    for (a, first), (b, second) in itertools.combinations(named.items(), 2):
        if collide(first, second):
            problems.append(f"{a} {first} and {b} {second} would listen on the same port")
    if problems:
        raise ConfigError(problems)
    return options
