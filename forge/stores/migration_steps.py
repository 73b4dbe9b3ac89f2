"""The schema's numbered steps, one list per dialect (the DDL; the runner is
:mod:`forge.stores.migrations`).

Steps are append-only: never edit a released step, add a new one. Both dialects
keep the same number of steps so a version number means the same layout in both.
"""

from __future__ import annotations

from typing import LiteralString

from forge.stores.agent_sql import AGENT_STEP, EXIT_CODE_STEP, GPU_USAGE_STEP

__all__ = ["POSTGRES_MIGRATIONS", "SQLITE_MIGRATIONS"]

# Step 5's backfills, the same SQL in both dialects.
_BACKFILL_USAGE: LiteralString = (
    "UPDATE latest_usage SET"
    " status = coalesce((SELECT r.status FROM reports r"
    "  WHERE r.cluster = latest_usage.cluster AND r.seq = latest_usage.seq), status),"
    " message = coalesce((SELECT r.message FROM reports r"
    "  WHERE r.cluster = latest_usage.cluster AND r.seq = latest_usage.seq), message),"
    " node = coalesce((SELECT r.node FROM reports r"
    "  WHERE r.cluster = latest_usage.cluster AND r.seq = latest_usage.seq), node)"
)
_BACKFILL_STATE: LiteralString = (
    "INSERT INTO report_state (cluster, workload_id, status, node, healthy)"
    " SELECT r.cluster, r.workload_id, r.status, r.node, r.healthy FROM reports r"
    " JOIN (SELECT cluster, workload_id, max(seq) AS seq FROM reports"
    "  GROUP BY cluster, workload_id) m ON m.cluster = r.cluster AND m.seq = r.seq"
    " JOIN assignments a ON a.cluster = r.cluster AND a.workload_id = r.workload_id"
    " WHERE a.status <> 'pending'"
)

