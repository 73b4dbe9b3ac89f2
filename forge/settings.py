"""``FORGE_*`` settings, read once, shared by the worker, the CLI and the client.

Command-line flags win over the environment, the environment over defaults.
Credentials (API key, TLS key) come only from the environment or from files and
are never part of ``repr`` or a log line.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from forge.errors import InvalidInput

__all__ = ["ENV_VARS", "Settings", "SettingsError"]

#: Every variable Forge reads (the README's settings table lists the same).
ENV_VARS = (
    "FORGE_TEMPORAL_ADDRESS",
    "FORGE_NAMESPACE",
    "FORGE_TASK_QUEUE",
    "FORGE_CLUSTER",
    "FORGE_DATA_DIR",
    "FORGE_STORE",
    "FORGE_METRICS_PORT",
    "FORGE_LOG_FORMAT",
    "FORGE_TEMPORAL_TLS",
    "FORGE_TEMPORAL_TLS_CERT",
    "FORGE_TEMPORAL_TLS_KEY",
    "FORGE_TEMPORAL_TLS_CA",
    "FORGE_TEMPORAL_TLS_SERVER_NAME",
    "FORGE_TEMPORAL_API_KEY",
    "FORGE_WATCHDOG_SECONDS",
)


class SettingsError(InvalidInput, ValueError):
    """A setting has a value Forge cannot use (the message names the variable)."""


def _int(env: Mapping[str, str], name: str, default: int) -> int:
    raw = env.get(name)
    if raw is None or raw == "":
        return default
    try:
        return int(raw)
    except ValueError:
        raise SettingsError(f"{name}={raw!r} is not an integer") from None


def _float(env: Mapping[str, str], name: str, default: float) -> float:
    raw = env.get(name)
    if raw is None or raw == "":
        return default
    try:
        value = float(raw)
    except ValueError:
        raise SettingsError(f"{name}={raw!r} is not a number") from None
    if not value >= 0:
        raise SettingsError(f"{name}={raw!r} must be 0 or more")
    return value


@dataclass(frozen=True)
class Settings:
    address: str = "localhost:7233"
    namespace: str = "default"
    task_queue: str = "forge"
    cluster: str = "default"
    data_dir: Path = Path(".forge")
    store: str = ""
    metrics_port: int = 0
    log_format: str = "auto"  # auto | console | json
    tls: bool = False
    tls_cert: str = ""
    tls_key: str = ""
    tls_ca: str = ""
    tls_server_name: str = ""
    api_key: str = field(default="", repr=False)
    watchdog_seconds: float = 10.0  # 0: the worker runs no watchdog

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None) -> Settings:
        e = os.environ if env is None else env
        s = cls(
            address=e.get("FORGE_TEMPORAL_ADDRESS", cls.address),
            namespace=e.get("FORGE_NAMESPACE", cls.namespace),
            task_queue=e.get("FORGE_TASK_QUEUE", cls.task_queue),
            cluster=e.get("FORGE_CLUSTER", cls.cluster),
            data_dir=Path(e.get("FORGE_DATA_DIR", str(cls.data_dir))),
            store=e.get("FORGE_STORE", ""),
            metrics_port=_int(e, "FORGE_METRICS_PORT", 0),
            log_format=e.get("FORGE_LOG_FORMAT", "auto"),
            tls=e.get("FORGE_TEMPORAL_TLS", "").lower() in ("1", "true", "yes"),
            tls_cert=e.get("FORGE_TEMPORAL_TLS_CERT", ""),
            tls_key=e.get("FORGE_TEMPORAL_TLS_KEY", ""),
            tls_ca=e.get("FORGE_TEMPORAL_TLS_CA", ""),
            tls_server_name=e.get("FORGE_TEMPORAL_TLS_SERVER_NAME", ""),
            api_key=e.get("FORGE_TEMPORAL_API_KEY", ""),
            watchdog_seconds=_float(e, "FORGE_WATCHDOG_SECONDS", 10.0),
        )
        if s.log_format not in ("auto", "console", "json"):
            raise SettingsError(f"FORGE_LOG_FORMAT={s.log_format!r}: use auto, console or json")
        if bool(s.tls_cert) != bool(s.tls_key):
            raise SettingsError("FORGE_TEMPORAL_TLS_CERT and FORGE_TEMPORAL_TLS_KEY go together")
        return s

    def override(self, **changes: Any) -> Settings:
        """Apply command-line flags (None means "not given")."""
        return replace(self, **{k: v for k, v in changes.items() if v is not None})

    @property
    def store_url(self) -> str:
        if self.store:
            return self.store
        return f"sqlite:///{(self.data_dir / 'forge.db').resolve()}"

    def tls_config(self) -> Any:
        """A ``temporalio.service.TLSConfig``, True, or False, from the TLS settings."""
        from temporalio.service import TLSConfig

        if not (self.tls or self.tls_cert or self.tls_ca or self.api_key):
            return False
        if not (self.tls_cert or self.tls_ca or self.tls_server_name):
            return True

        def read(path: str, name: str) -> bytes | None:
            if not path:
                return None
            try:
                return Path(path).read_bytes()
            except OSError as err:
                raise SettingsError(f"{name}: cannot read {path}: {err.strerror}") from None

        return TLSConfig(
            server_root_ca_cert=read(self.tls_ca, "FORGE_TEMPORAL_TLS_CA"),
            client_cert=read(self.tls_cert, "FORGE_TEMPORAL_TLS_CERT"),
            client_private_key=read(self.tls_key, "FORGE_TEMPORAL_TLS_KEY"),
            domain=self.tls_server_name or None,
        )

    async def connect(self) -> Any:
        """A ``temporalio.client.Client`` with Forge's data converter."""
        from temporalio.client import Client

        from forge.wire.codec import data_converter

        return await Client.connect(
            self.address,
            namespace=self.namespace,
            data_converter=data_converter(),
            tls=self.tls_config(),
            api_key=self.api_key or None,
        )
