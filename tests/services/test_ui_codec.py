"""Forge from the outside: the Web UI in a real browser, the raw `temporal` CLI and a
plain `temporalio` client, all against one `forge dev` (dev server with its UI, codec
server, a real worker) on free ports.

The tests run in file order and build on each other: the plain client registers
nodes and starts a job, the CLI script exercises every signal and update, and then
the history, the queries and the UI have something real to show.
"""

from __future__ import annotations

import ast
import asyncio
import base64
import contextlib
import json
import os
import queue
import re
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any

import pytest
from google.protobuf import json_format
from temporalio.api.common.v1 import Payload, Payloads
from temporalio.client import Client
from temporalio.converter import DataConverter

from forge.wire.encryption import ENCRYPTED, KEY_ID, CodecKeys
from tests.cdp import Browser, chromium_binary

pytestmark = pytest.mark.slow

REPO = Path(__file__).resolve().parents[2]
BIN = Path(sys.executable).parent
WF = "forge-cluster-default"


@dataclass
class Dev:
    address: str
    ui: str
    codec: str
    out: list[str]
    data: Path

    def temporal(self, *args: str, codec: bool = True, check: bool = True) -> str:
        argv = [str(BIN / "temporal"), *args, "--address", self.address]
        if codec:
            argv += ["--codec-endpoint", self.codec]
        proc = subprocess.run(argv, capture_output=True, text=True, timeout=120, env=_env())
        if check:
            assert proc.returncode == 0, f"{argv}\n{proc.stdout}\n{proc.stderr}"
        return proc.stdout


def _env() -> dict[str, str]:
    # the caller's FORGE_* / TEMPORAL_* settings must not redirect anything here
    return {k: v for k, v in os.environ.items() if not k.startswith(("FORGE_", "TEMPORAL_"))}


def _free_ports(n: int) -> list[int]:
    socks = [socket.socket() for _ in range(n)]
    try:
        for s in socks:
            s.bind(("127.0.0.1", 0))
        return [int(s.getsockname()[1]) for s in socks]
    finally:
        for s in socks:
            s.close()


def _pump(stream: IO[str], into: queue.Queue[str]) -> None:
    for line in stream:
        into.put(line)


@pytest.fixture(scope="module")
def dev(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Dev]:
    port, ui_port, codec_port = _free_ports(3)
    data = tmp_path_factory.mktemp("forge-dev") / "data"
    argv = [
        str(BIN / "forge"), "dev", "--port", str(port), "--ui-port", str(ui_port),
        "--codec-port", str(codec_port), "--data-dir", str(data),
    ]  # fmt: skip
    proc = subprocess.Popen(
        argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, cwd=REPO, env=_env()
    )
    assert proc.stdout is not None
    lines: queue.Queue[str] = queue.Queue()
    threading.Thread(target=_pump, args=(proc.stdout, lines), daemon=True).start()
    seen: list[str] = []
    try:
        deadline = time.monotonic() + 180
        while not any("running; Ctrl-C" in line for line in seen):
            left = deadline - time.monotonic()
            assert left > 0 and proc.poll() is None, "forge dev did not come up:\n" + "".join(seen)
            with contextlib.suppress(queue.Empty):
                seen.append(lines.get(timeout=min(left, 1.0)))
        yield Dev(
            address=f"localhost:{port}",
            ui=f"http://localhost:{ui_port}",
            codec=f"http://127.0.0.1:{codec_port}",
            out=seen,
            data=data,
        )
    finally:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        for name in ("codec.log", "worker.log"):
            with contextlib.suppress(OSError):
                print(f"--- {name} ---\n{(data / name).read_text()[-3000:]}")


# ------------------------------------------------------------------------ forge dev


def test_forge_dev_prints_the_codec_endpoint_and_gives_it_to_the_ui(dev: Dev) -> None:
    banner = "".join(dev.out)
    assert f"codec:     {dev.codec} " in banner
    with urllib.request.urlopen(f"{dev.codec}/health", timeout=10) as r:
        assert r.status == 200
    # the UI server hands its settings to the page; the codec endpoint must be ours
    with urllib.request.urlopen(f"{dev.ui}/api/v1/settings", timeout=10) as r:
        settings = json.load(r)
    assert settings["Codec"]["Endpoint"] == dev.codec


