"""Where ``generate --input`` and ``detect --input`` run their records: ``DeviceSettings``.

A module of its own, free of Lightning, so that those commands' options are read without
loading it; the run over devices is ``parallel``'s.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Annotated, Any

from .checks import Range, check


@dataclass(frozen=True)
class DeviceSettings:
    """Where ``generate`` and ``detect`` run an ``--input`` file (Lightning's names). Setting
    any of the three sends the records through ``Trainer.predict``: spread over the devices,
    each process writing a shard, merged in input order, resumable."""

    accelerator: str | None = None
    """Lightning accelerator: ``cpu``, ``gpu``, ``cuda``, ``mps`` or ``auto`` (the default once
    another of these settings is given)."""
    devices: Annotated[int, Range(-1, 4096)] | str | None = None
    """How many devices (``2``), which (``0,2``), or all (``auto``, ``-1``); default ``auto``."""
    strategy: str | None = None
    """Lightning strategy: ``ddp`` (one process per device, started by running the command
    again), ``ddp_spawn`` (started from this one) or ``auto``."""

    def __post_init__(self) -> None:
        check(self, [])

    def requested(self) -> bool:
        """Whether any setting was given (else the records are processed in this process)."""
        return any(v is not None for v in (self.accelerator, self.devices, self.strategy))

    def trainer_kwargs(self) -> dict[str, Any]:
        """The settings as ``lightning.Trainer`` arguments, ``auto`` for those not given."""
        return {
            "accelerator": self.accelerator or "auto",
            "devices": "auto" if self.devices is None else self.devices,
            "strategy": self.strategy or "auto",
        }
