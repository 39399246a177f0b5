"""Serving sessions on Ray Serve (``duplexcadence serve``) and the remote client (``run --engine``).

The client side (:mod:`.client`, :mod:`.protocol`, :mod:`.auth`) needs only ``websockets``; the
server side (:mod:`.deployment`, :mod:`.router`, :mod:`.cli`) needs the ``serve`` extra
(``pip install 'duplexcadence[serve]'``: Ray Serve, FastAPI). Nothing here imports Qt.
"""
