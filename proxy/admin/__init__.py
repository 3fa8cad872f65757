"""The admin port: the gRPC admin API (``idl/admin.proto``) and grpc.health.v1."""
