"""The OpenAI surface: completions, chat and embeddings in OpenAI's shapes, choices, tools, chat templates."""
