"""rgb-serve: any rgb model behind an OpenAI-compatible endpoint. What it is asked: rgb.serve.request
(`ServeRequest`, plain Python, read by the command's schema without the `[serve]` extra); the server and its routes:
rgb.serve.app; the chat-completions protocol: rgb.serve.protocol; limits, faults, logs and metrics:
rgb.serve.operations; the Files and Batches endpoints: rgb.serve.batch; `python -m rgb.serve`: rgb.serve.__main__.
An entry room: the command layer (rgb.commands.serve) imports it; only its `__main__` door imports the command.
The server's names load on first use (FastAPI, uvicorn and torch with them)."""

from rgb.serve.request import Faults, Limits, ServeError, ServeRequest

__all__ = ["MALFORMED_ANSWER", "Faults", "Limits", "ModelServer", "ServeError", "ServeRequest", "make_server"]


def __getattr__(name: str):
    if name in ("ModelServer", "make_server"):
        from rgb.serve import app

        return getattr(app, name)
    if name == "MALFORMED_ANSWER":
        from rgb.serve import protocol

        return protocol.MALFORMED_ANSWER
    raise AttributeError(f"module 'rgb.serve' has no attribute {name!r}")
