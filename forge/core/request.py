"""What one replica asks of a node: derived from its group, compared by placement.

Its own module so the placement kernel and the phases can name it without the
whole job vocabulary; :mod:`forge.core.models` re-exports it.
"""

from __future__ import annotations

from forge.core.fields import Int, Model
from forge.core.limits import GPU_MILLI
from forge.core.nodes import Toleration

__all__ = ["Request"]


class Request(Model):
    """What one replica of a group needs from a node (derived, never user-written).

    ``gpu_milli`` 1..999 (with ``gpu`` 1) asks a share of one device; 0 asks
    ``gpu`` whole devices. ``tolerations`` are the group's: taints are a static
    rule like GPU models, so they belong to the equivalence class.
    """

    cpu: Int
    memory: Int
    gpu: Int = 0
    gpu_memory: Int = 0
    gpu_models: tuple[str, ...] = ()
    gpu_milli: Int = 0
    tolerations: tuple[Toleration, ...] = ()

    @property
    def milli(self) -> int:
        """Milli-GPU asked in all: a share, or 1000 per whole device."""
        return self.gpu_milli if self.gpu_milli else GPU_MILLI * self.gpu