SQLITE_MIGRATIONS: tuple[tuple[LiteralString, ...], ...] = (
    # 1: the initial layout. Text keys use SQLite's BINARY collation, which orders
    # like Python's str comparison, so paging by id matches the memory store.
    (
        """CREATE TABLE clusters (
            cluster TEXT PRIMARY KEY,
            revision INTEGER NOT NULL DEFAULT 0,
            report_seq INTEGER NOT NULL DEFAULT 0
        ) WITHOUT ROWID""",
        """CREATE TABLE fences (
            cluster TEXT PRIMARY KEY,
            generation INTEGER,
            pass_no INTEGER,
            digest TEXT
        ) WITHOUT ROWID""",
        """CREATE TABLE jobs (
            cluster TEXT NOT NULL,
            job_id TEXT NOT NULL,
            revision INTEGER NOT NULL,
            spec TEXT,
            PRIMARY KEY (cluster, job_id)
        ) WITHOUT ROWID""",
        "CREATE INDEX jobs_by_revision ON jobs (cluster, revision)",
        """CREATE TABLE assignments (
            cluster TEXT NOT NULL,
            workload_id TEXT NOT NULL,
            job TEXT NOT NULL,
            grp TEXT NOT NULL,
            ordinal INTEGER NOT NULL,
            node TEXT NOT NULL,
            gpu_ids TEXT NOT NULL,
            cpu INTEGER NOT NULL,
            memory INTEGER NOT NULL,
            status TEXT NOT NULL,
            PRIMARY KEY (cluster, workload_id)
        ) WITHOUT ROWID""",
        """CREATE TABLE nodes (
            cluster TEXT NOT NULL,
            id TEXT NOT NULL,
            spec TEXT NOT NULL,
            state TEXT NOT NULL,
            PRIMARY KEY (cluster, id)
        ) WITHOUT ROWID""",
        """CREATE TABLE heartbeats (
            cluster TEXT NOT NULL,
            node_id TEXT NOT NULL,
            at REAL NOT NULL,
            PRIMARY KEY (cluster, node_id)
        ) WITHOUT ROWID""",
        """CREATE TABLE reports (
            cluster TEXT NOT NULL,
            seq INTEGER NOT NULL,
            workload_id TEXT NOT NULL,
            status TEXT NOT NULL,
            cpu REAL,
            memory REAL,
            at REAL NOT NULL,
            message TEXT NOT NULL,
            PRIMARY KEY (cluster, seq)
        )""",
        """CREATE TABLE latest_usage (
            cluster TEXT NOT NULL,
            workload_id TEXT NOT NULL,
            seq INTEGER NOT NULL,
            cpu REAL,
            memory REAL,
            at REAL NOT NULL,
            PRIMARY KEY (cluster, workload_id)
        ) WITHOUT ROWID""",
    ),
    # 2: what the loop publishes each pass (summary, pending replicas and why), so
    # status reads the store instead of querying the workflow.
    (
        """CREATE TABLE loop_status (
            cluster TEXT PRIMARY KEY,
            doc TEXT NOT NULL
        ) WITHOUT ROWID""",
        # the node a task report is about: a failure reported for a replica that
        # has moved since (a replayed report) must not restart it where it is now
        "ALTER TABLE reports ADD COLUMN node TEXT NOT NULL DEFAULT ''",
        # a shared GPU's milli-GPU (0: whole devices), so a reload holds the share
        "ALTER TABLE assignments ADD COLUMN gpu_milli INTEGER NOT NULL DEFAULT 0",
    ),
    # 3: rolling updates. The group version a binding runs, and every accepted
    # version of each group's task spec, numbered per group, with what it changed.
    (
        "ALTER TABLE assignments ADD COLUMN version TEXT NOT NULL DEFAULT ''",
        """CREATE TABLE group_versions (
            cluster TEXT NOT NULL,
            job_id TEXT NOT NULL,
            grp TEXT NOT NULL,
            number INTEGER NOT NULL,
            version TEXT NOT NULL,
            revision INTEGER NOT NULL,
            changed TEXT NOT NULL,
            spec TEXT NOT NULL,
            PRIMARY KEY (cluster, job_id, grp, number)
        ) WITHOUT ROWID""",
    ),
    # 4: health checks. A running replica's check verdict as its agent reported it
    # (NULL: the report says nothing of health).
    ("ALTER TABLE reports ADD COLUMN healthy BOOLEAN",),
    # 5: wake for decisions, not for data. Each replica's last decision state
    # (status, node, health verdict: ``forge.stores.base.next_state``) so a report
    # that only repeats it, a usage sample, is not appended to ``reports`` and does
    # not move the sequence the watch follows; its usage still lands in
    # ``latest_usage``, which now keeps its status, message and node itself.
    # Existing rows are filled in from the reports they point at, and bound,
    # non-pending replicas start from their latest report.
    (
        """CREATE TABLE report_state (
            cluster TEXT NOT NULL,
            workload_id TEXT NOT NULL,
            status TEXT NOT NULL,
            node TEXT NOT NULL,
            healthy BOOLEAN,
            PRIMARY KEY (cluster, workload_id)
        ) WITHOUT ROWID""",
        "ALTER TABLE latest_usage ADD COLUMN status TEXT NOT NULL DEFAULT 'running'",
        "ALTER TABLE latest_usage ADD COLUMN message TEXT NOT NULL DEFAULT ''",
        "ALTER TABLE latest_usage ADD COLUMN node TEXT NOT NULL DEFAULT ''",
        _BACKFILL_USAGE,
        _BACKFILL_STATE,
    ),
    # 6: least privilege for agents is PostgreSQL-only (SQLite has no users: whoever
    # can open the file can write all of it), so nothing changes here; the step
    # exists so a version number means the same layout in both dialects.
    (),
    # 7: batch jobs. The ordinals that completed (every task exited 0), written by
    # the persist that releases their binding, so an ordinal completes at most once
    # whatever happens to the run; a job's rows go when the job is deleted.
    (
        """CREATE TABLE completions (
            cluster TEXT NOT NULL,
            workload_id TEXT NOT NULL,
            job TEXT NOT NULL,
            PRIMARY KEY (cluster, workload_id)
        ) WITHOUT ROWID""",
        "CREATE INDEX completions_by_job ON completions (cluster, job)",
    ),
    # 8: a report's exit status (a batch group's ``fail_on_exit`` decides by it);
    # NULL for reports before it and for those that carry none.
    ("ALTER TABLE reports ADD COLUMN exit_code INTEGER",),
    # 9: a usage sample's GPU utilisation (autoscaling on ``gpu``), kept with the
    # latest sample only; NULL: not measured.
    ("ALTER TABLE latest_usage ADD COLUMN gpu REAL",),
    # 10: the cluster's queues (forge.core.quota), written whole by the persist that
    # follows a change, so a run started afresh on the store gets them back
    (
        """CREATE TABLE queues (
            cluster TEXT NOT NULL,
            name TEXT NOT NULL,
            spec TEXT NOT NULL,
            PRIMARY KEY (cluster, name)
        ) WITHOUT ROWID""",
    ),
    # 11: a job's runs read from their decisions (``forge job runs``: each attempt's
    # start, end and exit status), without a scan of every report of the cluster
    ("CREATE INDEX reports_by_workload ON reports (cluster, workload_id, seq)",),
)