# ------------------------------------------------------------------ plain clients


def test_the_plain_client_example_adds_nodes_and_starts_a_job(dev: Dev) -> None:
    script = REPO / "examples" / "plain_client.py"
    imported = {
        ((n.module or "") if isinstance(n, ast.ImportFrom) else a.name).split(".")[0]
        for n in ast.walk(ast.parse(script.read_text()))
        if isinstance(n, ast.Import | ast.ImportFrom)
        for a in n.names
    }
    assert not imported & {"forge", "workflows", "activities", "worker"}, imported

    argv = [sys.executable, str(script), "--address", dev.address, "--codec-endpoint", dev.codec]
    proc = subprocess.run(argv, capture_output=True, text=True, timeout=120, env=_env(), cwd="/")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    out = proc.stdout
    assert "signalled register_node: plain-cpu-1, plain-gpu-1" in out
    answered = json.loads(out.split("submit_job answered: ", 1)[1].splitlines()[0])
    assert answered["job_id"] == "plain-web" and answered["bound"] == answered["desired"] == 2
    status = re.search(r"status: nodes (\d+), jobs (\d+), desired \d+, bound \d+, pending 0", out)
    assert status and int(status.group(1)) >= 2 and int(status.group(2)) >= 1, out


def test_the_temporal_cli_example_sends_every_signal_and_update(dev: Dev) -> None:
    env = {
        **_env(),
        "TEMPORAL": str(BIN / "temporal"),
        "TEMPORAL_ADDRESS": dev.address,
        "TEMPORAL_CODEC_ENDPOINT": dev.codec,
    }
    proc = subprocess.run(
        ["bash", str(REPO / "examples" / "temporal-cli.sh")],
        capture_output=True,
        text=True,
        timeout=300,
        env=env,
    )
    out = proc.stdout
    assert proc.returncode == 0, out + proc.stderr
    assert re.search(r"Result +map\[bound:2 desired:2 job_id:cli-batch", out), out
    assert re.search(r"Result +map\[bound:3 desired:3 job_id:cli-batch", out), out  # scaled
    assert re.search(r"Result +map\[accepted:1\]", out), out  # report_failed
    assert re.search(r"Result +map\[promoted:\[cli-web/web\]\]", out), out  # the canary
    assert re.search(r"Result +map\[bound:1 desired:2 job_id:cli-queued", out), out  # quota
    _, status_out, state_out, queues_out = out.split("QueryResult", 3)
    status = json.loads(status_out.splitlines()[0])
    assert {"cli-node-1", "cli-node-2"} <= {n["id"] for n in status["nodes"]}
    state = json.loads(state_out.splitlines()[0])  # job_state: plain JSON, any client
    assert (state["job_id"], state["state"], state["desired"]) == ("cli-batch", "service", 3)
    (team,) = json.loads(queues_out.splitlines()[0])["queues"]  # the queue, as plain JSON
    assert (team["spec"]["name"], team["usage"]["cpu"], team["queued"]) == ("cli-team", 1000, 1)
    assert out.count("Signal workflow succeeded") == 5


def test_the_docs_document_every_signal_and_update_with_a_command_the_script_runs() -> None:
    from forge.wire import contract as c
    from forge.wire import queues

    readme = (REPO / "docs" / "user-guide.md").read_text()  # "Any Temporal client"
    script = (REPO / "examples" / "temporal-cli.sh").read_text()
    names = {
        v for m in (c, queues) for k, v in vars(m).items() if k.startswith(("SIGNAL_", "UPDATE_"))
    }
    commands = re.findall(r"^(temporal workflow (?:signal|update execute) .+)$", readme, re.M)
    documented = {re.search(r"--name (\w+)", cmd).group(1) for cmd in commands}  # type: ignore[union-attr]
    assert documented == names
    for cmd in commands:
        assert cmd.replace(f"-w {WF}", '-w "$WF"').removeprefix("temporal ") in script, cmd


