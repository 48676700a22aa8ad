"""The attacks of the hardening reviews as reusable functions against
given addresses: a catalog, one module per attacker.

Why a catalog and not only tests: each attack was first written inline in a test against an
in-process server, where the test can also look inside (what the server buffered, why it
closed a connection). ``trio-ha chaos hostile`` makes the same attacks on a real cluster in
child processes, where only what a peer sees counts — did the node answer, did it close the
connection, is it still up. So the attack is here, once, against an address; the tests call
it and keep their inside checks; the command calls it and reports what the peer saw.

Every attack is bounded in count and time (``seconds``: it returns by then whatever the node
does), opens its own connections and closes them before it returns, and reports an
``AttackOutcome``: what was sent, how many connections the node closed or refused, what it
answered. The outcome does not judge: a node's limits decide what it closes and when (a
name server with a 30 s request timeout does not close a slowloris peer within a 5 s attack,
and that is fine); the caller checks what matters to it.

The attackers, one module each, by the port they reach and what they attack there:

* ``remoting``, a remoting port's connections (a broker's or a name server's): clients that
  never read their replies (``non_reading_clients``), frames declared large and sent in part
  (``partial_frames``), a frame a byte at a time (``slowloris``), long-polled pulls whose
  client goes away (``abandon_long_polls``) or hangs up behind requests the node no longer
  reads (``leave_with_requests_unsent``), frames that are not frames (``bad_frames``), more
  connections than the node serves (``connection_flood``, on a master's HA port too);
* ``broker``, a broker's handlers, by a client that speaks the protocol well: requests a
  broker must refuse (``invalid_input``), a flood of groups, topics and offsets that do not
  exist (``metadata_flood``), every queue lock (``lock_hoarding``), the group table filled
  by heartbeats (``group_flood``), an offset past the end committed to a slave
  (``offset_past_the_end_through_the_slave``); the requests themselves, valid and not, are
  written in ``requests``;
* ``replication``, a master's HA port, by a slave that lies: a flood of reports
  (``ha_report_flood``), garbage, torn reports, acks beyond the log or backwards, a request
  beyond the log, the log end presented on a fresh connection (``rogue_slave``), squatters
  on every HA slot (``ha_slot_squatters``);
* ``rogue_master``, a slave's HA client: ``RogueHAMaster``, a listener that plays master to
  a slave pointed at it, with scripts such as ``start_at`` (a first frame where no log can
  begin);
* ``namesrv``, the name server's routes: a broker name taken over
  (``broker_name_takeover``);
* ``acl``, the ACL's signatures: a captured signed request replayed as another
  (``replay_signatures``);
* ``metrics``, the metrics endpoint: idle and slowloris crowds while it is scraped
  (``crowd_the_metrics``).

What they share — the outcome, its tally, raw connections — is ``_common``.

The package re-exports every name its callers use, so they write ``hostile.slowloris(...)``:
the tests and ``trio-ha chaos hostile`` name an attack by what it does, and the list above
says where it lives.
"""

from __future__ import annotations

from ._common import (
    AttackOutcome,
    NodeAnswer,
    close_quietly,
    closed_by_node,
    code_name,
    connect_raw,
    node_has_closed,
    read_until_closed,
    receive_exactly,
    send_until_closed,
    sorted_counts,
)
from .acl import replay_signatures, replayed_as
from .broker import (
    group_flood,
    invalid_input,
    lock_hoarding,
    metadata_flood,
    offset_past_the_end_through_the_slave,
)
from .metrics import crowd_the_metrics, scrape_status
from .namesrv import broker_name_takeover
from .remoting import (
    abandon_long_polls,
    bad_frames,
    connection_flood,
    leave_with_requests_unsent,
    non_reading_clients,
    partial_frames,
    slowloris,
)
from .replication import (
    PresentedEnd,
    ask_beyond_the_log,
    ha_report_flood,
    ha_slot_squatters,
    open_ha_peer,
    present_log_end,
    rogue_slave,
    stream_reports,
)
from .requests import (
    BAD_GROUP,
    BAD_TOPIC,
    LONG_TOPIC,
    commit_request,
    create_topic_request,
    heartbeat_request,
    invalid_requests,
    lock_request,
    pull_request,
    request_frames,
    send_request,
    subscription_group_request,
)
from .rogue_master import RogueHAMaster, Script, start_at

__all__ = [
    "BAD_GROUP", "BAD_TOPIC", "LONG_TOPIC", "AttackOutcome", "NodeAnswer", "PresentedEnd",
    "RogueHAMaster", "Script", "abandon_long_polls", "ask_beyond_the_log", "bad_frames",
    "broker_name_takeover", "close_quietly", "closed_by_node", "code_name", "commit_request",
    "connect_raw", "connection_flood", "create_topic_request", "crowd_the_metrics",
    "group_flood", "ha_report_flood", "ha_slot_squatters", "heartbeat_request",
    "invalid_input", "invalid_requests", "leave_with_requests_unsent", "lock_hoarding",
    "lock_request", "metadata_flood", "node_has_closed", "non_reading_clients",
    "offset_past_the_end_through_the_slave", "open_ha_peer", "partial_frames",
    "present_log_end", "pull_request", "read_until_closed", "receive_exactly",
    "replay_signatures", "replayed_as", "request_frames", "rogue_slave", "scrape_status",
    "send_request", "send_until_closed", "slowloris", "sorted_counts", "start_at",
    "stream_reports", "subscription_group_request",
]
