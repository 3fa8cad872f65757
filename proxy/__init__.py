"""hms-cache-proxy: a Hive-Metastore-compatible caching proxy.

How a call flows::

    engine --Thrift--> server.ThriftServer; conn.protocol.ClientProtocol (one per
                         |  connection) feeds conn.machine.ClientMachine (sans-I/O: its
                         |  state, its clocks; wire.framing.MessageReader finds whole calls)
                         |  fast paths, in the socket callbacks (no task): a hit whose
                         |  entry and versions are in process (a call known by its bytes:
                         |  handler.known_calls; answered again: handler.again), a call
                         |  only forwarded (handler.flight)
                         v  anything else: a task for that call (SASL connections:
                         |  conn.streamed, a loop over the machine on the layer's streams)
                       handler.dispatch.CallHandler: catalog.lookup(method) picks the way
                         |-- reads:    cache.engine.CacheEngine.read (plan, decide, look up,
                         |             single flight, fill), the metastore on a miss
                         |-- writes:   fence, forward, invalidate, then answer the writer
                         |-- identity: set_ugi and pinned connections
                         v
                       handler.forward.Forwarder -> upstream.relay (one call, the reply
                         streamed or held) on a connection of upstream.pool.UpstreamPool
                         (pooled, keyed by set_ugi identity, failover, one retry of a read
                         on a stale pooled connection)

docs/design.md says how a call is answered, layer by layer. The sans-I/O core (``wire/``,
``catalog``, ``config``'s options and parsers (``config.load`` reads the files it is
named), and in ``cache/``: ``keys``, ``plan``, ``planner``, ``invalidation``,
``named_partitions``, ``decide``, ``mirror``, ``entry``, ``partitions``, ``locks``,
``events``, ``conn.machine``) opens no sockets; ``server``, ``conn``, ``upstream``,
``cache.redis_store``, ``http``, ``admin`` and ``app`` are the I/O edges. ``metrics`` holds
every metric (declared in ``metric_table``).
"""

__version__ = "0.1.0"
