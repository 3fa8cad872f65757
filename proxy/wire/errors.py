"""Errors raised by the sans-I/O wire code."""


class ProtocolError(Exception):
    """The bytes are not a well-formed Thrift message (or break a configured limit)."""


class MessageTooLarge(ProtocolError):
    """A message is larger than the configured maximum for its direction."""


class LimitExceeded(ProtocolError):
    """A declared length would carry a struct past the limit its scanner was given."""
