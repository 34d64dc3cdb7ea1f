"""The chat-completions protocol, apart from any model: the endpoint client (retries, rate limits, the request
budget), the answer cache, the prices, the Batch path and the answer parser. It imports rgb.core only; the model
family that classifies images through it is rgb.models.chat, the evaluation's view of it
rgb.evaluation.endpoint_eval."""
