"""The runtime's second floor: where the weights live (placement, pagers, memory pressure, expert routing)."""
