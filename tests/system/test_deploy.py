"""docker-compose.yml and the Dockerfile, checked as far as this machine allows
(no Docker engine runs here): the files parse, every service Forge talks to is
where Forge's settings say, and the image builds from files that exist."""

from __future__ import annotations

import re
from pathlib import Path
from urllib.parse import urlparse

import yaml

from forge.settings import ENV_VARS, Settings

ROOT = Path(__file__).resolve().parents[2]
COMPOSE = yaml.safe_load((ROOT / "docker-compose.yml").read_text())
SERVICES = COMPOSE["services"]
WORKERS = [name for name in SERVICES if name.startswith("forge-worker")]


def _ports(service: str) -> dict[int, int]:
    """container port -> host port"""
    out = {}
    for spec in SERVICES[service].get("ports", []):
        host, container = str(spec).split(":")[-2:]
        out[int(container)] = int(host)
    return out


def test_the_production_layout_has_every_service() -> None:
    assert {"postgresql", "temporal", "temporal-ui", "codec", "prometheus"} <= set(SERVICES)
    assert len(WORKERS) == 2


def test_workers_read_only_settings_forge_knows_and_they_point_at_real_services() -> None:
    for name in WORKERS:
        env = SERVICES[name]["environment"]
        unknown = set(env) - set(ENV_VARS)
        assert not unknown, f"{name} sets variables Forge does not read: {unknown}"
        settings = Settings.from_env({k: str(v) for k, v in env.items()})
        host, port = settings.address.split(":")
        assert host == "temporal" and int(port) in _ports("temporal")
        store = urlparse(settings.store_url)
        assert store.scheme == "postgresql" and store.hostname == "postgresql"
        assert store.port in _ports("postgresql")
        assert settings.metrics_port in _ports(name)
        assert SERVICES[name]["depends_on"]["temporal"]["condition"] == "service_healthy"


def test_forge_database_and_role_are_created_for_the_store_url() -> None:
    init = (ROOT / "deploy/postgres-init.sql").read_text()
    url = urlparse(SERVICES[WORKERS[0]]["environment"]["FORGE_STORE"])
    assert f"CREATE ROLE {url.username} LOGIN PASSWORD '{url.password}'" in init
    assert f"CREATE DATABASE {url.path.lstrip('/')} OWNER {url.username}" in init
    mounted = SERVICES["postgresql"]["volumes"][0].split(":")[0]
    assert (ROOT / mounted).resolve() == (ROOT / "deploy/postgres-init.sql").resolve()


def test_prometheus_scrapes_each_worker_on_its_metrics_port() -> None:
    mount = SERVICES["prometheus"]["volumes"][0].split(":")[0]
    config = yaml.safe_load((ROOT / mount).read_text())
    targets = {
        t for sc in config["scrape_configs"] for c in sc["static_configs"] for t in c["targets"]
    }
    expected = {f"{w}:{SERVICES[w]['environment']['FORGE_METRICS_PORT']}" for w in WORKERS}
    assert targets == expected


def test_ui_talks_to_the_temporal_service() -> None:
    env = SERVICES["temporal-ui"]["environment"]
    host, port = env["TEMPORAL_ADDRESS"].split(":")
    assert host == "temporal" and int(port) in _ports("temporal")
    assert 8080 in _ports("temporal-ui")


def test_dockerfile_copies_files_that_exist_and_runs_the_worker() -> None:
    text = (ROOT / "Dockerfile").read_text()
    for line in text.splitlines():
        m = re.match(r"COPY\s+(.+)\s+\S+$", line)
        if m:
            for src in m.group(1).split():
                assert (ROOT / src).exists(), f"Dockerfile copies missing {src}"
    assert 'CMD ["python", "-m", "worker"]' in text
    assert SERVICES[WORKERS[0]]["build"] == "."


