"""File listings of partition directories: cached when sealed, live when open; split planning."""
