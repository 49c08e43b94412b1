"""Metrics files (Model(metrics_file=...), --metrics-file) read back: every JSON line validated against the
shipped schema (superggml.metrics.schema)."""

from __future__ import annotations

import json

import jsonschema

from superggml.metrics import schema


def valid_lines(path) -> list[dict]:
    """A metrics file's lines, each validated against the shipped schema."""
    lines = [json.loads(x) for x in path.read_text().splitlines()]
    validator = jsonschema.Draft202012Validator(schema())
    for line in lines:
        validator.validate(line)
    return lines
