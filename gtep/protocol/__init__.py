"""The protocol core: scenarios, sampling, metrics and selection. Pure: stdlib and numpy only."""
