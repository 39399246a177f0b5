"""A stand-in for the server side of one WebSocket (starlette's), for tests that drive the server's pump
without a network: it hands out the client's messages in order, keeps what the server sent and how it closed."""
from __future__ import annotations

import asyncio


class FakeWs:
    """The server side of one WebSocket: the client's messages in order, what the server sent."""

    def __init__(self, messages):
        from starlette.websockets import WebSocketState
        self.application_state = WebSocketState.CONNECTED
        self.messages, self.sent, self.closed = list(messages), [], None

    async def receive(self):
        if self.messages:
            return self.messages.pop(0)
        await asyncio.sleep(3600)            # the client says nothing more: the server's own clock decides

    async def send_bytes(self, data):
        self.sent.append(data)

    async def send_text(self, text):
        self.sent.append(text)

    async def close(self, code=1000, reason=""):
        from starlette.websockets import WebSocketState
        self.closed = (code, reason)
        self.application_state = WebSocketState.DISCONNECTED
