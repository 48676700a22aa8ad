"""The confirm offset of a controller-mode store: how far its consume queues are built, and
so what consumers, pulls, max offsets and look-ups may see.

A classic store shows readers its log as far as a crash cannot take it back: what is
written, or what is flushed under SYNC_FLUSH (``MessageStore.confirmed`` is that watermark of
the commitlog). In RocketMQ 5's controller mode a failover may elect a replica that lacks the
master's last bytes, and the old master cuts them when it rejoins (spec ``controller-mode.md``
§3.4); a consumer that had read them would have read messages that no longer exist. So
RocketMQ builds the consume queues only up to the *confirm offset* (``DefaultMessageStore``'s
reput stops at ``CommitLog.getConfirmOffset()``, spec §3.2 step 7): on a master, what every
member of the in-sync set acknowledged (the log end with allAckInSyncStateSet=false or a set
of one); on a slave, the confirm offset its master sends in each transfer frame, capped at its
own log end.

``ConfirmOffset`` is that rule for one store: a watermark of its own (``visible``), which the
dispatcher and the reads follow instead of the commitlog's, kept at or below the commitlog's
(``log``) and moved by whoever knows the confirm offset now. Nothing polls: the log's rises
reach it as a listener (a call, no task switch), and so do the rises of what the in-sync set
answers (the HA service's ``replicated``); a slave's HA client tells it each confirm offset it
is sent. A classic store has none, and its puts, reads and dispatch are as they were.

What it follows changes with the role (``controller_roles`` switches it):

- **the log** (``follow_log``): a store that has no controller role yet (its recovery
  dispatched the whole recovered log at open, as RocketMQ's does after a clean stop; the
  confirm offset is not kept across a restart), and a slave becoming master while it cuts a
  torn tail and its queues catch up: an elected master's in-sync set is itself alone
  (RocketMQ's election names ``{newMaster}``), so its whole log is confirmed;
- **a master term** (``follow_term``): the term's in-sync set (``sync_state.SyncState``). The
  log's growth is the set's ``max_moved`` event, told here at the append that makes it, so
  that a put which waits for nothing (``WAIT=false``: a send-back, a transaction's commit, a
  due delayed message) is confirmed too, and not only when the next waiting put comes;
- **held** (``hold``): a slave, until its master says more (``master_confirmed``), and a
  master between two terms.

It never falls, except when the log is cut below it (``before_cut``/``after_cut``: a slave
that cut its log back to the point it shares with a new master, a new master that cut a torn
tail).
"""

from __future__ import annotations

from typing import Final

import attrs

from ..watermark import Watermark
from .ha.ledger import RAISE
from .ha.sync_state import SyncState

#: no bound: the visible mark follows the log
UNBOUNDED: Final = 1 << 63


@attrs.define(eq=False)
class ConfirmOffset:
    """What readers of a controller-mode store may see (see the module)."""

    #: the commitlog's own mark: written, or flushed under SYNC_FLUSH
    log: Watermark
    #: the confirm offset: what the dispatcher builds the consume queues up to, and the reads'
    #: limit; never above ``log``
    visible: Watermark = attrs.field(init=False)
    #: how far ``visible`` may follow the log when no term decides (UNBOUNDED: all of it)
    _bound: int = attrs.field(init=False, default=UNBOUNDED)
    #: the master term whose in-sync set decides (None: ``_bound`` does)
    _term: SyncState | None = attrs.field(init=False, default=None)
    #: what the term's SYNC_MASTER puts wait for (the HA service's ``replicated``)
    _replicated: Watermark | None = attrs.field(init=False, default=None)

    def __attrs_post_init__(self) -> None:
        self.visible = Watermark(self.log.value)
        self.log.add_listener(self._on_log)

    def recovered(self) -> None:
        """The store's recovery set the log's end (perhaps lower than the files suggested)
        and dispatched every whole record below it: readers see that log, until a role says
        otherwise."""
        self.visible.reset(self.log.value)

    # ---- what it follows ------------------------------------------------------------------

    def follow_log(self) -> None:
        """Readers see the whole log from now on, as a classic store's do."""
        self._leave_term()
        self._bound = UNBOUNDED
        self.visible.raise_to(self.log.value)

    def hold(self) -> None:
        """Readers see no more than now, until ``master_confirmed`` or another mode."""
        self._leave_term()
        self._bound = self.visible.value

    def follow_term(self, sync_state: SyncState, replicated: Watermark) -> None:
        """A master term begins: readers see up to ``sync_state``'s confirm offset. A rise of
        ``replicated`` (the watermark the term's puts wait on) is where the set's confirm
        offset can have risen, so it is listened to; the log's growth is told to the set."""
        self._leave_term()
        self._term, self._replicated = sync_state, replicated
        replicated.add_listener(self._on_replicated)
        self.refresh()

    def _leave_term(self) -> None:
        replicated = self._replicated
        if replicated is not None:
            replicated.remove_listener(self._on_replicated)
        self._term = self._replicated = None

    # ---- what moves it --------------------------------------------------------------------

    def master_confirmed(self, offset: int) -> None:
        """A slave's master confirmed the log up to ``offset`` (already capped at this log's
        end by the caller, as RocketMQ's slave caps it)."""
        if self._term is None and offset > self._bound:
            self._bound = offset
            log = self.log.value
            self.visible.raise_to(offset if offset < log else log)

    def refresh(self) -> None:
        """Show what the term's in-sync set confirms now (after an event the listeners do not
        see: a set the controller accepted or published)."""
        term = self._term
        if term is not None:
            log = self.log.value
            confirm = term.confirm_offset
            self.visible.raise_to(confirm if confirm < log else log)

    def _on_log(self, value: int) -> None:
        """The log rose to ``value`` (called inside the append or the flush that raised it:
        no await, no raise)."""
        term = self._term
        if term is None:
            bound = self._bound
            self.visible.raise_to(value if value < bound else bound)
            return
        if term.max_moved(value) is RAISE:
            replicated = self._replicated
            assert replicated is not None  # set with the term
            replicated.raise_to(term.replicated)  # (its listener shows the confirm offset)
        confirm = term.confirm_offset
        self.visible.raise_to(confirm if confirm < value else value)

    def _on_replicated(self, value: int) -> None:
        self.refresh()

    # ---- a cut log ------------------------------------------------------------------------

    def before_cut(self, offset: int) -> None:
        """The log is about to be cut back to ``offset``: everything below it stays, and is
        what the new master's log holds too (a slave cuts to the point its epochs share with
        its master's; a new master cuts a torn tail), so readers may see it. The cut waits
        for those records to be dispatched: a held mark below the cut would keep it waiting
        for ever."""
        if self._term is None:
            if offset > self._bound:
                self._bound = offset
            self.visible.raise_to(min(offset, self.log.value))

    def after_cut(self, end: int) -> None:
        """The log now ends at ``end`` (cut, or left as it was when the cut was refused):
        readers see nothing past it, and a slave's bound waits for its master again."""
        if self.visible.value > end:
            self.visible.rewind(end)  # (waiters, the dispatcher among them, look again)
        if self._bound != UNBOUNDED and self._bound > end:
            self._bound = end
