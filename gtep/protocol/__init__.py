"""The protocol core: scenarios, sampling, metrics and selection, and the scenario families
(gtep/protocol/families/). Pure: stdlib and numpy only."""