def test_the_forge_cli_drives_the_same_cluster(dev: Dev) -> None:
    # the worker's store: status reads what the loop publishes there; the dev key,
    # as the banner's export line says
    env = {
        **_env(),
        "FORGE_TEMPORAL_ADDRESS": dev.address,
        "FORGE_DATA_DIR": str(dev.data),
        "FORGE_CODEC_KEY_FILE": str(dev.data / "codec.key"),
    }
    assert f"FORGE_CODEC_KEY_FILE={dev.data / 'codec.key'}" in "".join(dev.out)
    forge = str(BIN / "forge")
    for argv in (
        [forge, "node", "add", "--file", "examples/nodes.yaml"],
        [forge, "job", "run", "examples/web.yaml"],
        [forge, "status", "--json"],
    ):
        proc = subprocess.run(argv, capture_output=True, text=True, timeout=120, env=env, cwd=REPO)
        assert proc.returncode == 0, proc.stdout + proc.stderr
    nodes = {n["id"] for n in json.loads(proc.stdout)["nodes"]}
    assert {"plain-cpu-1", "plain-gpu-1", "gpu-a100-1"} <= nodes


# -------------------------------------------------------------------- the CLI


def test_temporal_query_status_prints_readable_json_through_the_codec(dev: Dev) -> None:
    out = dev.temporal("workflow", "query", "-w", WF, "--name", "status", "-o", "json")
    status = json.loads(out)
    result = status["queryResult"][0] if "queryResult" in status else status
    assert result["summary"]["nodes"] >= 2
    assert "plain-cpu-1" in {n["id"] for n in result["nodes"]}


def _persist_inputs(history: dict[str, Any]) -> dict[int, Payload]:
    """event id -> the input of each persist activity in a `temporal workflow show
    -o json` history."""
    out = {}
    for event in history["events"]:
        attrs = event.get("activityTaskScheduledEventAttributes")
        if attrs and attrs["activityType"]["name"] == "forge.persist":
            message = Payloads()
            json_format.ParseDict(attrs["input"], message)
            out[int(event["eventId"])] = message.payloads[0]
    return out


def _encoded_persists(dev: Dev) -> dict[int, dict[str, Any]]:
    """event id -> decoded input, for the persists Forge encoded (compressed if big
    enough, then encrypted: `forge dev` encrypts with its key)."""
    raw = json.loads(dev.temporal("workflow", "show", "-w", WF, "-o", "json", codec=False))
    packed = {i for i, p in _persist_inputs(raw).items() if p.metadata["encoding"] == ENCRYPTED}
    decoded = _persist_inputs(json.loads(dev.temporal("workflow", "show", "-w", WF, "-o", "json")))
    return {i: json.loads(decoded[i].data) for i in sorted(packed)}


def _big_persist(dev: Dev, prefix: str) -> tuple[int, dict[str, Any]]:
    """Register a dozen new nodes (by a CLI signal, encoded through the codec) and
    wait for the pass that persists them: a payload big enough to be compressed,
    near the end of the history. Its event id and decoded input."""
    nodes = [
        {"id": f"{prefix}-{i}", "cpu": 4000, "memory": 8192, "labels": {"rack": prefix}}
        for i in range(12)
    ]
    dev.temporal(
        "workflow", "signal", "-w", WF, "--name", "register_node",
        "--input", json.dumps({"nodes": nodes}),
    )  # fmt: skip
    deadline = time.monotonic() + 60
    while True:
        for event_id, persisted in _encoded_persists(dev).items():
            if any(n["id"] == f"{prefix}-0" for n in persisted["nodes_upsert"]):
                return event_id, persisted
        assert time.monotonic() < deadline, f"no compressed persist of the {prefix} nodes"
        time.sleep(0.5)  # poll for the next pass


def test_temporal_show_and_metadata_decode_what_forge_compressed(dev: Dev) -> None:
    _big_persist(dev, "show")
    packed = _encoded_persists(dev)
    assert packed and all(i["cluster"] == "default" and "pass_no" in i for i in packed.values())
    decoded = json.loads(dev.temporal("workflow", "show", "-w", WF, "-o", "json"))
    assert "YmluYXJ5L3psaWI=" not in json.dumps(decoded)  # base64 of binary/zlib
    assert "YmluYXJ5L2VuY3J5cHRlZA==" not in json.dumps(decoded)  # of binary/encrypted
    inputs = [json.loads(p.data) for p in _persist_inputs(decoded).values()]
    assert any(i["bind"] for i in inputs)

    detailed = dev.temporal("workflow", "show", "-w", WF, "--detailed")
    assert re.search(r"input\[0\]\.bind\[0\]\[0\]: \S+", detailed)

    metadata = dev.temporal("workflow", "metadata", "-w", WF)
    assert "Forge cluster" in metadata and "replicas bound:" in metadata
    assert "ClusterWorkflow" in dev.temporal("workflow", "describe", "-w", WF)


