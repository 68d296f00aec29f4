"""The loopback harness's own helpers (harness/loopback.py), fast."""

from __future__ import annotations

import socket

import pytest

from harness import loopback
from harness.loopback import ephemeral_range, free_ports


def _bindable(port: int) -> bool:
    with socket.socket() as s:
        try:
            s.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


def test_ports_handed_out_lie_outside_the_range_outgoing_connections_take() -> None:
    """A port is bound only later by the process it is handed to; an outgoing
    connection's source port is drawn from the ephemeral range, so none is there."""
    low, high = ephemeral_range()
    ports = free_ports(40) + free_ports(40)
    assert len(set(ports)) == 80  # never the same port twice in a process
    assert not [p for p in ports if low <= p <= high]
    assert all(p >= loopback.PORTS_FROM and _bindable(p) for p in ports)


def test_a_port_in_use_is_not_handed_out(monkeypatch: pytest.MonkeyPatch) -> None:
    with socket.socket() as held:
        held.bind(("127.0.0.1", 0))
        held.listen()
        taken = held.getsockname()[1]
        (free,) = free_ports(1)
        # the only candidates left: the port in use and the free one
        monkeypatch.setattr(loopback, "ephemeral_range", lambda: (0, 0))
        monkeypatch.setattr(loopback, "PORTS_FROM", 1024)
        monkeypatch.setattr(loopback, "_handed_out", set(range(1024, 65536)) - {taken, free})
        with pytest.raises(OSError, match="no 2 free TCP ports"):
            free_ports(2)
        assert free_ports(1) == [free]


def test_with_no_room_outside_the_ephemeral_range_the_kernel_picks(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(loopback, "ephemeral_range", lambda: (1024, 65535))
    ports = free_ports(3)
    assert len(set(ports)) == 3 and all(_bindable(p) for p in ports)
