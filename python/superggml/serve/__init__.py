"""`superggml serve`: an OpenAI-compatible HTTP API over one Model (FastAPI + uvicorn).

Endpoints: GET /health, GET /v1/models, POST /v1/completions, POST
/v1/chat/completions (both with "stream": true as server-sent events ending
in "data: [DONE]"; logprobs, structured output, tools), POST /v1/embeddings,
POST /tokenize and /detokenize (llama-server's shapes), GET /metrics (Prometheus' text format) and GET
/v1/stats (the metrics snapshot as JSON). With API keys, every route but /health needs
`Authorization: Bearer <key>` (serve/keys.py).

One engine thread owns the model and batches continuously: each step is one
eval (shared forward passes) over the next token of every running request
plus prompt chunks of new ones, up to `batch_tokens` tokens. Up to
`parallel` sequences run at once, each with its own K/V (pages of the paged
KV cache, or storage of its own); /v1/completions takes prompt lists and n.
Requests wait in a bounded queue (503 when it is full). A client that
disconnects has its generation cancelled and its sequences freed; the
others in the pass go on. Errors use OpenAI's JSON shape with the right
status.
"""

from ..errors import require_extra

require_extra("server", "superggml's server")
from .app import create_app, serve  # noqa: E402

__all__ = ["create_app", "serve"]
