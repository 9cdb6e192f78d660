//! The handler scheduler: which server handler runs when (docs/server-abi.md §4.1,
//! §4.3-§4.5), the handlers installed, the IO threads' postpone mask, and `ct->close`.

use super::*;

/// The stages a run walks through (docs/server-abi.md §4.1).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Stage {
    /// The read handler, again while unread bytes remain and each call consumed some.
    ReadLoop,
    /// The write handler once, if it is due (window, send queue, not postponed).
    WriteIfDue,
    /// The read handler once (it learns EOF or the error).
    ReadOnce,
    /// The write handler once, window or not (it learns the error too).
    WriteOnce,
}

/// What a run was started for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Plan {
    /// Accepting/Established: read loop and write handler (write first with a barrier).
    Live,
    /// PeerClosed with unread bytes: read them (the read loop only).
    Drain,
    /// Failed, or PeerClosed with nothing unread: tell the server, once.
    Final,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) struct Run {
    plan: Plan,
    stages: [Option<Stage>; 2],
    /// A live plan whose first stage is the read loop (no barrier), until the plan
    /// changes: what [`Conn::read_loop_shortcut`] asks first, in one load.
    reads_first: bool,
    at: usize,
    read_calls: u32,
    /// The last read-handler call consumed bytes.
    last_read_progressed: bool,
    /// Some read-handler call of this run consumed bytes.
    read_progressed: bool,
    /// Some write-handler call of this run moved bytes.
    wrote: bool,
    /// The handler being called and the byte counter before it.
    calling: Option<(Handler, u64)>,
}

impl Conn {
    // ----- handlers and IO threads -------------------------------------------------

    /// `set_read_handler`: only stored (docs/server-abi.md §4.1); then ask
    /// [`wants_pending`](Self::wants_pending).
    pub fn set_read_handler(&mut self, installed: bool) {
        self.read_handler = installed;
    }

    /// `set_write_handler` with its barrier flag (AE_BARRIER: write before read).
    pub fn set_write_handler(&mut self, installed: bool, barrier: bool) {
        self.write_handler = installed;
        self.barrier = barrier;
    }

    /// `postpone_update_state` (docs/server-abi.md §4.5), from an IO thread or the main
    /// thread. The server sets the mask (often to none) before `update_state`.
    pub fn postpone(&mut self, mask: Postpone) {
        self.postponed = mask;
    }

    /// `update_state`: the IO thread is done. Only says whether something became due
    /// meanwhile; handlers never run from here (`sync_handlers_in_update_state = 0`).
    pub fn update_state(&self, sq_room: bool) -> bool {
        self.wants_pending(sq_room)
    }

    /// What decides the pending question before any handler rule, for both
    /// [`wants_pending`](Self::wants_pending) and a run's end: a closed connection
    /// never, completions left by a budgeted poll always, an unaccepted one never.
    fn pending_decided(&self) -> Option<bool> {
        if matches!(self.state, State::Closed) {
            Some(false)
        } else if self.completions_left {
            Some(true)
        } else if !self.accepted {
            Some(false)
        } else {
            None
        }
    }

    /// `queue_if_due`: must the connection go on the pending list, outside a run
    /// (after `set_*_handler`, `update_state`, a CM event, the keepalive tick, or any
    /// input made outside a handler)? The server must learn the end (a handler can
    /// run), the read handler has unread bytes, or the write handler is due. Postponed
    /// handlers are not due: `update_state` asks again.
    pub fn wants_pending(&self, sq_room: bool) -> bool {
        if let Some(decided) = self.pending_decided() {
            return decided;
        }
        if self.terminal_due() {
            return self.terminal_runnable();
        }
        (self.read_runnable() && self.session.rx.has_unread()) || self.write_due(sq_room)
    }

    // ----- one run (docs/server-abi.md §4.1, §4.3) ---------------------------------

