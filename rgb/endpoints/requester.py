"""What the two paths that ask an endpoint (rgb.endpoints.online, one request per image; rgb.endpoints.batch, the
Batch API) read of a model: rgb.models.chat.ChatClassifier is one. Both drive the same requester, so a request and
its cache record are the same whichever path asked."""

from __future__ import annotations

from typing import Protocol

from rgb.endpoints.client import Endpoint
from rgb.endpoints.settings import ClientSettings


class Requester(Protocol):
    """The request of an image, the endpoint and client settings to send it with, its token estimate, how to
    read an answer (cut by the token limit: asked again, never cached; or naming no class), and its text fallback
    when the endpoint refuses the response format asked for."""

    client_settings: ClientSettings
    endpoint: Endpoint

    def body(self, image: bytes) -> dict: ...

    def cut(self, record: dict) -> bool: ...

    def unparsed(self, record: dict) -> bool: ...

    def estimate(self, image: bytes) -> tuple[int, int]: ...

    def completion_limit(self) -> int | None: ...

    def retry_body(self, body: dict) -> dict | None: ...

    def fall_back_to_text(self) -> bool: ...

    def format_note(self, body: dict) -> dict: ...

    def clarification(self, body: dict, reply: dict) -> tuple[dict, int] | None: ...