def test_the_ui_decodes_through_the_codec_server_the_browser_can_reach() -> None:
    """The browser, not the UI server, calls TEMPORAL_CODEC_ENDPOINT: it must be the
    host's published port, and the codec server must admit the UI's origin."""
    from forge.cli.services import codec_server_command

    ui = SERVICES["temporal-ui"]
    endpoint = urlparse(ui["environment"]["TEMPORAL_CODEC_ENDPOINT"])
    assert endpoint.hostname == "localhost"
    codec = SERVICES["codec"]
    assert _ports("codec")[8081] == endpoint.port
    assert all(str(p).startswith("127.0.0.1:") for p in codec["ports"])  # loopback only
    assert "codec" in ui["depends_on"]
    assert codec["command"][:2] == ["forge", "codec-server"]
    # what the container runs, parsed as the command parses it
    args = codec_server_command.make_context("codec-server", codec["command"][2:]).params
    assert args["port"] == 8081 and args["host"] == "0.0.0.0"
    assert f"http://localhost:{_ports('temporal-ui')[8080]}" in args["allow_origin"]
    assert codec["image"] == SERVICES[WORKERS[0]]["image"]  # the image has `forge`
    # it decrypts without a token only because its port is on the host's loopback
    assert args["allow_no_auth"] and not args["auth_file"]


def test_every_temporal_client_gets_the_key_the_one_shot_service_makes() -> None:
    """Workers, the agent and the codec server read one key file, made once on a
    volume they mount read-only, and start only after it exists."""
    from forge.cli.codec_key import codec_key

    maker = SERVICES["codec-key"]
    assert maker["command"][:3] == ["forge", "codec-key", "new"]
    params = codec_key.commands["new"].make_context("new", maker["command"][3:]).params
    path = str(params["path"])
    assert params["if_missing"]  # a second `up` must not add a key
    assert maker["restart"] == "no"
    [volume] = [v for v in maker["volumes"] if path.startswith(v.split(":")[1] + "/")]
    name, where = volume.split(":")[:2]
    assert name in COMPOSE["volumes"]
    for service in [*WORKERS, "forge-agent-1", "codec"]:
        svc = SERVICES[service]
        env = {k: str(v) for k, v in svc["environment"].items()}
        assert env["FORGE_CODEC_KEY_FILE"] == path, service
        assert Settings.from_env(env).codec_key_file == Path(path)
        assert f"{name}:{where}:ro" in svc["volumes"], service
        assert svc["depends_on"]["codec-key"]["condition"] == "service_completed_successfully"


def test_the_agent_runs_forge_agent_against_the_workers_temporal_queue_and_store() -> None:
    from forge.cli.agent import agent

    svc = SERVICES["forge-agent-1"]
    assert svc["command"][:2] == ["forge", "agent"]
    args = agent.make_context("agent", svc["command"][2:]).params  # parsed as the CLI does
    assert args["node_id"] == "agent-1"
    env = {k: str(v) for k, v in svc["environment"].items()}
    assert set(env) - set(ENV_VARS) == {"FORGE_AGENT_TOKEN"}  # read by forge agent itself
    worker = Settings.from_env({k: str(v) for k, v in SERVICES[WORKERS[0]]["environment"].items()})
    mine = Settings.from_env(env)
    assert (mine.address, mine.namespace, mine.task_queue, mine.store_url) == (
        worker.address, worker.namespace, worker.task_queue, worker.store_url,
    )  # fmt: skip
    assert svc["image"] == SERVICES[WORKERS[0]]["image"]  # the image has `forge`
    # its state survives a restart (adoption), and its log server is on the host's loopback
    data = str(args["data_dir"])
    assert any(v.split(":")[1] == data for v in svc["volumes"]), svc["volumes"]
    port = int(args["logs_address"].rpartition(":")[2])
    assert _ports("forge-agent-1")[port] == port
    assert all(str(p).startswith("127.0.0.1:") for p in svc["ports"])
    assert args["logs_address"].startswith("0.0.0.0:") and env["FORGE_AGENT_TOKEN"]
    for dep in ("temporal", "postgresql"):
        assert svc["depends_on"][dep]["condition"] == "service_healthy"
