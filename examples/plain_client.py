"""Drive a Forge cluster from a plain Temporal client: no Forge import anywhere.

    python examples/plain_client.py --address localhost:7233 \\
        --codec-endpoint http://127.0.0.1:8234

Forge's control loop is one Temporal workflow per cluster (``forge-cluster-NAME``),
so anything that speaks Temporal can drive it: this script registers two nodes by
**signal** (``register_node``), starts a job by **update** (``submit_job``, which
answers once the job's replicas are planned) and reads the cluster's **status
query**. The messages are plain JSON; README.md lists every signal and update with
its shape.

Forge compresses payloads of 512 bytes or more (``binary/zlib``), so a client with
Temporal's default data converter cannot read a big result by itself (the status
query answers ``Unknown payload encoding binary/zlib``). ``--codec-endpoint`` makes
it send payloads through Forge's codec server (``forge codec-server``; ``forge
dev`` runs one), which is all a client in any language needs. Small answers, like
the update's result, need no codec.

Needs: ``pip install temporalio`` and a running cluster workflow (``forge dev``,
or ``forge cluster start``).
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import json
import sys
import urllib.request
from collections.abc import Sequence

from google.protobuf import json_format
from temporalio.api.common.v1 import Payload, Payloads
from temporalio.client import Client, WorkflowUpdateFailedError
from temporalio.converter import DataConverter, PayloadCodec
from temporalio.service import RPCError


class RemoteCodec(PayloadCodec):
    """Temporal's remote codec protocol, client side: the payloads go to the codec
    server as ``{"payloads": [...]}`` (protobuf JSON) and come back transformed."""

    def __init__(self, endpoint: str, namespace: str) -> None:
        self.endpoint = endpoint.rstrip("/")
        self.namespace = namespace

    async def encode(self, payloads: Sequence[Payload]) -> list[Payload]:
        return await asyncio.to_thread(self._call, "encode", payloads)

    async def decode(self, payloads: Sequence[Payload]) -> list[Payload]:
        return await asyncio.to_thread(self._call, "decode", payloads)

    def _call(self, action: str, payloads: Sequence[Payload]) -> list[Payload]:
        body = json_format.MessageToJson(Payloads(payloads=payloads)).encode()
        request = urllib.request.Request(
            f"{self.endpoint}/{action}",
            data=body,
            headers={"Content-Type": "application/json", "X-Namespace": self.namespace},
        )
        with urllib.request.urlopen(request, timeout=30) as reply:
            out = Payloads()
            json_format.Parse(reply.read(), out)
        return list(out.payloads)


# The JSON Forge expects (units: millicores of CPU, MiB of memory).
NODES = [
    {"id": "plain-cpu-1", "cpu": 8000, "memory": 16384, "labels": {"zone": "a"}},
    {
        "id": "plain-gpu-1",
        "cpu": 32000,
        "memory": 131072,
        "gpus": [
            {"id": "gpu0", "model": "A100", "memory": 40960},
            {"id": "gpu1", "model": "A100", "memory": 40960},
        ],
    },
]
JOB = {
    "id": "plain-web",
    "name": "plain-web",
    "priority": 60,
    "groups": [
        {
            "name": "api",
            "scaling": {"desired": 2, "max": 4},
            "tasks": [
                {
                    "name": "server",
                    "command": ["python", "-m", "http.server", "8080"],
                    "resources": {"cpu": 500, "memory": 256},
                }
            ],
        }
    ],
}


async def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[1] if __doc__ else None)
    p.add_argument("--address", default="localhost:7233")
    p.add_argument("--namespace", default="default")
    p.add_argument("--cluster", default="default")
    p.add_argument("--codec-endpoint", help="Forge codec server URL (to read big payloads)")
    args = p.parse_args(argv)

    converter = DataConverter.default  # Temporal's own, not Forge's
    if args.codec_endpoint:
        codec = RemoteCodec(args.codec_endpoint, args.namespace)
        converter = dataclasses.replace(converter, payload_codec=codec)
    client = await Client.connect(args.address, namespace=args.namespace, data_converter=converter)
    handle = client.get_workflow_handle(f"forge-cluster-{args.cluster}")

    try:
        # Signals cannot answer: Forge applies them on its next pass.
        await handle.signal("register_node", {"nodes": NODES})
        print(f"signalled register_node: {', '.join(n['id'] for n in NODES)}")

        # An update answers: once the job's replicas are planned (wait: true).
        result = await handle.execute_update("submit_job", {"job": JOB, "wait": True})
        print(f"submit_job answered: {json.dumps(result, sort_keys=True)}")
    except RPCError as err:
        print(f"plain_client: {handle.id}: {err.message} (is it running?)", file=sys.stderr)
        return 1
    except WorkflowUpdateFailedError as err:
        print(f"plain_client: submit_job refused: {err.cause}", file=sys.stderr)
        return 2

    if args.codec_endpoint:
        status = await handle.query("status")
        summary = status["summary"]
        keys = ("nodes", "jobs", "desired", "bound", "pending")
        print("status: " + ", ".join(f"{k} {summary[k]}" for k in keys))
    return 0


if __name__ == "__main__":
    sys.exit(asyncio.run(main()))
