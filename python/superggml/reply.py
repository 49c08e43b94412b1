"""OpenAI's response shapes for completions and chat completions, built as a request's choices advance.

One Reply per request, for Model.create_completion / create_chat_completion and for the server alike: the
stream chunks of each piece of text (tagged with its choice's index), then the one response with every
choice's text, finish reason and the token usage.
"""

from __future__ import annotations

import time
import uuid
from typing import Any, Sequence


class Reply:
    """A request's n_choices choices in OpenAI's shapes: text_completion or chat.completion(.chunk).
    echo: text each choice starts with (completions' echo: its prompt), or none."""

    def __init__(self, *, chat: bool, stream: bool, model: str, n_choices: int, n_prompt: int,
                 echo: Sequence[str] | None = None):
        self.chat, self.stream, self.model = chat, stream, model
        self.id = f"{'chatcmpl' if chat else 'cmpl'}-{uuid.uuid4()}"
        self.created = int(time.time())
        self.echo = list(echo) if echo is not None else [""] * n_choices
        if len(self.echo) != n_choices:
            raise ValueError(f"echo has {len(self.echo)} texts for {n_choices} choices")
        self.texts = list(self.echo)
        self.finish: list[str | None] = [None] * n_choices
        self.used = [0] * n_choices
        self.first = [True] * n_choices
        self.n_prompt = n_prompt

    def _head(self, obj: str) -> dict[str, Any]:
        return {"id": self.id, "object": obj, "created": self.created, "model": self.model}

    def _chunk(self, index: int, piece: str, finish: str | None) -> dict[str, Any]:
        if not self.chat:
            return {**self._head("text_completion"),
                    "choices": [{"text": piece, "index": index, "logprobs": None, "finish_reason": finish}]}
        delta: dict[str, Any] = {"role": "assistant"} if self.first[index] else {}
        self.first[index] = False
        if piece:
            delta["content"] = piece
        return {**self._head("chat.completion.chunk"),
                "choices": [{"index": index, "delta": delta, "finish_reason": finish}]}

    def opening(self) -> list[dict[str, Any]]:
        """The stream's first chunks: each choice's echoed text (none without echo)."""
        return [self._chunk(i, e, None) for i, e in enumerate(self.echo) if e] if self.stream else []

    def chunk(self, index: int, piece: str, finish: str | None, used: int) -> dict[str, Any] | None:
        """Records a piece of choice `index` (its text so far, finish reason, tokens generated); returns its
        stream chunk (None: nothing to send yet, or not streaming)."""
        self.texts[index] += piece
        self.finish[index] = finish
        self.used[index] = used
        if not self.stream or not (piece or finish):
            return None
        return self._chunk(index, piece, finish)

    def final(self) -> dict[str, Any]:
        """The whole response (not streaming): every choice and the usage."""
        n = sum(self.used)
        usage = {"prompt_tokens": self.n_prompt, "completion_tokens": n, "total_tokens": self.n_prompt + n}
        finish = [f or "length" for f in self.finish]
        if not self.chat:
            return {**self._head("text_completion"), "usage": usage,
                    "choices": [{"text": t, "index": i, "logprobs": None, "finish_reason": f}
                                for i, (t, f) in enumerate(zip(self.texts, finish))]}
        return {**self._head("chat.completion"), "usage": usage,
                "choices": [{"index": i, "message": {"role": "assistant", "content": t}, "finish_reason": f}
                            for i, (t, f) in enumerate(zip(self.texts, finish))]}