def _payloads(node: Any) -> list[dict[str, Any]]:
    """Every payload (``{"metadata", "data"}``) anywhere in a JSON history, but
    those no codec touches (``_UNCODED``)."""
    if isinstance(node, list):
        return [p for item in node for p in _payloads(item)]
    if not isinstance(node, dict):
        return []
    if "metadata" in node and "encoding" in node["metadata"] and "data" in node:
        return [node]
    return [p for k, v in node.items() if k not in _UNCODED for p in _payloads(v)]


#: What no payload codec touches: search attributes (the server indexes them) and
#: markers (the SDK core writes a ``workflow.patched`` marker's details, the patch
#: id, itself).
_UNCODED = ("searchAttributes", "markerRecordedEventAttributes")


def test_make_run_encrypts_every_payload_with_the_key_it_made(dev: Dev) -> None:
    """What `temporal workflow show` gives anyone who can read the namespace but
    has no codec: ciphertext under the dev key, no job, node or env in clear."""
    keys = CodecKeys.parse((dev.data / "codec.key").read_text())
    assert "encrypted: with key " + str(keys.current) in "".join(dev.out)
    text = dev.temporal("workflow", "show", "-w", WF, "-o", "json", codec=False)
    payloads = _payloads(json.loads(text))
    assert len(payloads) > 20
    encodings = {base64.b64decode(p["metadata"]["encoding"]) for p in payloads}
    assert encodings == {ENCRYPTED}, encodings
    ids = {base64.b64decode(p["metadata"][KEY_ID]).decode() for p in payloads}
    assert ids == {keys.current}
    for clear in ("plain-cpu-1", "cli-batch", "nodes_upsert", '"V": "2"'):
        assert clear not in text  # names the plain client and the CLI script sent


async def test_a_default_converter_client_reads_forge_payloads_through_decode(dev: Dev) -> None:
    await asyncio.to_thread(_big_persist, dev, "plain")
    client = await Client.connect(dev.address)  # Temporal's default data converter
    history = await client.get_workflow_handle(WF).fetch_history()
    payloads = [
        e.activity_task_scheduled_event_attributes.input.payloads[0]
        for e in history.events
        if e.activity_task_scheduled_event_attributes.activity_type.name == "forge.persist"
    ]
    packed = [p for p in payloads if p.metadata["encoding"] == ENCRYPTED]
    assert packed
    with pytest.raises(Exception, match="binary/encrypted"):
        await DataConverter.default.decode(packed)

    body = json_format.MessageToJson(Payloads(payloads=packed)).encode()
    req = urllib.request.Request(
        f"{dev.codec}/decode",
        data=body,
        headers={"Content-Type": "application/json", "X-Namespace": "default"},
    )
    with urllib.request.urlopen(req, timeout=30) as r:
        plain = Payloads()
        json_format.Parse(r.read(), plain)
    values = await DataConverter.default.decode(list(plain.payloads))
    assert len(values) == len(packed)
    assert all(v["cluster"] == "default" and "bind" in v for v in values)


# ------------------------------------------------------------------ the Web UI


