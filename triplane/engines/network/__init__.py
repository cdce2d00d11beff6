"""Network engines move packets and tiles between nodes."""
