"""SASL for the metastore's Thrift transport: Kerberos (GSSAPI) and delegation tokens
(DIGEST-MD5), on both sides of the proxy.

The negotiation and the mechanisms are sans-I/O (bytes in, bytes out); :mod:`proxy.sasl.stream`
puts them on asyncio streams.
"""
