"""Settings, read once, shared by the worker, the CLI and the client.

Two sources, each for what it owns:

- **The Temporal connection** comes from ``temporalio.envconfig``, as in every
  Temporal tool: ``TEMPORAL_ADDRESS``, ``TEMPORAL_NAMESPACE``, ``TEMPORAL_API_KEY``,
  ``TEMPORAL_TLS*``, ``TEMPORAL_GRPC_META_*``, and profiles from the TOML file
  (``TEMPORAL_CONFIG_FILE``, ``TEMPORAL_PROFILE``).
- **Forge's own** ``FORGE_*`` variables, one declaration each below. The older
  ``FORGE_TEMPORAL_*`` / ``FORGE_NAMESPACE`` ones still work and, when set, win over
  the Temporal ones (a deployment that sets both meant the Forge one).

Command-line flags win over both, the environment over defaults. An empty variable
counts as unset. Credentials (API key, TLS key, gRPC metadata, payload encryption
keys, the codec server's token) come only from the environment or files and are
never part of ``repr`` or a log line.

``Settings(...)`` is the defaults plus what is passed (tests build it this way);
only ``Settings.from_env`` reads an environment, the process's or a mapping.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, InstanceOf, ValidationError
from temporalio.envconfig import ClientConfigProfile, ClientConfigTLS, ClientConnectConfig

from forge.errors import InvalidInput

if TYPE_CHECKING:  # loaded when keys are read: it brings the SDK's converter
    from forge.wire.encryption import CodecKeys

__all__ = ["ENV_VARS", "TEMPORAL_ENV_VARS", "Settings", "SettingsError", "load_temporal_profile"]


class SettingsError(InvalidInput, ValueError):
    """A setting has a value Forge cannot use (the message names the variable)."""


#: The Temporal variables ``temporalio.envconfig`` reads (besides ``TEMPORAL_GRPC_META_*``).
TEMPORAL_ENV_VARS = (
    "TEMPORAL_ADDRESS",
    "TEMPORAL_NAMESPACE",
    "TEMPORAL_API_KEY",
    "TEMPORAL_TLS",
    "TEMPORAL_TLS_CLIENT_CERT_PATH",
    "TEMPORAL_TLS_CLIENT_KEY_PATH",
    "TEMPORAL_TLS_SERVER_CA_CERT_PATH",
    "TEMPORAL_TLS_SERVER_NAME",
    "TEMPORAL_CONFIG_FILE",
    "TEMPORAL_PROFILE",
)

_TLS_VARS = (
    "FORGE_TEMPORAL_TLS",
    "FORGE_TEMPORAL_TLS_CERT",
    "FORGE_TEMPORAL_TLS_KEY",
    "FORGE_TEMPORAL_TLS_CA",
    "FORGE_TEMPORAL_TLS_SERVER_NAME",
)


def _var(name: str, default: Any, description: str, **kw: Any) -> Any:
    return Field(default, validation_alias=name, description=description, **kw)


class Settings(BaseModel):
    # A plain model: the environment is read by from_env alone (pydantic-settings'
    # sources were all switched off, and importing it cost forge status ~15%)
    model_config = ConfigDict(
        frozen=True,
        validate_by_name=True,
        validate_by_alias=True,
        extra="forbid",
        arbitrary_types_allowed=True,
        validate_default=True,
    )

    # -- the Temporal connection (defaults: envconfig, then these) ------------------
    address: str = _var("FORGE_TEMPORAL_ADDRESS", "localhost:7233", "Temporal frontend host:port")
    namespace: str = _var("FORGE_NAMESPACE", "default", "Temporal namespace")
    tls: bool = _var("FORGE_TEMPORAL_TLS", False, "`1` to use TLS with the system roots")
    tls_cert: str = _var("FORGE_TEMPORAL_TLS_CERT", "", "mTLS client certificate file")
    tls_key: str = _var("FORGE_TEMPORAL_TLS_KEY", "", "mTLS client key file")
    tls_ca: str = _var("FORGE_TEMPORAL_TLS_CA", "", "CA file for the server's certificate")
    tls_server_name: str = _var("FORGE_TEMPORAL_TLS_SERVER_NAME", "", "TLS server name override")
    api_key: str = _var(
        "FORGE_TEMPORAL_API_KEY", "", "API key (Temporal Cloud); never logged", repr=False
    )
    # -- Forge's own -----------------------------------------------------------------
    task_queue: str = _var("FORGE_TASK_QUEUE", "forge", "task queue of the workflow and activities")
    cluster: str = _var("FORGE_CLUSTER", "default", "cluster name (workflow forge-cluster-<name>)")
    data_dir: Path = _var(
        "FORGE_DATA_DIR", Path(".forge"), "where `forge dev` and the default store keep files"
    )
    store: str = _var("FORGE_STORE", "", "store URL; empty: sqlite in FORGE_DATA_DIR")
    metrics_port: int = _var(
        "FORGE_METRICS_PORT", 0, "Prometheus endpoint of the worker (0: off)", ge=0, le=65535
    )
    log_format: Literal["auto", "console", "json"] = _var(
        "FORGE_LOG_FORMAT", "auto", "console on a terminal, json otherwise (auto), or forced"
    )
    watchdog_seconds: float = _var(
        "FORGE_WATCHDOG_SECONDS", 10.0, "how often the worker's watchdog looks (0: off)", ge=0
    )
    gc_freeze: bool = _var(
        "FORGE_GC_FREEZE",
        True,
        "worker: freeze long-lived objects out of the collector's sweeps each second",
    )
    codec_key_file: Path | None = _var(
        "FORGE_CODEC_KEY_FILE",
        None,
        "file of payload encryption keys, `id:base64key` a line, the first current",
    )
    codec_keys: str = _var(
        "FORGE_CODEC_KEYS",
        "",
        "payload encryption keys `id:base64key,...` (before the file's; the first is "
        "current); never logged",
        repr=False,
    )
    codec_token: str = _var(
        "FORGE_CODEC_TOKEN",
        "",
        "`forge codec-server`: the token every request must carry; never logged",
        repr=False,
    )
    # -- from envconfig only, no FORGE_* variable ------------------------------------
    temporal_tls: InstanceOf[ClientConfigTLS] | None = Field(default=None, repr=False)
    rpc_metadata: dict[str, str] = Field(default_factory=dict, repr=False)

    def __init__(self, **values: Any) -> None:
        try:
            super().__init__(**values)
        except ValidationError as err:
            raise SettingsError(_explain(err)) from None
        if bool(self.tls_cert) != bool(self.tls_key):
            raise SettingsError("FORGE_TEMPORAL_TLS_CERT and FORGE_TEMPORAL_TLS_KEY go together")
        if self.codec_keys.strip():  # a bad list fails at start-up (none: nothing to load)
            _parse_keys(self.codec_keys, "FORGE_CODEC_KEYS")

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None) -> Settings:
        """Settings from ``env`` (default: the process environment): ``FORGE_*`` over
        the Temporal environment configuration over the defaults."""
        e = dict(os.environ if env is None else env)
        forge = _forge_variables(e)
        profile = load_temporal_profile(e)
        temporal: dict[str, Any] = {"rpc_metadata": dict(profile.grpc_meta)}
        if profile.address and "FORGE_TEMPORAL_ADDRESS" not in forge:
            temporal["address"] = profile.address
        if profile.namespace and "FORGE_NAMESPACE" not in forge:
            temporal["namespace"] = profile.namespace
        if profile.api_key and "FORGE_TEMPORAL_API_KEY" not in forge:
            temporal["api_key"] = profile.api_key
        if profile.tls is not None and not any(v in forge for v in _TLS_VARS):
            temporal["temporal_tls"] = profile.tls
        return cls(**forge, **temporal)

    def override(self, **changes: Any) -> Settings:
        """Apply command-line flags (None means "not given")."""
        given = {k: v for k, v in changes.items() if v is not None}
        return type(self)(**{**self._values(), **given})

    def _values(self) -> dict[str, Any]:
        return {name: getattr(self, name) for name in type(self).model_fields}

    @property
    def store_url(self) -> str:
        if self.store:
            return self.store
        return f"sqlite:///{(self.data_dir / 'forge.db').resolve()}"

    def tls_config(self) -> Any:
        """A ``temporalio.service.TLSConfig``, True, or False.

        ``FORGE_TEMPORAL_TLS*`` if any is set, else the Temporal profile's TLS, else
        TLS exactly when there is an API key (as ``envconfig`` does).
        """
        from temporalio.service import TLSConfig

        forge_tls = self.tls or self.tls_cert or self.tls_ca or self.tls_server_name
        if not forge_tls and self.temporal_tls is not None:
            try:
                return self.temporal_tls.to_connect_tls_config()
            except OSError as err:
                raise SettingsError(
                    f"TEMPORAL_TLS_*: cannot read {err.filename}: {err.strerror}"
                ) from None
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

    def encryption_keys(self) -> CodecKeys:
        """The payload encryption keys: ``FORGE_CODEC_KEYS``, then those of
        ``FORGE_CODEC_KEY_FILE``; the first is current. Empty: no encryption.

        Read on each call (the file may be rotated); a process reads it once at
        start-up, so a rotation takes effect as each process restarts."""
        keys = _parse_keys(self.codec_keys, "FORGE_CODEC_KEYS")
        if self.codec_key_file is not None:
            path = self.codec_key_file
            try:
                text = path.read_text()
            except (OSError, UnicodeDecodeError) as err:
                why = getattr(err, "strerror", None) or str(err)
                raise SettingsError(f"FORGE_CODEC_KEY_FILE: cannot read {path}: {why}") from None
            from_file = _parse_keys(text, f"FORGE_CODEC_KEY_FILE {path}")
            if not from_file:
                raise SettingsError(f"FORGE_CODEC_KEY_FILE {path}: holds no key")
            keys = _join_keys(keys, from_file)
        return keys

    def connect_config(self) -> ClientConnectConfig:
        """The keyword arguments of ``Client.connect`` for these settings (the same
        shape ``envconfig``'s ``to_client_connect_config`` returns)."""
        config: ClientConnectConfig = {
            "target_host": self.address,
            "namespace": self.namespace,
            "tls": self.tls_config(),
        }
        if self.api_key:
            config["api_key"] = self.api_key
        if self.rpc_metadata:
            config["rpc_metadata"] = dict(self.rpc_metadata)
        return config

    async def connect(self) -> Any:
        """A ``temporalio.client.Client`` with Forge's data converter."""
        from temporalio.client import Client

        from forge.wire.codec import data_converter

        return await Client.connect(
            **self.connect_config(), data_converter=data_converter(self.encryption_keys())
        )


#: Every ``FORGE_*`` variable Forge reads (the README's settings table lists the same).
ENV_VARS: tuple[str, ...] = tuple(
    str(f.validation_alias) for f in Settings.model_fields.values() if f.validation_alias
)


def _forge_variables(env: Mapping[str, str]) -> dict[str, Any]:
    """The ``FORGE_*`` variables of ``env`` that are set (an empty one counts as
    unset), by variable name: the fields' aliases."""
    values: dict[str, Any] = {}
    for name in ENV_VARS:
        value = env.get(name)
        if value:
            values[name] = value
    return values


def load_temporal_profile(env: Mapping[str, str] | None = None) -> ClientConfigProfile:
    """The Temporal connection profile of ``env``, as every Temporal tool reads it:
    the TOML file (``TEMPORAL_CONFIG_FILE`` or the default path) and profile
    (``TEMPORAL_PROFILE``, default ``default``), overridden by ``TEMPORAL_*``."""
    e = dict(os.environ if env is None else env)
    try:
        return ClientConfigProfile.load(override_env_vars=e)
    except (RuntimeError, OSError, ValueError) as err:
        where = e.get("TEMPORAL_CONFIG_FILE") or "the default Temporal config file"
        profile = e.get("TEMPORAL_PROFILE") or "default"
        raise SettingsError(f"TEMPORAL_PROFILE={profile!r} in {where}: {err}") from None


def _parse_keys(text: str, source: str) -> CodecKeys:
    from forge.wire.encryption import CodecKeys

    try:
        return CodecKeys.parse(text)
    except ValueError as err:
        raise SettingsError(f"{source}: {err}") from None


def _join_keys(first: CodecKeys, then: CodecKeys) -> CodecKeys:
    try:
        return first + then
    except ValueError as err:  # one id, two keys
        raise SettingsError(f"FORGE_CODEC_KEYS and FORGE_CODEC_KEY_FILE: {err}") from None


#: Variables whose values are never echoed in an error.
_SECRET_VARS = ("FORGE_TEMPORAL_API_KEY", "FORGE_CODEC_KEYS", "FORGE_CODEC_TOKEN")


def _explain(err: ValidationError) -> str:
    """One line per bad value, each naming the variable it came from."""
    aliases = {n: str(f.validation_alias) for n, f in Settings.model_fields.items()}
    lines = []
    for e in err.errors():
        loc = str(e["loc"][0]) if e["loc"] else ""
        var = aliases.get(loc, loc)
        value = e.get("input")
        shown = "" if var in _SECRET_VARS else f"={value!r}"
        lines.append(f"{var}{shown}: {e['msg']}")
    return "; ".join(lines)
