"""gtep: the Generalizable Two-phase Evaluation Protocol for continual learning (Cha & Cho)."""

__version__ = "0.1.0"
