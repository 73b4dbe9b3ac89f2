#!/usr/bin/env bash
# Drive a Forge cluster with nothing but the `temporal` CLI: every signal and update
# of the cluster workflow, in an order that works on a running cluster (`forge dev`).
# The same commands, with the JSON each takes, are in README.md ("Any Temporal client").
#
#   export TEMPORAL_ADDRESS=localhost:7233                # Temporal's own variables
#   export TEMPORAL_CODEC_ENDPOINT=http://127.0.0.1:8234  # `forge dev` prints it
#   bash examples/temporal-cli.sh
#
# TEMPORAL_CODEC_ENDPOINT is what makes the big answers readable (the status query,
# history): Forge compresses payloads of 512 bytes or more. WF picks the cluster
# workflow (forge-cluster-<cluster>); TEMPORAL picks the CLI binary.
set -euo pipefail
WF=${WF:-forge-cluster-default}
temporal=${TEMPORAL:-temporal}
say() { printf '\n# %s\n' "$*"; }
t() { "$temporal" "$@"; }

say "register_node (signal): two nodes; placed onto from the next pass"
t workflow signal -w "$WF" --name register_node --input '{"nodes": [{"id": "cli-node-1", "cpu": 8000, "memory": 16384, "labels": {"zone": "a"}}, {"id": "cli-node-2", "cpu": 8000, "memory": 16384}]}'

say "submit_job (update): answers once the job's replicas are planned"
t workflow update execute -w "$WF" --name submit_job --input '{"job": {"name": "cli-batch", "groups": [{"name": "workers", "scaling": {"desired": 2, "max": 4}, "tasks": [{"name": "worker", "resources": {"cpu": 1000, "memory": 1024}}]}]}, "wait": true}'

say "submit_jobs (update): many jobs at once; answers when stored (wait false)"
t workflow update execute -w "$WF" --name submit_jobs --input '{"jobs": [{"name": "cli-etl", "groups": [{"name": "etl", "tasks": [{"name": "etl", "resources": {"cpu": 500, "memory": 512}}]}]}], "wait": false}'

say "scale (update): set a group's desired count"
t workflow update execute -w "$WF" --name scale --input '{"job_id": "cli-batch", "group": "workers", "count": 3}'

say "report_failed (update): replicas that failed; they are restarted with backoff"
t workflow update execute -w "$WF" --name report_failed --input '{"workload_ids": ["cli-batch/workers/0"]}'

say "apply_queues (update): a queue with a quota of one cpu; a job in it binds one replica, the other is queued"
t workflow update execute -w "$WF" --name apply_queues --input '{"queues": [{"name": "cli-team", "quota": {"cpu": {"nominal": 1000}}}], "delete": []}'
t workflow update execute -w "$WF" --name submit_job --input '{"job": {"name": "cli-queued", "queue": "cli-team", "groups": [{"name": "q", "scaling": {"desired": 2, "max": 2}, "tasks": [{"name": "q", "resources": {"cpu": 1000, "memory": 256}}]}]}, "wait": true}'

say "promote (update): a changed spec rolls out; with canary 1 it waits for this"
t workflow update execute -w "$WF" --name submit_job --input '{"job": {"name": "cli-web", "groups": [{"name": "web", "scaling": {"desired": 2, "max": 2}, "update": {"canary": 1}, "tasks": [{"name": "web", "env": {"V": "1"}, "resources": {"cpu": 500, "memory": 256}}]}]}, "wait": true}'
t workflow update execute -w "$WF" --name submit_job --input '{"job": {"name": "cli-web", "groups": [{"name": "web", "scaling": {"desired": 2, "max": 2}, "update": {"canary": 1}, "tasks": [{"name": "web", "env": {"V": "2"}, "resources": {"cpu": 500, "memory": 256}}]}]}, "wait": true}'
t workflow update execute -w "$WF" --name promote --input '{"job_id": "cli-web"}'

say "status (query; needs the codec endpoint when the answer is big)"
t workflow query -w "$WF" --name status

say "job_state (query): where one job stands (a batch job: running, complete or failed)"
t workflow query -w "$WF" --name job_state --input '"cli-batch"'

say "queues (query): each queue's quota, usage, jobs and queued replicas"
t workflow query -w "$WF" --name queues

say "drain_node (update): move a node's replicas off it; answers after that pass"
t workflow update execute -w "$WF" --name drain_node --input '{"node_id": "cli-node-1"}'

say "node_lost (signal): a node is gone; its replicas move now"
t workflow signal -w "$WF" --name node_lost --input '{"node_id": "cli-node-2"}'

say "remove_node (signal): unregister a node"
t workflow signal -w "$WF" --name remove_node --input '{"node_id": "cli-node-1"}'

say "stop_job (update): release a job's replicas"
t workflow update execute -w "$WF" --name stop_job --input '{"job_id": "cli-etl"}'

say "loop_budget (signal): the work budget of a pass (the watchdog's, after repeated deadlocks)"
t workflow signal -w "$WF" --name loop_budget --input '{"max_work": 300000}'

say "loop_reset (signal): what the watchdog tells a run it reset (counted, shown by status)"
t workflow signal -w "$WF" --name loop_reset --input '{"from_run": "by-hand", "cause": "a test of the reset notice"}'
