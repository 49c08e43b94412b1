"""The OpenAI surface: completions, chat and embeddings in OpenAI's shapes, their request fields, tools, chat
templates."""
