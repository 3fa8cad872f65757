"""tests.rig.ports: each pytest-xdist worker picks ports in a slice of its own, below the
kernel's ephemeral range (where client connections take their local ports)."""

from __future__ import annotations

import socket

import pytest

from tests.rig import ports

# The two worker slices need room below the ephemeral range (32768 on Linux by default).
roomy = pytest.mark.skipif(
    ports._ephemeral_start() - ports.LOWEST < 2 * (ports.CLUSTER_BUS_OFFSET + 1000),
    reason="this machine's ephemeral port range starts too low for slices",
)


def slice_of(monkeypatch: pytest.MonkeyPatch, worker: str, count: int) -> range:
    monkeypatch.setenv("PYTEST_XDIST_WORKER", worker)
    monkeypatch.setenv("PYTEST_XDIST_WORKER_COUNT", str(count))
    return ports._slice()


@roomy
def test_workers_have_slices_of_their_own_below_the_ephemeral_range(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    first, second = slice_of(monkeypatch, "gw0", 2), slice_of(monkeypatch, "gw1", 2)
    assert len(first) > 1000 and len(second) > 1000
    assert first.stop <= second.start  # no port in both
    assert first.start >= ports.LOWEST and second.stop <= ports._ephemeral_start()
    monkeypatch.delenv("PYTEST_XDIST_WORKER")
    monkeypatch.delenv("PYTEST_XDIST_WORKER_COUNT")
    alone = ports._slice()
    assert alone.start == ports.LOWEST and alone.stop <= ports._ephemeral_start()


@roomy
def test_ports_come_from_the_workers_slice_and_are_distinct(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    mine = slice_of(monkeypatch, "gw1", 2)
    assert ports.free_port() in mine
    chosen = ports.free_ports(5)
    assert len(set(chosen)) == 5 and all(p in mine for p in chosen)
    cluster = ports.free_port(below=65536 - 10000)
    assert cluster in mine and cluster + ports.CLUSTER_BUS_OFFSET in mine  # its bus port too
    again = [ports.free_port() for _ in range(20)]
    assert len(set(again + chosen + [cluster])) == 26  # none given twice (none bound yet)


def test_a_port_with_a_listener_on_any_address_is_not_free() -> None:
    with socket.socket(socket.AF_INET6) as listener:
        listener.bind(("::1", 0))  # IPv6 loopback only: a wildcard bind still conflicts
        listener.listen()
        assert not ports._free(listener.getsockname()[1])
    with socket.socket() as listener:
        listener.bind(("127.0.0.1", 0))
        listener.listen()
        assert not ports._free(listener.getsockname()[1])


def test_a_machine_with_no_room_below_its_ephemeral_range_gets_the_kernels_ports(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(ports, "_ephemeral_start", lambda: ports.LOWEST + 10)
    assert len(ports._slice()) < 100
    assert ports.free_port() > 0
    assert len(set(ports.free_ports(3))) == 3
