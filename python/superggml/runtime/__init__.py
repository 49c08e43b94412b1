"""The runtime: forward passes over paged weights and sequence memory."""
