"""JSON messages over a ``SOCK_SEQPACKET`` socket, one datagram each: what the sandbox's zygote
and the step server say to the processes they fork for (:mod:`assay.verify.sandbox.zygote`,
:mod:`assay.stepserver`). A peer that is gone reads as an empty message, never as an error:
both sides treat silence as the end of the other."""

from __future__ import annotations

import json
import socket


def recv(sock: socket.socket, max_bytes: int) -> dict:
    """The next message; ``{}`` at the end of the connection or for anything that is not one."""
    try:
        data = sock.recv(max_bytes)
        return json.loads(data) if data else {}
    except (OSError, ValueError):
        return {}


def send(sock: socket.socket, **msg) -> None:
    """Send ``msg``; nothing where the peer stopped listening (it ended, or gave up)."""
    try:
        sock.send(json.dumps(msg).encode())
    except OSError:
        pass
