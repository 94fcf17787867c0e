"""Free TCP ports on this machine, picked where the kernel does not hand ports out on its own.

A program we start binds the port we give it a moment after we pick it (torchrun's rendezvous store, slurmctld,
slurmd). A port picked by binding port 0 comes from the kernel's ephemeral range
(``/proc/sys/net/ipv4/ip_local_port_range``, 32768-60999 by default), which every outgoing connection and every other
bind to port 0 on the machine draws from too, so in that moment another process can get it and the program fails
with EADDRINUSE (seen when two test sessions ran side by side). A port below that range is only ever taken by a
process that asks for it by number: ``free_port`` and ``free_ports`` pick random ones there.
"""

from __future__ import annotations

import contextlib
import secrets
import socket

EPHEMERAL_RANGE = "/proc/sys/net/ipv4/ip_local_port_range"  # Linux: the ports the kernel hands out by itself
FREE_PORT_LOW = 20000  # the lowest port picked: above the well-known services' usual ports
LOOPBACK = "127.0.0.1"


def ephemeral_ports() -> tuple[int, int] | None:
    """The kernel's ephemeral port range, (low, high) inclusive, or ``None`` where it cannot be read (not Linux)."""
    try:
        with open(EPHEMERAL_RANGE) as f:
            low, high = map(int, f.read().split())
    except (OSError, ValueError):
        return None
    return low, high


def free_ports(count: int, host: str = LOOPBACK, tries: int = 64) -> list[int]:
    """``count`` distinct TCP ports on ``host`` that are free now and that the kernel does not hand out on its own.

    Each is a random port from ``FREE_PORT_LOW`` up to the ephemeral range's start that binds now; all of them stay
    bound until the last is found, so they differ. Where there is no room below the range, or ``tries`` random ports
    in a row were taken, the kernel's choice (port 0) is used for that port.

    Args:
        count: ports wanted (>= 1).
        host: the address the ports must be free on.
        tries: random ports tried per port before falling back to port 0 (count).

    Returns:
        The port numbers, ``count`` of them, distinct.

    Raises:
        ValueError: ``count`` < 1.
    """
    if count < 1:
        raise ValueError(f"count must be >= 1, got {count}")
    span = ephemeral_ports()
    room = span is not None and span[0] > FREE_PORT_LOW
    with contextlib.ExitStack() as held:
        ports: list[int] = []
        while len(ports) < count:
            for _try in range(tries if room else 0):
                s = held.enter_context(socket.socket(socket.AF_INET, socket.SOCK_STREAM))
                try:
                    s.bind((host, FREE_PORT_LOW + secrets.randbelow(span[0] - FREE_PORT_LOW)))
                except OSError:
                    continue
                break
            else:
                s = held.enter_context(socket.socket(socket.AF_INET, socket.SOCK_STREAM))
                s.bind((host, 0))
            ports.append(s.getsockname()[1])
        return ports


def free_port(host: str = LOOPBACK, tries: int = 64) -> int:
    """One TCP port on ``host`` that is free now and that the kernel does not hand out on its own (``free_ports``).

    Args:
        host: the address the port must be free on.
        tries: random ports to try below the ephemeral range before falling back to port 0 (count).

    Returns:
        The port number.
    """
    return free_ports(1, host, tries)[0]
