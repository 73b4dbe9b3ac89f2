"""What the agent tells the members of a gang (or a ``rendezvous`` group) about each
other, and when a running member must be told again.

A member's rank, world size and its peers' addresses (:func:`forge.core.taskenv.
peer_env`) come from its group's bindings and the address each member's node
advertises (the ``forge.agent/address`` label). The agent reads the bindings of the
groups it watches in the scan it makes anyway (:meth:`Peers.see`), so telling costs
no extra read per step; a replica of a group not watched yet is told from one read
of its group's bindings.

A running member whose peers moved (a member re-placed on another node after a node
loss, a drain, a scale) is told again by a restart: a distributed job's processes
cannot learn new peers while they run. A member re-placed on the node it had, with
the same peers, is not restarted (the agent sees the same binding).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping

import structlog

from forge.agent.config import ADDRESS_LABEL
from forge.core.models import Assignment, Node, TaskGroup
from forge.core.taskenv import peer_env
from forge.stores.base import AgentStore

__all__ = ["Peers", "find_node"]

log = structlog.get_logger("forge.agent")

GroupKey = tuple[str, str]
#: Bindings read per store call.
PAGE = 5000


class Peers:
    def __init__(
        self,
        store: AgentStore,
        cluster: str,
        me: Callable[[], Node],
        find: Callable[[str], Node | None],
    ) -> None:
        self.store = store
        self.cluster = cluster
        self._me = me
        self._find = find
        #: Groups with a member started here: their bindings are noted in the scan.
        self.watched: set[GroupKey] = set()
        #: This step's scan: each watched group's ordinal -> node.
        self._members: dict[GroupKey, dict[int, str]] = {}
        self._addresses: dict[str, str] = {}
        #: Members started here -> the members they were told about.
        self._told: dict[str, dict[int, str]] = {}
        #: Members waiting to be told -> why (logged once per reason).
        self._waiting: dict[str, str] = {}

    # -- the scan ----------------------------------------------------------------------
    def begin_scan(self) -> None:
        self._members = {key: {} for key in self.watched}

    def see(self, a: Assignment) -> None:
        members = self._members.get((a.job, a.group))
        if members is not None:
            members[a.ordinal] = a.node

    def forget_addresses(self) -> None:
        """Read nodes' addresses afresh (each heartbeat: an agent may come back
        advertising another)."""
        self._addresses.clear()

    # -- telling -----------------------------------------------------------------------
    def env(self, a: Assignment, group: TaskGroup) -> dict[str, str] | None:
        """The peer variables to start ``a`` with; None while they cannot be told
        (a member not bound yet, a node with no address, the store unreadable)."""
        try:
            members = self._group_members(a)
            env = peer_env(
                a.job, a.group, a.ordinal, group.scaling.desired, members, self._lookup(members)
            )
        except Exception as err:
            log.warning("agent.peers_unreadable", workload=a.workload_id, error=str(err))
            return None
        if isinstance(env, str):
            if self._waiting.get(a.workload_id) != env:
                self._waiting[a.workload_id] = env
                log.info("agent.start_waits", workload=a.workload_id, why=env)
            return None
        self._waiting.pop(a.workload_id, None)
        self._told[a.workload_id] = dict(members)
        self.watched.add((a.job, a.group))
        return env

    def moved(self, a: Assignment) -> bool:
        """Whether a member started here was told of peers that have moved since: a
        member bound on another node, or one more member. A member missing from the
        scan (not bound again yet) is no change: the rest keep running until it is
        (and a group scaled down keeps the world size it was told)."""
        told = self._told.get(a.workload_id)
        now = self._members.get((a.job, a.group))
        if told is None or now is None:
            return False
        return any(told.get(rank) != node for rank, node in now.items())

    def told(self, wid: str) -> dict[int, str]:
        """The members ``wid`` was told of when it started (kept in the agent's state
        file with its processes)."""
        return dict(self._told.get(wid, {}))

    def adopt(self, told: Mapping[str, dict[int, str]]) -> None:
        """Members a previous agent started, with what each was told: restarted like
        those started here when their peers have moved (while this agent was down too)."""
        for wid, members in told.items():
            if members:
                self._told[wid] = dict(members)
                self.watched.add(_group_key(wid))

    def forget(self, wid: str) -> None:
        self._told.pop(wid, None)

    def prune(self, bound_here: set[str]) -> None:
        """Forget the members no longer bound here, and stop watching their groups."""
        for wid in [w for w in self._waiting if w not in bound_here]:
            del self._waiting[wid]
        for wid in [w for w in self._told if w not in bound_here]:
            del self._told[wid]
        self.watched = {_group_key(w) for w in self._told}

    # -- reading -----------------------------------------------------------------------
    def _group_members(self, a: Assignment) -> dict[int, str]:
        """Ordinal -> node of ``a``'s group: from this step's scan when the group is
        watched, else one read of its bindings (their ids sort together)."""
        scanned = self._members.get((a.job, a.group))
        if scanned is not None:
            return scanned
        prefix = f"{a.job}/{a.group}/"
        members: dict[int, str] = {}
        after = prefix
        while True:
            page = self.store.assignments(self.cluster, after, PAGE)
            ours = [b for b in page if b.workload_id.startswith(prefix)]
            members.update((b.ordinal, b.node) for b in ours)
            if len(ours) < len(page) or len(page) < PAGE:
                return members
            after = page[-1].workload_id

    def _lookup(self, members: dict[int, str]) -> dict[str, str]:
        """Node -> the address it advertises, for the members' nodes that have one."""
        me = self._me()
        for node_id in sorted(set(members.values()) - set(self._addresses)):
            node = me if node_id == me.id else self._find(node_id)
            address = node.labels.get(ADDRESS_LABEL) if node is not None else None
            if address:
                self._addresses[node_id] = address
        return self._addresses


def _group_key(wid: str) -> GroupKey:
    job, group, _ = wid.split("/", 2)  # names hold no "/"
    return job, group


def find_node(store: AgentStore, cluster: str, node_id: str) -> Node | None:
    after = node_id[:-1]  # every id > its own prefix, so the page starts at or before it
    while True:
        page = store.nodes(cluster, after, 1000)
        for n in page:
            if n.id == node_id:
                return n
            if n.id > node_id:
                return None
        if len(page) < 1000:
            return None
        after = page[-1].id
