"""What keeps the metastore up whatever one user or query does.

* :mod:`.calls`: what a call that returns partitions asks for (table, names, filter, cap).
* :mod:`.counts`: about how many partitions it returns, known before it is forwarded.
* :mod:`.answers`: the HMS-shaped errors a refused call is answered with.
* :mod:`.gate`: the one decision before a call goes to the metastore: refused, or sent
  through which lane (small, heavy) as which tenant (user or address).

The queue itself (fair across tenants, heavy calls apart) is the pool's admission
(:mod:`proxy.upstream.admission`); a cache hit never reaches any of this.
"""
