"""What every module of gtep.config builds on: the one error a bad field raises, and the strict model base."""
from __future__ import annotations

from pydantic import BaseModel, ConfigDict


class ConfigError(ValueError):
    """One bad field: `field: what is wrong; how to fix it`."""

    def __init__(self, field: str, message: str) -> None:
        super().__init__(f"{field}: {message}")
        self.field = field
        self.reason = message


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)
