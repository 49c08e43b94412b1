"""The runtime's third floor: what each sequence keeps between passes (K/V, recurrent states), one kind per file."""
