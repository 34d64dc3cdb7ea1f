"""rgb-serve: any rgb model behind an OpenAI-compatible endpoint (the app: rgb.serve.app; its Files and Batches
endpoints: rgb.serve.batch; `python -m rgb.serve`: rgb.serve.__main__). An entry room: the command layer
(rgb.commands.serve) imports it, never the other way."""

from rgb.serve.app import MALFORMED_ANSWER, Faults, Limits, ModelServer, ServeError, make_server

__all__ = ["MALFORMED_ANSWER", "Faults", "Limits", "ModelServer", "ServeError", "make_server"]
