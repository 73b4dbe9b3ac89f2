"""Settings: ``FORGE_*`` through a pydantic model, the Temporal connection through
``temporalio.envconfig``. Everything here turns an environment into connect
arguments, so no server is needed."""

from __future__ import annotations

import base64
from pathlib import Path

import pytest
from temporalio.service import TLSConfig

from forge.settings import ENV_VARS, Settings, SettingsError, load_temporal_profile
from forge.wire.encryption import format_key, new_key

SECRET = "sk-test-not-a-real-key"


def test_defaults_connect_to_a_local_server_in_plain_text() -> None:
    assert Settings.from_env({}).connect_config() == {
        "target_host": "localhost:7233",
        "namespace": "default",
        "tls": False,
    }


def test_the_temporal_environment_is_read_as_every_temporal_tool_reads_it() -> None:
    s = Settings.from_env(
        {
            "TEMPORAL_ADDRESS": "cloud.example:7233",
            "TEMPORAL_NAMESPACE": "prod.acct",
            "TEMPORAL_API_KEY": SECRET,
            "TEMPORAL_GRPC_META_X_TENANT": "blue",
        }
    )
    assert (s.address, s.namespace, s.api_key) == ("cloud.example:7233", "prod.acct", SECRET)
    assert s.connect_config() == {
        "target_host": "cloud.example:7233",
        "namespace": "prod.acct",
        "api_key": SECRET,
        "tls": True,  # an API key implies TLS, as in envconfig
        "rpc_metadata": {"x-tenant": "blue"},
    }
    assert SECRET not in repr(s) and "blue" not in repr(s)


def test_forge_variables_win_over_the_temporal_ones() -> None:
    s = Settings.from_env(
        {
            "TEMPORAL_ADDRESS": "temporal:7233",
            "TEMPORAL_NAMESPACE": "theirs",
            "FORGE_TEMPORAL_ADDRESS": "forge:7233",
            "FORGE_NAMESPACE": "ours",
        }
    )
    assert (s.address, s.namespace) == ("forge:7233", "ours")
    # and command-line flags win over both
    assert s.override(address="flag:7233", namespace=None).address == "flag:7233"
    assert s.override(address="flag:7233").namespace == "ours"


def test_a_profile_from_the_config_file(tmp_path: Path) -> None:
    ca = tmp_path / "ca.pem"
    ca.write_bytes(b"--- a CA ---")
    config = tmp_path / "temporal.toml"
    config.write_text(
        '[profile.prod]\naddress = "prod:7233"\nnamespace = "prodns"\n'
        f'[profile.prod.tls]\nserver_name = "srv.internal"\nserver_ca_cert_path = "{ca}"\n'
    )
    env = {"TEMPORAL_CONFIG_FILE": str(config), "TEMPORAL_PROFILE": "prod"}
    connect = Settings.from_env(env).connect_config()
    assert (connect["target_host"], connect["namespace"]) == ("prod:7233", "prodns")
    tls = connect["tls"]
    assert isinstance(tls, TLSConfig)
    assert (tls.domain, tls.server_root_ca_cert) == ("srv.internal", b"--- a CA ---")
    # the default profile of the same file is empty: Forge's defaults apply
    assert Settings.from_env({"TEMPORAL_CONFIG_FILE": str(config)}).address == "localhost:7233"


def test_temporal_tls_files_from_the_environment(tmp_path: Path) -> None:
    cert, key = tmp_path / "c.pem", tmp_path / "c.key"
    cert.write_bytes(b"cert")
    key.write_bytes(b"key")
    env = {
        "TEMPORAL_TLS_CLIENT_CERT_PATH": str(cert),
        "TEMPORAL_TLS_CLIENT_KEY_PATH": str(key),
    }
    tls = Settings.from_env(env).tls_config()
    assert isinstance(tls, TLSConfig)
    assert (tls.client_cert, tls.client_private_key) == (b"cert", b"key")
    # a FORGE_TEMPORAL_TLS* variable replaces the Temporal TLS settings whole
    assert Settings.from_env({**env, "FORGE_TEMPORAL_TLS": "1"}).tls_config() is True
    assert (
        Settings.from_env({"TEMPORAL_TLS": "false", "TEMPORAL_API_KEY": SECRET}).tls_config()
        is False
    )


def test_an_unreadable_temporal_tls_file_names_the_setting(tmp_path: Path) -> None:
    missing = tmp_path / "nope.pem"
    s = Settings.from_env({"TEMPORAL_TLS_SERVER_CA_CERT_PATH": str(missing)})
    with pytest.raises(SettingsError, match=r"TEMPORAL_TLS_\*: cannot read .*nope\.pem"):
        s.tls_config()


def test_an_unknown_profile_is_a_settings_error() -> None:
    with pytest.raises(SettingsError, match="TEMPORAL_PROFILE='nope'"):
        Settings.from_env({"TEMPORAL_PROFILE": "nope"})
    assert load_temporal_profile({"TEMPORAL_ADDRESS": "a:1"}).address == "a:1"


@pytest.mark.parametrize(
    ("var", "value", "problem"),
    [
        ("FORGE_METRICS_PORT", "abc", "valid integer"),
        ("FORGE_METRICS_PORT", "70000", "less than or equal to 65535"),
        ("FORGE_WATCHDOG_SECONDS", "-1", "greater than or equal to 0"),
        ("FORGE_WATCHDOG_SECONDS", "nan", "greater than or equal to 0"),
        ("FORGE_LOG_FORMAT", "xml", "'auto', 'console' or 'json'"),
        ("FORGE_TEMPORAL_TLS", "maybe", "valid boolean"),
    ],
)
def test_a_bad_value_names_its_variable(var: str, value: str, problem: str) -> None:
    with pytest.raises(SettingsError) as err:
        Settings.from_env({var: value})
    assert str(err.value).startswith(f"{var}={value!r}: ")
    assert problem in str(err.value)


