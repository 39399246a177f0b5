"""Serving sessions on Ray Serve (``duplexcadence serve``) and the remote client (``run --engine``).

The client side (:mod:`.client`, :mod:`.protocol`, :mod:`.auth`) needs only ``websockets``; the
server side (:mod:`.deployment` with its per-connection :mod:`.pump`, :mod:`.hosting`,
:mod:`.router`, :mod:`.lockdown` for Ray's ports and authentication, :mod:`.drain` for signals;
the command line is ``engine/cli/serve.py``) needs the ``serve`` extra (``pip install
'duplexcadence[serve]'``: Ray Serve, FastAPI). Nothing here imports Qt.
"""
