"""``forge dev``: the real processes (dev server + worker), started, used, stopped."""

from __future__ import annotations

import contextlib
import dataclasses
import os
import queue
import re
import signal
import socket
import stat
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import IO

import pytest

from forge.services.dev import DevError, DevOptions, _codec_port, port_in_use
from forge.wire.encryption import format_key, new_key
from tests.agent.helpers import kill_tasks, task_processes

REPO = Path(__file__).resolve().parents[2]
EXAMPLES = REPO / "examples"
FORGE = str(Path(sys.executable).parent / "forge")

pytestmark = pytest.mark.slow


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def dev_argv(tmp_path: Path, *extra: str) -> tuple[list[str], int, int, Path]:
    port, ui_port, data = free_port(), free_port(), tmp_path / "data"
    argv = [FORGE, "dev", "--port", str(port), "--ui-port", str(ui_port), "--data-dir", str(data)]
    return [*argv, *extra], port, ui_port, data


def child_env() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("FORGE_")}
    return env  # a FORGE_STORE of the caller must not redirect the dev worker


def pump(stream: IO[str], into: queue.Queue[str]) -> None:
    for line in stream:
        into.put(line)


def iter_queue(q: queue.Queue[str]) -> Iterator[str]:
    while True:
        try:
            yield q.get_nowait()
        except queue.Empty:
            return


def test_dev_demo_once_runs_the_examples_on_three_agents_and_cleans_up(tmp_path: Path) -> None:
    argv, port, ui_port, data = dev_argv(tmp_path, "--demo", "--once")
    mark = uuid.uuid4().hex  # inherited by the agents' tasks: found by it afterwards
    start = time.monotonic()
    proc = subprocess.run(
        argv,
        capture_output=True,
        text=True,
        timeout=240,
        cwd=REPO,
        env={**child_env(), "FORGE_TEST_CASE": mark},
    )
    elapsed = time.monotonic() - start
    out = proc.stdout
    leftovers = task_processes({"FORGE_TEST_CASE": mark})
    kill_tasks(leftovers)
    assert proc.returncode == 0, f"{out}\n{proc.stderr}"
    assert "Traceback" not in proc.stderr
    assert not leftovers, "the demo's tasks outlived forge dev"

    assert "demo: 3 local agents registered: demo-1, demo-2, demo-3" in out, out
    # web answered on its ports (the demo curls them), crashy was restarted, burn grew
    assert "demo: every part works" in out, out
    progress = re.findall(r"web (\d+)/3 answering; crashy crashed (\d+)x, restarted (\d+)x; "
                          r"burn (\d+) replicas", out)  # fmt: skip
    web, crashed, restarted, burn = map(int, progress[-1])
    assert web == 3 and crashed >= 1 and restarted >= 1 and burn >= 2, progress[-1]
    curl = re.search(r"curl http://127\.0\.0\.1:(\d+)/ +# web/http/0", out)
    assert curl, out
    final = re.findall(r"cluster default: (\d+) desired, (\d+) bound, (\d+) pending", out)
    assert final and final[-1][2] == "0", out
    assert "PORTS" in out and curl.group(1) in out  # forge status shows the web port
    assert f"http://localhost:{ui_port}/namespaces/default/workflows/forge-cluster-default" in out
    assert f"export FORGE_TEMPORAL_ADDRESS=localhost:{port}" in out
    codec = re.search(r"codec: +http://127\.0\.0\.1:(\d+) ", out)
    assert codec, out
    codec_port = int(codec.group(1))
    assert f"--codec-endpoint http://127.0.0.1:{codec_port}" in out

    assert (data / "temporal.db").is_file()
    assert (data / "forge.db").is_file()
    assert sorted(p.name for p in data.glob("agent-*.log")) == [
        "agent-demo-1.log",
        "agent-demo-2.log",
        "agent-demo-3.log",
    ]
    # everything was stopped: the ports are free again, the web port too
    assert not port_in_use(port) and not port_in_use(ui_port)
    assert not port_in_use(codec_port) and not port_in_use(int(curl.group(1)))
    assert (data / "codec.log").is_file()
    print(f"forge dev --demo --once took {elapsed:.1f} s")


def test_dev_refuses_a_port_in_use(tmp_path: Path) -> None:
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        argv = [FORGE, "dev", "--once", "--port", str(port), "--data-dir", str(tmp_path)]
        proc = subprocess.run(argv, capture_output=True, text=True, timeout=60, env=child_env())
    assert proc.returncode == 1
    assert f"port {port} is already in use" in proc.stderr
    assert "Traceback" not in proc.stderr
    assert not (tmp_path / "temporal.db").exists()