    /// Starts one run: the completion fd fired (after its completions were fed in), or
    /// `process_pending_data` popped the connection. What the run does is decided here:
    /// - Failed, or the peer left and nothing is unread: the read handler once, then
    ///   the write handler once: `read` (or `write`) fails and the server frees the
    ///   client;
    /// - the peer left with unread bytes: the read loop only (they come before EOF);
    /// - live: the read loop and the write handler if due; with a write barrier the
    ///   write handler first, as ae's AE_BARRIER does.
    ///
    /// A run during which the connection ends (a failed post, the peer's last bytes
    /// read) continues as a final one.
    ///
    /// Nothing runs before `ct->accept` or after close.
    pub fn begin_run(&mut self) {
        self.runs = self.runs.wrapping_add(1);
        if matches!(self.state, State::Closed) || !self.accepted {
            self.run = None;
            return;
        }
        let plan = if self.terminal_due() {
            Plan::Final
        } else if matches!(self.state, State::PeerClosed) {
            Plan::Drain
        } else {
            Plan::Live
        };
        let stages = match plan {
            Plan::Live if self.barrier => [Some(Stage::WriteIfDue), Some(Stage::ReadLoop)],
            Plan::Live => [Some(Stage::ReadLoop), Some(Stage::WriteIfDue)],
            Plan::Drain => [Some(Stage::ReadLoop), None],
            Plan::Final => [Some(Stage::ReadOnce), Some(Stage::WriteOnce)],
        };
        self.run = Some(Run {
            plan,
            reads_first: plan == Plan::Live && stages[0] == Some(Stage::ReadLoop),
            stages,
            at: 0,
            read_calls: 0,
            last_read_progressed: false,
            read_progressed: false,
            wrote: false,
            calling: None,
        });
    }

    /// The next handler to call in this run, or the end of the run. `sq_room` answers as
    /// for [`write`](Self::write), asked only when a write stage or the run's end needs it.
    ///
    /// The read loop goes on while unread bytes remain and the previous call consumed
    /// some: a call that consumed nothing means an IO thread has the client
    /// (`readQueryFromClient` returns without reading, docs/server-abi.md §4.5) and
    /// `update_state` will queue it; not while READ is postponed.
    #[inline]
    pub fn next_step(&mut self, sq_room: impl Fn() -> bool) -> Step {
        // (test builds: the shortcut must decide exactly as the whole walk would)
        #[cfg(test)]
        let walked = {
            let mut shadow = self.clone();
            let step = shadow.walk_stages(sq_room());
            (step, shadow.run, shadow.depth)
        };
        let step = match self.read_loop_shortcut() {
            Some(step) => step,
            None => self.walk_stages(sq_room()),
        };
        #[cfg(test)]
        assert_eq!((step, &self.run, self.depth), (walked.0, &walked.1, walked.2), "the shortcut decided otherwise");
        step
    }

    /// [`next_step`](Self::next_step) for the two steps of almost every request, decided
    /// from a few fields (the compiler evaluates every stage's conditions of the whole
    /// walk up front): a live run that has not left its read loop, on an established
    /// connection, with nothing postponed or due to write:
    /// - the run's first step, bytes unread: the read handler;
    /// - nothing (left) unread and no write handler: the end of the run (what
    ///   [`pending_after`](Self::pending_after) says then: only completions left).
    ///
    /// `None`: anything else, for [`walk_stages`](Self::walk_stages).
    #[inline]
    fn read_loop_shortcut(&mut self) -> Option<Step> {
        let run = self.run.as_mut()?;
        if !(run.reads_first
            && run.at == 0
            && matches!(self.state, State::Established)
            && self.read_handler
            && !self.postponed.read())
        {
            return None;
        }
        let unread = self.session.rx.has_unread();
        if run.read_calls == 0 && unread {
            run.read_calls = 1;
            run.calling = Some((Handler::Read, self.bytes_read));
            self.depth += 1;
            return Some(Step::Call(Handler::Read));
        }
        if !unread && !self.write_handler {
            self.run = None;
            return Some(Step::Done { pending: self.completions_left });
        }
        None
    }

