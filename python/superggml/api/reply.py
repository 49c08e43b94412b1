"""OpenAI's response shapes for completions and chat completions, built as a request's choices advance.

One Reply per request, for Model.create_completion / create_chat_completion and for the server alike: the
stream chunks of each piece of text (tagged with its choice's index), then the one response with every
choice's text, finish reason and the token usage.
"""

from __future__ import annotations

import time
import uuid
from typing import TYPE_CHECKING, Any, Callable, Sequence

if TYPE_CHECKING:
    from .tools import ToolCall, ToolRequest

Entry = tuple[int, "float | None", "list[tuple[int, float]]"]  # token, its logprob (None: a prompt's first), top


class Reply:
    """A request's n_choices choices in OpenAI's shapes: text_completion or chat.completion(.chunk).
    echo: text each choice starts with (completions' echo: its prompt), or none."""

    def __init__(
        self,
        *,
        chat: bool,
        stream: bool,
        model: str,
        n_choices: int,
        n_prompt: int,
        echo: Sequence[str] | None = None,
        token_bytes: Callable[[int], bytes] | None = None,
        prompt_logprobs: Sequence[Sequence[Entry]] | None = None,
        tools: "ToolRequest | None" = None,
    ):
        """token_bytes (a token's bytes): report logprobs (the entries chunk() is given; prompt_logprobs: each
        choice's echoed prompt's, completions only). tools (chat): the calls in each reply are parsed out and
        given as tool_calls (content is sent while it cannot be the start of a call)."""
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
        self.token_bytes = token_bytes
        self.prompt_lp = [list(x) for x in prompt_logprobs] if prompt_logprobs else [[] for _ in range(n_choices)]
        self.lps: list[list[Entry]] = [[] for _ in range(n_choices)]  # each choice's generated tokens'
        self.offset = [len(e) for e in self.echo]  # text offset of its next token
        self.streams = [tools.stream() for _ in range(n_choices)] if tools is not None and tools.active else None
        self.calls: list[list[ToolCall]] = [[] for _ in range(n_choices)]
        self.content: list[str | None] = [None] * n_choices  # a reply with calls: its content

    # -- logprobs, in OpenAI's shapes ------------------------------------------
    def _text(self, tok: int) -> str:
        assert self.token_bytes is not None
        return self.token_bytes(tok).decode("utf-8", errors="replace")

    def _completion_lp(self, entries: Sequence[Entry], offset: int) -> dict[str, Any]:
        tokens, offsets, lps, tops = [], [], [], []
        for tok, lp, top in entries:
            t = self._text(tok)
            tokens.append(t)
            offsets.append(offset)
            offset += len(t)
            lps.append(lp)
            tops.append(None if lp is None else {**{self._text(i): x for i, x in top}, t: lp})
        return {"tokens": tokens, "text_offset": offsets, "token_logprobs": lps, "top_logprobs": tops}

    def _chat_lp(self, entries: Sequence[Entry]) -> dict[str, Any]:
        def one(tok: int, lp: float | None) -> dict[str, Any]:
            assert self.token_bytes is not None
            b = self.token_bytes(tok)
            return {"token": b.decode("utf-8", errors="replace"), "logprob": lp, "bytes": list(b)}

        return {
            "content": [{**one(tok, lp), "top_logprobs": [one(i, x) for i, x in top]} for tok, lp, top in entries],
            "refusal": None,
        }

    def _lp(self, index: int, entries: Sequence[Entry] | None, offset: int) -> dict[str, Any] | None:
        if self.token_bytes is None or entries is None:
            return None
        return self._chat_lp(entries) if self.chat else self._completion_lp(entries, offset)

    def _head(self, obj: str) -> dict[str, Any]:
        return {"id": self.id, "object": obj, "created": self.created, "model": self.model}

    def _chunk(
        self,
        index: int,
        piece: str,
        finish: str | None,
        lp: dict[str, Any] | None = None,
        calls: Sequence["ToolCall"] = (),
    ) -> dict[str, Any]:
        if not self.chat:
            return {
                **self._head("text_completion"),
                "choices": [{"text": piece, "index": index, "logprobs": lp, "finish_reason": finish}],
            }
        delta: dict[str, Any] = {"role": "assistant"} if self.first[index] else {}
        self.first[index] = False
        if piece:
            delta["content"] = piece
        if calls:
            delta["tool_calls"] = [c.openai(i) for i, c in enumerate(calls)]
        return {
            **self._head("chat.completion.chunk"),
            "choices": [{"index": index, "delta": delta, "logprobs": lp, "finish_reason": finish}],
        }

    def opening(self) -> list[dict[str, Any]]:
        """The stream's first chunks: each choice's echoed text (none without echo)."""
        return (
            [self._chunk(i, e, None, self._lp(i, self.prompt_lp[i] or None, 0)) for i, e in enumerate(self.echo) if e]
            if self.stream
            else []
        )

    def chunk(
        self, index: int, piece: str, finish: str | None, used: int, logprobs: Sequence[Entry] | None = None
    ) -> dict[str, Any] | None:
        """Records a piece of choice `index` (its text so far, finish reason, tokens generated, the logprob
        entries of the tokens since its last piece); returns its stream chunk (None: nothing to send yet, or
        not streaming)."""
        if self.streams is not None:
            st = self.streams[index]
            piece = st.feed(piece)
            if finish:
                rest, calls, whole = st.end()
                piece += rest
                if calls:
                    finish = "tool_calls"
                    self.calls[index], self.content[index] = calls, whole
        self.texts[index] += piece
        self.finish[index] = finish
        self.used[index] = used
        entries = list(logprobs or [])
        self.lps[index] += entries
        offset = self.offset[index]
        if self.token_bytes is not None:
            self.offset[index] += sum(len(self._text(t)) for t, _, _ in entries)
        if not self.stream or not (piece or finish or entries):
            return None
        return self._chunk(index, piece, finish, self._lp(index, entries, offset), self.calls[index] if finish else ())

    def usage(self) -> dict[str, int]:
        n = sum(self.used)
        return {"prompt_tokens": self.n_prompt, "completion_tokens": n, "total_tokens": self.n_prompt + n}

    def usage_chunk(self) -> dict[str, Any]:
        """A stream's last chunk with stream_options.include_usage (OpenAI's): no choices, the usage."""
        obj = "chat.completion.chunk" if self.chat else "text_completion"
        return {**self._head(obj), "choices": [], "usage": self.usage()}

    def final(self) -> dict[str, Any]:
        """The whole response (not streaming): every choice and the usage."""
        usage = self.usage()
        finish = [f or "length" for f in self.finish]
        if not self.chat:
            return {
                **self._head("text_completion"),
                "usage": usage,
                "choices": [
                    {
                        "text": t,
                        "index": i,
                        "finish_reason": f,
                        "logprobs": self._lp(
                            i, self.prompt_lp[i] + self.lps[i], 0 if self.prompt_lp[i] else len(self.echo[i])
                        ),
                    }
                    for i, (t, f) in enumerate(zip(self.texts, finish))
                ],
            }
        return {
            **self._head("chat.completion"),
            "usage": usage,
            "choices": [
                {
                    "index": i,
                    "message": self._message(i, t),
                    "logprobs": self._lp(i, self.lps[i], 0),
                    "finish_reason": f,
                }
                for i, (t, f) in enumerate(zip(self.texts, finish))
            ],
        }

    def _message(self, i: int, text: str) -> dict[str, Any]:
        if not self.calls[i]:
            return {"role": "assistant", "content": text}
        return {"role": "assistant", "content": self.content[i], "tool_calls": [c.openai() for c in self.calls[i]]}
