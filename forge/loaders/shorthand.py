"""The short form of a node's GPUs (``gpus: {model, count, memory}``): a model of
its own so that both the loader and the error renderer can name it."""

from __future__ import annotations

from typing import Annotated

from pydantic import BaseModel, ConfigDict, Field

from forge.core.models import MAX_GPUS, MAX_MEMORY, NAME_PATTERN

__all__ = ["GpuShorthand"]


class GpuShorthand(BaseModel):
    """``gpus: {model: V100M32, count: 8}``: N identical devices, for humans."""

    model_config = ConfigDict(strict=True, extra="forbid", frozen=True)

    model: Annotated[str, Field(pattern=NAME_PATTERN)]
    count: int = Field(default=1, ge=0, le=MAX_GPUS)
    memory: int | None = Field(default=None, ge=0, le=MAX_MEMORY, description="MiB per GPU")