    /// [`next_step`](Self::next_step) by walking the run's stages.
    #[inline(never)]
    fn walk_stages(&mut self, sq_room: bool) -> Step {
        if self.run.is_none() {
            return Step::Done { pending: !matches!(self.state, State::Closed) && self.completions_left };
        }
        if matches!(self.state, State::Closed) {
            self.run = None;
            return Step::Done { pending: false };
        }
        // What the stages ask is read only when a stage asks it (nothing changes it until
        // a handler runs). The run is worked on in place: moving it out and back cost more
        // than the rest.
        let terminal = self.terminal_due();
        let run = self.run.as_mut().expect("checked above");
        if run.plan != Plan::Final && terminal {
            // The connection ended during the run (a failed post, an IO thread's write,
            // or the peer's last bytes consumed): finish as a final run, so the server
            // learns it now rather than on the next iteration.
            run.plan = Plan::Final;
            run.stages = [Some(Stage::ReadOnce), Some(Stage::WriteOnce)];
            run.reads_first = false;
            run.at = 0;
        }
        // Whether the state still belongs to the run's plan (the read loop stops when it
        // changes, e.g. a failed post while reading); not Closed (checked above).
        let same_plan = match run.plan {
            Plan::Live => self.is_live(),
            Plan::Drain => matches!(self.state, State::PeerClosed),
            Plan::Final => true,
        };
        loop {
            let run = self.run.as_ref().expect("checked above");
            let Some(stage) = run.stages.get(run.at).copied().flatten() else { break };
            let call = match stage {
                Stage::ReadLoop => {
                    let more = run.read_calls == 0 || run.last_read_progressed;
                    (more && same_plan && self.session.rx.has_unread() && self.read_runnable()).then_some(Handler::Read)
                }
                Stage::ReadOnce => self.read_runnable().then_some(Handler::Read),
                Stage::WriteIfDue => (same_plan && self.write_due(sq_room)).then_some(Handler::Write),
                Stage::WriteOnce => (self.write_handler && !self.postponed.write()).then_some(Handler::Write),
            };
            let before = match call {
                Some(Handler::Read) => self.bytes_read,
                Some(Handler::Write) => self.bytes_written,
                None => 0,
            };
            let run = self.run.as_mut().expect("checked above");
            let Some(h) = call else {
                run.at += 1;
                continue;
            };
            if stage != Stage::ReadLoop {
                run.at += 1;
            }
            if h == Handler::Read {
                run.read_calls += 1;
            }
            run.calling = Some((h, before));
            self.depth += 1;
            return Step::Call(h);
        }
        let run = self.run.as_ref().expect("checked above");
        let (plan, read_progressed, wrote) = (run.plan, run.read_progressed, run.wrote);
        self.run = None;
        Step::Done { pending: self.pending_after(plan, read_progressed, wrote, sq_room) }
    }

    /// After a run: is the connection due again *because of this run*? Never merely
    /// because something is due: a handler that made no progress would then spin the
    /// event loop (the C module's 104 % CPU, docs/server-abi.md §4.3).
    /// - the connection ended: never (the run became a final one, which told the
    ///   handlers; if none could run, `set_*_handler`/`update_state` queue it later);
    /// - the peer left, unread bytes remain and the read handler made progress;
    /// - the write handler wrote, is still installed and still due (window open, send
    ///   queue room): a reply of many blocks is written ~64 KiB per call and RDMA has
    ///   no POLLOUT to call it again (the 3 s-per-piece stall);
    /// - completions are left from a poll that stopped at its budget.
    fn pending_after(&self, plan: Plan, read_progressed: bool, wrote: bool, sq_room: bool) -> bool {
        if let Some(decided) = self.pending_decided() {
            return decided;
        }
        if self.terminal_due() {
            return plan != Plan::Final && self.terminal_runnable();
        }
        if matches!(self.state, State::PeerClosed) {
            return read_progressed && self.read_runnable();
        }
        wrote && self.write_due(sq_room)
    }

    /// A handler returned (the run's, or the accept handler entered with
    /// [`enter_handler`](Self::enter_handler)). Records whether a run's handler made
    /// progress, and implements connhelpers.h `callHandler`: a close requested inside
    /// frees the connection once the outermost handler returns.
    pub fn handler_returned(&mut self) -> AfterHandler {
        debug_assert!(self.depth > 0, "handler_returned without a handler");
        self.depth = self.depth.saturating_sub(1);
        if let Some(run) = self.run.as_mut() {
            if let Some((h, before)) = run.calling.take() {
                match h {
                    Handler::Read => {
                        run.last_read_progressed = self.bytes_read != before;
                        run.read_progressed |= run.last_read_progressed;
                    }
                    Handler::Write => run.wrote |= self.bytes_written != before,
                }
            }
        }
        if !matches!(self.state, State::Closed) {
            return AfterHandler::Continue;
        }
        self.run = None;
        if self.depth == 0 && !self.freed {
            self.freed = true;
            AfterHandler::FreeNow
        } else {
            AfterHandler::Closed
        }
    }

