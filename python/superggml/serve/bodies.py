"""The request bodies, validated by pydantic; unknown fields are refused, as wrong types are."""

from __future__ import annotations

from typing import Any, Literal, Optional, Union

from pydantic import BaseModel, ConfigDict, Field

from ..api.fields import MAX_LOGPROBS


class Body(BaseModel):
    model_config = ConfigDict(extra="forbid")
    model: Optional[str] = None
    max_tokens: Optional[int] = Field(default=None, ge=0)
    temperature: float = Field(default=1.0, ge=0.0, le=2.0)
    top_p: float = Field(default=1.0, gt=0.0, le=1.0)
    top_k: int = Field(default=40, ge=0)
    min_p: float = Field(default=0.0, ge=0.0, le=1.0)
    repeat_penalty: float = Field(default=1.0, gt=0.0)
    frequency_penalty: float = Field(default=0.0, ge=-2.0, le=2.0)
    presence_penalty: float = Field(default=0.0, ge=-2.0, le=2.0)
    stop: Optional[Union[str, list[str]]] = None
    seed: Optional[int] = None
    stream: bool = False
    n: int = Field(default=1, ge=1, le=128)
    user: Optional[str] = None
    stream_options: Optional[dict[str, Any]] = None
    # the one constraint on the text: OpenAI's response_format, or llama-server's grammar (GBNF; Lark too) and
    # json_schema, or a regex
    response_format: Optional[dict[str, Any]] = None
    grammar: Optional[str] = None
    json_schema: Optional[dict[str, Any]] = None
    regex: Optional[str] = None
    # llama-server's: start from the longest prefix a slot holds (the first logits then come from a pass of the
    # prompt's tail, which may differ from a whole prompt's in the last bits unless batch_invariant)
    cache_prompt: bool = True


class CompletionBody(Body):
    prompt: Union[str, list[int], list[str], list[list[int]]]
    max_tokens: Optional[int] = Field(default=16, ge=0)
    echo: bool = False
    logprobs: Optional[int] = Field(default=None, ge=0, le=MAX_LOGPROBS)


class ChatMessage(BaseModel):
    model_config = ConfigDict(extra="forbid")
    role: Literal["system", "user", "assistant", "tool", "developer"]
    content: Optional[Union[str, list[dict[str, Any]]]] = None
    name: Optional[str] = None
    tool_calls: Optional[list[dict[str, Any]]] = None  # an assistant's earlier calls
    tool_call_id: Optional[str] = None  # a tool message: the call it answers


class ChatBody(Body):
    messages: list[ChatMessage] = Field(min_length=1)
    logprobs: bool = False
    top_logprobs: Optional[int] = Field(default=None, ge=0, le=MAX_LOGPROBS)
    tools: Optional[list[dict[str, Any]]] = None
    tool_choice: Optional[Union[str, dict[str, Any]]] = None
    parallel_tool_calls: bool = True


class TokenizeBody(BaseModel):
    model_config = ConfigDict(extra="forbid")
    content: str
    add_special: bool = False
    parse_special: bool = True
    with_pieces: bool = False


class SlotBody(BaseModel):
    model_config = ConfigDict(extra="forbid")
    filename: str


class DetokenizeBody(BaseModel):
    model_config = ConfigDict(extra="forbid")
    tokens: list[int]


class EmbeddingBody(BaseModel):
    model_config = ConfigDict(extra="forbid")
    model: Optional[str] = None
    input: Union[str, list[str], list[int], list[list[int]]]
    encoding_format: Literal["float", "base64"] = "float"
    dimensions: Optional[int] = Field(default=None, ge=1)
    user: Optional[str] = None
