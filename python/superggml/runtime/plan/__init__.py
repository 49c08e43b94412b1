"""The runtime's first floor: what a load decides once (devices, the memory plan, measured costs)."""