    /// A handler outside a run is about to be called (the accept handler of
    /// `ct->accept`); pair it with [`handler_returned`](Self::handler_returned).
    /// The usual run, decided without building it: an established connection with a
    /// read handler, not postponed, no write barrier, and unread bytes. For it
    /// [`begin_run`](Self::begin_run) and [`next_step`](Self::next_step) always decide
    /// "call the read handler" (the read loop's first call); this decides the same in one
    /// test. `Some`: call the read handler now, then
    /// [`plain_read_returned`](Self::plain_read_returned); `None`: begin the run.
    #[inline(always)]
    pub fn plain_read_call(&mut self) -> Option<PlainRead> {
        if !(matches!(self.state, State::Established)
            && self.accepted
            && self.read_handler
            && !self.barrier
            && !self.postponed.read()
            && self.session.rx.has_unread())
        {
            return None;
        }
        #[cfg(test)]
        {
            let mut general = self.clone();
            general.begin_run();
            assert_eq!(
                general.next_step(|| true),
                Step::Call(Handler::Read),
                "a plain read call the run would not make"
            );
        }
        self.runs = self.runs.wrapping_add(1);
        // (the run it stands for replaces any other, as `begin_run` does)
        self.run = None;
        self.depth += 1;
        Some(PlainRead { before: self.bytes_read, runs: self.runs })
    }

    /// The read handler of [`plain_read_call`](Self::plain_read_call) returned.
    /// `Err`: as [`handler_returned`](Self::handler_returned) (closed inside). `Ok(Some)`:
    /// the run is over, as the read loop ends it (nothing unread, no write handler);
    /// `Ok(None)`: the run goes on from here as the one begun would
    /// ([`next_step`](Self::next_step)).
    #[inline(always)]
    pub fn plain_read_returned(&mut self, call: PlainRead) -> Result<Option<Step>, AfterHandler> {
        // (in the tests, the run begun instead, from the same handler's return, must
        // decide the same)
        #[cfg(test)]
        let general = {
            let mut general = self.clone();
            if general.runs == call.runs {
                let mut run = general.run_after_plain_read(call.before);
                (run.last_read_progressed, run.read_progressed) = (false, false);
                run.calling = Some((Handler::Read, call.before));
                general.run = Some(run);
            }
            let step = match general.handler_returned() {
                AfterHandler::Continue => Ok(general.next_step(|| true)),
                after => Err(after),
            };
            (step, general.run, general.depth)
        };
        let decided = self.plain_read_decided(call);
        #[cfg(test)]
        {
            let mut mine = self.clone();
            let step = match decided {
                Ok(Some(step)) => Ok(step),
                Ok(None) => Ok(mine.next_step(|| true)),
                Err(after) => Err(after),
            };
            assert_eq!((step, mine.run, mine.depth), general, "a plain read run the general one would not make");
        }
        decided
    }

    #[inline(always)]
    fn plain_read_decided(&mut self, call: PlainRead) -> Result<Option<Step>, AfterHandler> {
        match self.handler_returned() {
            AfterHandler::Continue => {}
            after => return Err(after),
        }
        if self.runs != call.runs {
            // A run nested in the handler replaced this one and ended: so does this.
            return Ok(Some(Step::Done { pending: self.completions_left }));
        }
        if matches!(self.state, State::Established)
            && self.read_handler
            && !self.postponed.read()
            && !self.write_handler
            && !self.session.rx.has_unread()
        {
            return Ok(Some(Step::Done { pending: self.completions_left }));
        }
        self.run = Some(self.run_after_plain_read(call.before));
        Ok(None)
    }

    /// The run [`begin_run`](Self::begin_run) would have begun for a plain read call,
    /// as it stands once that call returned.
    fn run_after_plain_read(&self, before: u64) -> Run {
        let progressed = self.bytes_read != before;
        Run {
            plan: Plan::Live,
            stages: [Some(Stage::ReadLoop), Some(Stage::WriteIfDue)],
            reads_first: true,
            at: 0,
            read_calls: 1,
            last_read_progressed: progressed,
            read_progressed: progressed,
            wrote: false,
            calling: None,
        }
    }

    pub fn enter_handler(&mut self) {
        self.depth += 1;
    }

    /// `ct->close` (or the client dropping its stream): Closed from any state. Safe to
    /// call more than once: only the first unregisters, and the connection is freed
    /// exactly once, now or when the outermost handler returns
    /// (docs/server-abi.md §4.4).
    pub fn close(&mut self) -> CloseOutcome {
        let unregister = !matches!(self.state, State::Closed);
        self.set_state(State::Closed);
        self.control.clear();
        let free_now = self.depth == 0 && !self.freed;
        if free_now {
            self.freed = true;
            self.run = None;
        }
        CloseOutcome { unregister, free_now }
    }
}
