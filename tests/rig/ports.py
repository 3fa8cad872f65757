from __future__ import annotations

import socket
import time


def free_port(below: int = 65536) -> int:
    """A port nothing listens on now (and, for Redis Cluster, whose bus port +10000 fits)."""
    while True:
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = int(s.getsockname()[1])
        if port < below and _free(port + 10000 if below < 65536 else port):
            return port


def free_ports(count: int) -> list[int]:
    """``count`` different ports nothing listens on now: held open together while they are
    chosen, so that no two are the same (``free_port`` twice can give one port twice)."""
    held: list[socket.socket] = []
    try:
        for _ in range(count):
            s = socket.socket()
            held.append(s)
            s.bind(("127.0.0.1", 0))
        return [int(s.getsockname()[1]) for s in held]
    finally:
        for s in held:
            s.close()


def _free(port: int) -> bool:
    with socket.socket() as s:
        try:
            s.bind(("127.0.0.1", port))
        except OSError:
            return False
        return True


def wait_for_port(port: int, timeout: float, host: str = "127.0.0.1", alive=lambda: True) -> None:
    """Wait until something accepts on ``port``; ``alive`` says whether to keep waiting."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if not alive():
            raise RuntimeError(f"process died before listening on {port}")
        try:
            with socket.create_connection((host, port), timeout=0.5):
                return
        except OSError:
            time.sleep(0.05)
    raise TimeoutError(f"nothing listening on {host}:{port} after {timeout} s")
