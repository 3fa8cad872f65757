"""hms-cache-proxy."""