POSTGRES_MIGRATIONS: tuple[tuple[LiteralString, ...], ...] = (
    # 1: the initial layout. Keys are COLLATE "C" so ORDER BY / ``> after`` paging
    # follows code-point order on every server, whatever its locale: the same
    # order as SQLite and the memory store (invariant 7 needs a stable order).
    (
        """CREATE TABLE clusters (
            cluster TEXT COLLATE "C" PRIMARY KEY,
            revision BIGINT NOT NULL DEFAULT 0,
            report_seq BIGINT NOT NULL DEFAULT 0
        )""",
        """CREATE TABLE fences (
            cluster TEXT COLLATE "C" PRIMARY KEY,
            generation BIGINT,
            pass_no BIGINT,
            digest TEXT
        )""",
        """CREATE TABLE jobs (
            cluster TEXT COLLATE "C" NOT NULL,
            job_id TEXT COLLATE "C" NOT NULL,
            revision BIGINT NOT NULL,
            spec JSONB,
            PRIMARY KEY (cluster, job_id)
        )""",
        "CREATE INDEX jobs_by_revision ON jobs (cluster, revision)",
        """CREATE TABLE assignments (
            cluster TEXT COLLATE "C" NOT NULL,
            workload_id TEXT COLLATE "C" NOT NULL,
            job TEXT NOT NULL,
            grp TEXT NOT NULL,
            ordinal INTEGER NOT NULL,
            node TEXT NOT NULL,
            gpu_ids JSONB NOT NULL,
            cpu BIGINT NOT NULL,
            memory BIGINT NOT NULL,
            status TEXT NOT NULL,
            PRIMARY KEY (cluster, workload_id)
        )""",
        """CREATE TABLE nodes (
            cluster TEXT COLLATE "C" NOT NULL,
            id TEXT COLLATE "C" NOT NULL,
            spec JSONB NOT NULL,
            state TEXT NOT NULL,
            PRIMARY KEY (cluster, id)
        )""",
        """CREATE TABLE heartbeats (
            cluster TEXT COLLATE "C" NOT NULL,
            node_id TEXT COLLATE "C" NOT NULL,
            at DOUBLE PRECISION NOT NULL,
            PRIMARY KEY (cluster, node_id)
        )""",
        """CREATE TABLE reports (
            cluster TEXT COLLATE "C" NOT NULL,
            seq BIGINT NOT NULL,
            workload_id TEXT NOT NULL,
            status TEXT NOT NULL,
            cpu DOUBLE PRECISION,
            memory DOUBLE PRECISION,
            at DOUBLE PRECISION NOT NULL,
            message TEXT NOT NULL,
            PRIMARY KEY (cluster, seq)
        )""",
        """CREATE TABLE latest_usage (
            cluster TEXT COLLATE "C" NOT NULL,
            workload_id TEXT COLLATE "C" NOT NULL,
            seq BIGINT NOT NULL,
            cpu DOUBLE PRECISION,
            memory DOUBLE PRECISION,
            at DOUBLE PRECISION NOT NULL,
            PRIMARY KEY (cluster, workload_id)
        )""",
    ),
    # 2: see the SQLite step
    (
        """CREATE TABLE loop_status (
            cluster TEXT COLLATE "C" PRIMARY KEY,
            doc TEXT NOT NULL
        )""",
        "ALTER TABLE reports ADD COLUMN node TEXT NOT NULL DEFAULT ''",
        "ALTER TABLE assignments ADD COLUMN gpu_milli INTEGER NOT NULL DEFAULT 0",
    ),
    # 3: see the SQLite step
    (
        "ALTER TABLE assignments ADD COLUMN version TEXT NOT NULL DEFAULT ''",
        """CREATE TABLE group_versions (
            cluster TEXT COLLATE "C" NOT NULL,
            job_id TEXT COLLATE "C" NOT NULL,
            grp TEXT COLLATE "C" NOT NULL,
            number INTEGER NOT NULL,
            version TEXT NOT NULL,
            revision BIGINT NOT NULL,
            changed TEXT NOT NULL,
            spec JSONB NOT NULL,
            PRIMARY KEY (cluster, job_id, grp, number)
        )""",
    ),
    # 4: see the SQLite step
    ("ALTER TABLE reports ADD COLUMN healthy BOOLEAN",),
    # 5: see the SQLite step
    (
        """CREATE TABLE report_state (
            cluster TEXT COLLATE "C" NOT NULL,
            workload_id TEXT COLLATE "C" NOT NULL,
            status TEXT NOT NULL,
            node TEXT NOT NULL,
            healthy BOOLEAN,
            PRIMARY KEY (cluster, workload_id)
        )""",
        "ALTER TABLE latest_usage ADD COLUMN status TEXT NOT NULL DEFAULT 'running'",
        "ALTER TABLE latest_usage ADD COLUMN message TEXT NOT NULL DEFAULT ''",
        "ALTER TABLE latest_usage ADD COLUMN node TEXT NOT NULL DEFAULT ''",
        _BACKFILL_USAGE,
        _BACKFILL_STATE,
    ),
    # 6: agents' roles and the functions they may call (``forge.stores.agent_sql``)
    AGENT_STEP,
    # 7: see the SQLite step
    (
        """CREATE TABLE completions (
            cluster TEXT COLLATE "C" NOT NULL,
            workload_id TEXT COLLATE "C" NOT NULL,
            job TEXT COLLATE "C" NOT NULL,
            PRIMARY KEY (cluster, workload_id)
        )""",
        "CREATE INDEX completions_by_job ON completions (cluster, job)",
    ),
    # 8: see the SQLite step; the agents' report function keeps it too
    EXIT_CODE_STEP,
    # 9: see the SQLite step; likewise
    GPU_USAGE_STEP,
    # 10: see the SQLite step
    (
        """CREATE TABLE queues (
            cluster TEXT COLLATE "C" NOT NULL,
            name TEXT COLLATE "C" NOT NULL,
            spec TEXT NOT NULL,
            PRIMARY KEY (cluster, name)
        )""",
    ),
    # 11: see the SQLite step
    ("CREATE INDEX reports_by_workload ON reports (cluster, workload_id, seq)",),
)
