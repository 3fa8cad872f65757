"""Ports for the rig's servers.

Chosen at random below the kernel's ephemeral range, where no client connection takes its
local port (the suite opens thousands), each pytest-xdist worker in a slice of its own, so
two workers never pick the same port in the seconds before a server binds it. Outside
that range's reach (a machine whose ephemeral range starts low), the kernel picks, as
``bind(0)`` does."""

from __future__ import annotations

import collections
import os
import random
import socket
import time

LOWEST = 10_000  # (well above the machine's own services' well-known ports)
CLUSTER_BUS_OFFSET = 10_000  # a Redis Cluster node's bus port is its port + this

# No state to be reseeded (hypothesis reseeds the global random for every example).
_random = random.SystemRandom()
# Ports this process gave out lately: not given again before their server has bound them.
_given: collections.deque[int] = collections.deque(maxlen=512)


def _ephemeral_start() -> int:
    try:
        with open("/proc/sys/net/ipv4/ip_local_port_range") as f:
            return int(f.read().split()[0])
    except (OSError, ValueError, IndexError):
        return 32768  # Linux's default


def _slice() -> range:
    """This process's ports: its worker's share of [LOWEST, the ephemeral range)."""
    worker = os.environ.get("PYTEST_XDIST_WORKER", "gw0")
    index = int(worker[2:]) if worker[2:].isdigit() else 0
    workers = max(1, int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1") or 1))
    size = (_ephemeral_start() - LOWEST) // workers
    start = LOWEST + (index % workers) * size
    return range(start, start + max(0, size))


def _candidates(ours: range) -> list[int]:
    if len(ours) < 100:
        return []
    return [p for p in _random.sample(ours, min(len(ours), 200)) if p not in _given]


def _give(port: int) -> int:
    _given.append(port)
    return port


def _kernel_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def free_port(below: int = 65536) -> int:
    """A port nothing listens on now; ``below``: a Redis Cluster node's, whose bus port
    (+10000) must be free too, and in this worker's slice as well (so picked from its
    slice's lower part)."""
    cluster = below < 65536
    ours = _slice()
    if cluster:
        ours = range(ours.start, min(ours.stop - CLUSTER_BUS_OFFSET, below))
    for port in _candidates(ours):
        if _free(port) and (not cluster or _free(port + CLUSTER_BUS_OFFSET)):
            return _give(port)
    while True:
        port = _kernel_port()
        if port < below and _free(port + CLUSTER_BUS_OFFSET if cluster else port):
            return _give(port)


def free_ports(count: int) -> list[int]:
    """``count`` different ports nothing listens on now."""
    chosen: list[int] = []
    for port in _candidates(_slice()):
        if len(chosen) == count:
            break
        if port not in chosen and _free(port):
            chosen.append(port)
    if len(chosen) == count:
        return [_give(port) for port in chosen]
    # The kernel's: held open together while they are chosen, so that no two are the same.
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
    """Whether ``port`` can be bound on every address (the metastores listen on all): a
    dual-stack wildcard bind conflicts with any listener on it, IPv4 or IPv6."""
    try:
        probe = socket.socket(socket.AF_INET6)
        probe.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 0)
        address: tuple[str, int] = ("::", port)
    except OSError:  # (no IPv6 here)
        probe = socket.socket()
        address = ("0.0.0.0", port)
    with probe:
        try:
            probe.bind(address)
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
