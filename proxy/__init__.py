"""hms-cache-proxy: a Hive-Metastore-compatible caching proxy.

How a call flows::

    engine --Thrift--> server.ThriftServer (one session per connection, asyncio)
                         |  wire.framing.MessageReader: bytes -> messages (sans-I/O;
                         |  wire.binary.StructScanner finds where unframed messages end)
                         v
                       handler.CallHandler: catalog.lookup(method) says read / write / session
                         |  forwards the request untouched, relays the reply byte for byte
                         v
                       upstream.UpstreamPool: pooled HMS connections, keyed by set_ugi identity,
                         failover across the configured URIs, timeouts, one retry of a read
                         on a stale pooled connection

The sans-I/O core (``wire/``, ``catalog``, ``config``) opens no sockets; ``server``,
``upstream``, ``http`` and ``app`` are the I/O edges. ``metrics`` holds every metric.
"""

__version__ = "0.1.0"