def test_a_bad_api_key_is_never_echoed() -> None:
    with pytest.raises(SettingsError) as err:
        Settings(api_key=["not", SECRET])
    assert "FORGE_TEMPORAL_API_KEY" in str(err.value) and SECRET not in str(err.value)


def test_every_forge_variable_is_declared_once_with_a_description() -> None:
    assert len(ENV_VARS) == len(set(ENV_VARS)) == 19
    assert all(v.startswith("FORGE_") for v in ENV_VARS)
    described = {str(f.validation_alias): f.description for f in Settings.model_fields.values()}
    assert all(described[v] for v in ENV_VARS)
    # the settings table (docs/operations.md, "Settings") lists every one
    docs = (Path(__file__).resolve().parent.parent / "docs" / "operations.md").read_text()
    assert not [v for v in ENV_VARS if f"`{v}`" not in docs]


def test_each_variable_reaches_its_setting(tmp_path: Path) -> None:
    env = {
        "FORGE_TASK_QUEUE": "q",
        "FORGE_CLUSTER": "c",
        "FORGE_DATA_DIR": str(tmp_path),
        "FORGE_METRICS_PORT": "9100",
        "FORGE_LOG_FORMAT": "json",
        "FORGE_WATCHDOG_SECONDS": "0",
        "FORGE_CODEC_TOKEN": "t0k",
    }
    s = Settings.from_env(env)
    assert s.codec_token == "t0k" and "t0k" not in repr(s)
    assert (s.task_queue, s.cluster, s.data_dir) == ("q", "c", tmp_path)
    assert (s.metrics_port, s.log_format, s.watchdog_seconds) == (9100, "json", 0.0)
    assert s.store_url == f"sqlite:///{tmp_path / 'forge.db'}"
    # an empty variable counts as unset
    assert Settings.from_env({"FORGE_METRICS_PORT": "", "FORGE_CLUSTER": ""}).cluster == "default"


def test_settings_built_in_code_ignore_the_process_environment(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("FORGE_CLUSTER", "from-the-shell")
    monkeypatch.setenv("TEMPORAL_ADDRESS", "shell:7233")
    assert Settings().cluster == "default" and Settings().address == "localhost:7233"
    s = Settings.from_env()
    assert (s.cluster, s.address) == ("from-the-shell", "shell:7233")


# ------------------------------------------------------------------ codec keys


def _entry(key_id: str) -> str:
    return format_key(key_id, new_key())


def test_codec_keys_come_from_the_variable_then_the_file_the_first_current(
    tmp_path: Path,
) -> None:
    assert not Settings.from_env({}).encryption_keys()  # none: compression only
    env_a, env_b, file_c = _entry("env-a"), _entry("env-b"), _entry("file-c")
    path = tmp_path / "codec.key"
    path.write_text(f"# comment\n{file_c}\n{env_b}\n")  # env-b in both: one key
    s = Settings.from_env(
        {"FORGE_CODEC_KEYS": f"{env_a},{env_b}", "FORGE_CODEC_KEY_FILE": str(path)}
    )
    keys = s.encryption_keys()
    assert keys.ids == ["env-a", "env-b", "file-c"] and keys.current == "env-a"
    assert Settings.from_env({"FORGE_CODEC_KEY_FILE": str(path)}).encryption_keys().current == (
        "file-c"
    )
    for material in (env_a, env_b, file_c):
        assert material.split(":")[1] not in repr(s) + str(s)


def test_a_bad_key_list_stops_the_program_naming_the_variable_not_the_key() -> None:
    material = base64.b64encode(b"x" * 20).decode()
    with pytest.raises(SettingsError) as err:
        Settings.from_env({"FORGE_CODEC_KEYS": f"k1:{material}"})
    assert str(err.value).startswith("FORGE_CODEC_KEYS: key 'k1': 20 bytes")
    assert material not in str(err.value)
    with pytest.raises(SettingsError) as err:
        Settings(codec_keys=["k1", material])  # a wrong type: pydantic's message
    assert "FORGE_CODEC_KEYS" in str(err.value) and material not in str(err.value)


@pytest.mark.parametrize("problem", ["missing", "directory", "empty", "bad"])
def test_an_unusable_key_file_names_the_variable_and_the_file(tmp_path: Path, problem: str) -> None:
    path = tmp_path / "codec.key"
    expected = {
        "missing": "FORGE_CODEC_KEY_FILE: cannot read",
        "directory": "FORGE_CODEC_KEY_FILE: cannot read",
        "empty": "holds no key",
        "bad": "entry 1 is not id:base64key",
    }[problem]
    if problem == "directory":
        path.mkdir()
    elif problem == "empty":
        path.write_text("# no keys yet\n")
    elif problem == "bad":
        path.write_text("just-a-key-without-an-id\n")
    s = Settings.from_env({"FORGE_CODEC_KEY_FILE": str(path)})  # read when used, not before
    with pytest.raises(SettingsError) as err:
        s.encryption_keys()
    assert expected in str(err.value) and str(path) in str(err.value)


def test_one_key_id_with_two_keys_in_the_variable_and_the_file_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "codec.key"
    path.write_text(_entry("k1") + "\n")
    s = Settings.from_env({"FORGE_CODEC_KEYS": _entry("k1"), "FORGE_CODEC_KEY_FILE": str(path)})
    with pytest.raises(
        SettingsError, match="FORGE_CODEC_KEYS and FORGE_CODEC_KEY_FILE: key id 'k1'"
    ):
        s.encryption_keys()
