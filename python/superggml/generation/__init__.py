"""Generation: decoding, the batch scheduler, speculative decoding, sampling and constraints."""