def test_dev_stops_everything_on_sigterm(tmp_path: Path) -> None:
    argv, port, ui_port, data = dev_argv(tmp_path)
    proc = subprocess.Popen(
        argv,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        cwd=REPO,
        env=child_env(),
    )
    assert proc.stdout is not None
    lines: queue.Queue[str] = queue.Queue()
    # a reader thread: readline on a pipe cannot time out, a queue get can
    reader = threading.Thread(target=pump, args=(proc.stdout, lines), daemon=True)
    reader.start()
    seen: list[str] = []
    try:
        deadline = time.monotonic() + 120
        while not any("running; Ctrl-C" in line for line in seen):
            left = deadline - time.monotonic()
            assert left > 0 and proc.poll() is None, "".join(seen)
            with contextlib.suppress(queue.Empty):
                seen.append(lines.get(timeout=min(left, 1.0)))
        assert port_in_use(port)  # the server is up
        proc.send_signal(signal.SIGTERM)
        proc.wait(timeout=60)
        reader.join(timeout=10)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    rest = "".join(seen) + "".join(iter_queue(lines))
    assert proc.returncode == 0, rest
    assert "stopping the worker and the server" in rest
    assert not port_in_use(port) and not port_in_use(ui_port)
    assert (data / "worker.log").is_file()


def _opts(tmp_path: Path, codec_port: int | None) -> DevOptions:
    ui = free_port()
    return DevOptions(
        port=free_port(), ui_port=ui, codec_port=codec_port, data_dir=tmp_path,
        cluster="default", task_queue="forge", demo=False, once=True, startup_timeout=5.0,
    )  # fmt: skip


def test_the_codec_server_takes_the_port_after_the_ui_or_any_free_one(tmp_path: Path) -> None:
    # the UI port is placed just below a port this test holds (or held): one picked
    # at random and incremented could be an outgoing connection's local port, which
    # no listener may take (a clean-clone run failed so)
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        preferred = busy.getsockname()[1]
    opts = dataclasses.replace(_opts(tmp_path, None), ui_port=preferred - 1)
    assert _codec_port(opts) == preferred
    with socket.socket() as busy:  # the preferred port is taken: another, free one
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        preferred = busy.getsockname()[1]
        opts = dataclasses.replace(opts, ui_port=preferred - 1)
        chosen = _codec_port(opts)
        assert chosen != preferred and not port_in_use(chosen)


def test_an_explicit_codec_port_in_use_is_refused(tmp_path: Path) -> None:
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        with pytest.raises(DevError, match=f"port {port} is already in use.*--codec-port"):
            _codec_port(_opts(tmp_path, port))


def test_the_dev_worker_ignores_the_callers_temporal_credentials_and_profiles(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from forge.services.dev import _worker_env
    from forge.settings import Settings

    config = tmp_path / "temporal.toml"
    config.write_text('[profile.cloud]\naddress = "cloud:7233"\napi_key = "k"\n')
    for var, value in {
        "TEMPORAL_CONFIG_FILE": str(config),
        "TEMPORAL_PROFILE": "cloud",
        "TEMPORAL_API_KEY": "sk-elsewhere",
        "TEMPORAL_GRPC_META_AUTHORIZATION": "Bearer x",
        "FORGE_TEMPORAL_API_KEY": "sk-forge",
        "FORGE_TEMPORAL_TLS": "1",
        "FORGE_CODEC_KEYS": format_key("prod-1", new_key()),
        "FORGE_CODEC_TOKEN": "prod-token",
    }.items():
        monkeypatch.setenv(var, value)
    opts = DevOptions(7233, 8233, None, tmp_path / "data", "c", "q", False, True, 5.0)
    assert Settings.from_env().address == "cloud:7233"  # the caller's own settings
    env = _worker_env(opts, "localhost:7233")
    connect = Settings.from_env(env).connect_config()
    assert connect == {"target_host": "localhost:7233", "namespace": "default", "tls": False}
    # the dev key file replaces the caller's keys (for another server)
    assert env["FORGE_CODEC_KEY_FILE"] == str(tmp_path / "data" / "codec.key")
    assert "FORGE_CODEC_KEYS" not in env and "FORGE_CODEC_TOKEN" not in env


def test_the_dev_key_is_made_once_owner_only_and_reused(tmp_path: Path) -> None:
    from forge.services.dev import dev_keys

    data = tmp_path / "data"
    first = dev_keys(data)
    path = data / "codec.key"
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    assert first.current is not None and len(first.get(first.current) or b"") == 32
    again = dev_keys(data)  # the next start: the same key, so the history stays readable
    assert again == first
    path.write_text("# emptied by hand\n")
    with pytest.raises(DevError, match="holds no key"):
        dev_keys(data)