def test_the_web_ui_shows_details_a_decoded_persist_input_and_the_status_query(
    dev: Dev, tmp_path: Path
) -> None:
    binary = chromium_binary()
    if binary is None:
        pytest.fail(
            "headless Chromium is missing: run `bash scripts/ensure-chromium.sh` "
            "(make test does) or set FORGE_CHROMIUM",
            pytrace=False,
        )
    event_id, persisted = _big_persist(dev, "ui")  # recent: on the history's first page
    shots = tmp_path / "screenshots"
    shots.mkdir()
    with Browser(binary, tmp_path / "chromium", height=1200) as b:
        b.goto(f"{dev.ui}/namespaces/default/workflows/{WF}")
        b.wait_for_text("User Metadata", timeout=60)

        # current details: the workflow's metadata query, compressed, through the codec
        # (the details render in steps: wait for the very text asserted on)
        b.click_text("User Metadata")
        details = r"Forge cluster\s+default\s+\(run \d+, generation \d+\)"
        text = b.wait_until(
            lambda t: "replicas bound:" in t and re.search(details, t) is not None,
            timeout=60,
            what="the current details",
        )
        b.screenshot(shots / "details.png")
        assert re.search(details, text) and "replicas bound:" in text, text

        # a compressed persist input, expanded in the event history
        b.click_text("Event History")
        b.wait_for_text("forge.persist", timeout=60)
        row = f"""Array.from(document.querySelectorAll('tr[data-testid=event-summary-row]'))
            .find(r => r.innerText.trim().split(/\\s/)[0] === '{event_id}')"""
        b.wait_for(f"!!({row})", what=f"event {event_id} in the history table")
        b.evaluate(f"(() => {{ const r = {row}; r.click(); r.scrollIntoView(); }})()")
        shown = (f'"pass_no": {persisted["pass_no"]}', '"cluster": "default"', '"id": "ui-0"')
        text = b.wait_until(
            lambda t: all(s in t for s in shown), timeout=60, what="the decoded persist input"
        )
        b.screenshot(shots / "persist.png")
        assert all(s in text for s in shown), text
        assert "binary/zlib" not in text and "binary/encrypted" not in text

        # the status query, chosen and run from the Queries tab
        b.click_text("Queries")
        b.wait_for_text("Run Query", timeout=60)
        # (the menu re-renders as it opens: click until the select shows the choice)
        b.wait_for(
            """(() => {
              const button = document.querySelector('button[aria-controls=query-select-select]');
              if (document.getElementById('query-select').value === 'status') return true;
              const options = document.querySelectorAll('#query-select-select [role=option]');
              const status = Array.from(options).find(o => o.innerText.trim() === 'status');
              if (status && button.getAttribute('aria-expanded') === 'true') status.click();
              else button.click();
              return false;
            })()""",
            what="the status query chosen",
        )
        b.click_text("Run Query", "button")
        answer = ('"last_pass"', '"summary"', '"bound"')
        text = b.wait_until(
            lambda t: all(s in t for s in answer), timeout=60, what="the status query's answer"
        )
        b.screenshot(shots / "query.png")
        assert all(s in text for s in answer), text
    print(f"screenshots: {sorted(p.name for p in shots.iterdir())} in {shots}")
    for shot in shots.iterdir():
        assert shot.stat().st_size > 10_000  # a rendered page, not a blank one


def test_a_periodic_job_is_a_schedule_on_the_web_uis_schedules_page(
    dev: Dev, tmp_path: Path
) -> None:
    binary = chromium_binary()
    if binary is None:
        pytest.fail("headless Chromium is missing: run `bash scripts/ensure-chromium.sh`")
    env = {
        **_env(),
        "FORGE_TEMPORAL_ADDRESS": dev.address,
        "FORGE_DATA_DIR": str(dev.data),
        "FORGE_CODEC_KEY_FILE": str(dev.data / "codec.key"),
    }
    forge = str(BIN / "forge")

    def cli(*argv: str) -> str:
        proc = subprocess.run(
            [forge, *argv], capture_output=True, text=True, timeout=120, env=env, cwd=REPO
        )
        assert proc.returncode == 0, proc.stdout + proc.stderr
        return proc.stdout

    sid = "forge-periodic-default:nightly-report"
    assert f"nightly-report: scheduled (Temporal Schedule {sid})" in cli(
        "job", "run", "examples/nightly.yaml"
    )
    try:
        with Browser(binary, tmp_path / "chromium", height=1200) as b:
            b.goto(f"{dev.ui}/namespaces/default/schedules")
            text = b.wait_until(
                lambda t: sid in t and "ForgePeriodicJob" in t,
                timeout=60,
                what="the schedule listed with its workflow type",
            )
            b.screenshot(tmp_path / "schedules.png")
            assert sid in text
    finally:
        assert "nightly-report: schedule removed" in cli("job", "stop", "nightly-report")
    assert (tmp_path / "schedules.png").stat().st_size > 10_000
