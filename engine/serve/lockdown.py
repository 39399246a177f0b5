"""Ray locked down for ``duplexcadence serve``: loopback ports, token authentication, nothing else open.

A local Ray (no ``--address``) is started so that nothing of it can be reached from another
machine, whatever ``--host`` the session endpoint listens on:

* **every Ray port on loopback.** Ray's gRPC servers (GCS, raylet, object manager, every worker)
  bind ``127.0.0.1`` only when the node's IP address *is* ``127.0.0.1``; ``ray.init`` replaces a
  loopback node address with the machine's own IP unless ``RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER=0``
  (the single-machine mode), so that is set along with ``_node_ip_address="127.0.0.1"``. The
  dashboard is off; the dashboard agent, its metrics export and the runtime-env agent listen on
  the node IP, i.e. loopback too. Only the Serve proxy listens on ``--host``.
* **token authentication on** (``RAY_AUTH_MODE=token``, Ray >= 2.60): a fresh random token in
  ``RAY_AUTH_TOKEN`` for this Ray only (inherited by its processes, written nowhere), so even a
  program on this machine cannot talk to the GCS without it.

Joining a cluster (``--address``) keeps the cluster's own ports; token authentication is still
required there: the cluster's token comes from ``RAY_AUTH_TOKEN``, ``RAY_AUTH_TOKEN_PATH`` or
``~/.ray/auth_token``, as Ray reads it.
"""
from __future__ import annotations

import ipaddress
import os
import re
import secrets
import socket
from typing import Any, Dict, MutableMapping, Optional

LOOPBACK = "127.0.0.1"
#: the oldest Ray whose token authentication this module relies on (``RAY_AUTH_MODE=token``)
MIN_RAY = (2, 60)

_HOSTNAME = re.compile(r"^(?=.{1,253}$)([A-Za-z0-9]([A-Za-z0-9-]{0,61}[A-Za-z0-9])?)(\.[A-Za-z0-9]([A-Za-z0-9-]{0,61}"
                       r"[A-Za-z0-9])?)*\.?$")


def check_host(host: str, port: int) -> Optional[str]:
    """None when ``host`` is an IP address or a resolvable host name this machine can listen on at
    ``port``; else one sentence saying what is wrong (checked before Ray starts)."""
    text = str(host or "").strip()
    try:
        ipaddress.ip_address(text)
    except ValueError:
        if not _HOSTNAME.match(text):
            return (f"--host {host!r} is not an IP address or a host name: give the address to listen on, "
                    "for example 127.0.0.1 (this machine only) or 0.0.0.0 (every interface)")
    try:
        infos = socket.getaddrinfo(text, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)
    except (socket.gaierror, UnicodeError, OSError) as e:
        return f"--host {host!r} does not resolve to an address of this machine ({e}): give an IP address"
    return _try_bind(host, port, infos)


def _try_bind(host: str, port: int, infos) -> Optional[str]:
    family, _, _, _, addr = infos[0]
    try:
        with socket.socket(family, socket.SOCK_STREAM) as s:
            s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            s.bind(addr)
    except OSError as e:
        why = e.strerror or str(e)
        hint = ("another program listens there: choose another --port" if e.errno == 98
                else "give an address of this machine (see `ip addr`)")
        return f"cannot listen on {host} port {port}: {why} — {hint}"
    return None


def ray_version_ok(version: str) -> bool:
    """Whether the installed Ray's version is at least :data:`MIN_RAY`."""
    parts = re.findall(r"\d+", version)[:2]
    return len(parts) == 2 and (int(parts[0]), int(parts[1])) >= MIN_RAY


def lock_environment(local: bool, environ: Optional[MutableMapping[str, str]] = None) -> None:
    """Set the ``RAY_`` environment before Ray is imported (its constants are read at import).

    ``local``: a Ray this process starts (loopback, a fresh token); else a cluster it joins (token
    authentication required, the cluster's token as Ray finds it).
    """
    env = os.environ if environ is None else environ
    env["RAY_USAGE_STATS_ENABLED"] = "0"              # no network beyond the cluster
    env["RAY_AUTH_MODE"] = "token"
    if local:
        env["RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER"] = "0"   # keeps the node address 127.0.0.1 (see above)
        env["RAY_AUTH_TOKEN"] = secrets.token_hex(32)
        env.pop("RAY_AUTH_TOKEN_PATH", None)
        env.pop("RAY_ADDRESS", None)                      # never join a Ray found by accident


def init_options(address: Optional[str]) -> Dict[str, Any]:
    """``ray.init`` keyword arguments: a loopback-only local Ray, or a cluster to join."""
    opts: Dict[str, Any] = dict(include_dashboard=False, log_to_driver=False, logging_level="WARNING",
                                configure_logging=True)
    if address:
        opts["address"] = address
    else:
        opts.update(address="local", _node_ip_address=LOOPBACK, dashboard_host=LOOPBACK)
    return opts


def bind_replica_grpc_to_node() -> bool:
    """Keep a Serve replica's own gRPC server on this node's address (loopback for a local Ray).

    Ray Serve 2.60 starts, in every replica, an inter-deployment gRPC server on ``[::]:0``: every
    interface, whatever the node's address, with no setting to change it. Called in the replica
    before Serve starts that server, this rebinds it to the node's IP (where Serve's callers reach
    it anyway). Returns whether the rebinding is in place.
    """
    try:
        import ray
        from ray.serve._private import replica as serve_replica
    except ImportError:
        return False
    original = getattr(serve_replica, "add_port_to_grpc_server", None)
    if original is None:
        return False
    if getattr(original, "bound_to_node", False):
        return True
    ip = ray.util.get_node_ip_address()
    host = f"[{ip}]" if ":" in ip else ip

    def add_port(server, address: str):
        if address.startswith("[::]:") or address.startswith("0.0.0.0:"):
            address = f"{host}:{address.rsplit(':', 1)[1]}"
        return original(server, address)
    add_port.bound_to_node = True
    serve_replica.add_port_to_grpc_server = add_port
    return True


def join_hint(address: str) -> str:
    """What to do when joining ``address`` fails on authentication."""
    return (f"the Ray cluster at {address} needs its token: set RAY_AUTH_TOKEN_PATH to the cluster's token file "
            "(or RAY_AUTH_TOKEN); `duplexcadence serve` joins only clusters with token authentication on")
