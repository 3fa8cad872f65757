"""The test rig: real servers (Hive Metastore, Redis, the proxy itself) started by tests."""
