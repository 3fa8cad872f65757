"""A client connection: its state machine (sans-I/O) and the protocol that does its I/O."""
