"""GGUF tokenizers with llama.cpp's tokenization, token for token."""

from .tokenizer import Tokenizer
from .vocab import TokenAttr, TokenType

__all__ = ["Tokenizer", "TokenAttr", "TokenType"]
