"""TLS contexts for the two Thrift sides, built once at start-up from the options.

Engines' SSL metastore clients (Hive's ``TSSLTransportFactory``, Trino's
``hive.metastore.thrift.client.ssl.enabled``) speak plain Thrift inside TLS, so TLS is a
property of the socket only: framing, byte transparency and everything above are unchanged.
"""

from __future__ import annotations

import ssl

from proxy.config import Options


def server_context(options: Options) -> ssl.SSLContext | None:
    """For ``--listen``; ``None`` without ``--tls-cert``."""
    if not options.tls_cert:
        return None
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    context.minimum_version = ssl.TLSVersion.TLSv1_2
    context.load_cert_chain(options.tls_cert, options.tls_key)
    if options.tls_client_ca:
        context.load_verify_locations(cafile=options.tls_client_ca)
        context.verify_mode = ssl.CERT_REQUIRED
    return context


def upstream_context(options: Options) -> ssl.SSLContext | None:
    """For connections to the metastore; ``None`` unless ``--upstream-tls on``. The
    metastore's certificate and host name are always verified."""
    if options.upstream_tls != "on":
        return None
    context = ssl.create_default_context(ssl.Purpose.SERVER_AUTH, cafile=options.upstream_tls_ca)
    context.minimum_version = ssl.TLSVersion.TLSv1_2
    if options.upstream_tls_cert:
        context.load_cert_chain(options.upstream_tls_cert, options.upstream_tls_key)
    return context
