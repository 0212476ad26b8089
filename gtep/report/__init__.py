"""Tables and plots from tracked results."""
