//! One connection's verbs resources, the same for the server and the client side:
//! protection domain, completion channel + one CQ for sends and receives, an RC queue
//! pair on the rdma_cm id, the control-message slots, the RX buffer and (once the peer
//! has registered its RX buffer) the TX buffer (docs/protocol.md §2).

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use rdma_sys::*;

use super::buffer::PinnedBuffer;
use super::cq::CompletionQueue;
use super::mr::{MemoryRegion, ProtectionDomain};
use super::resources::{loaded, CmId};
use super::shared_cq::{poll_channel_cq, Batches, CqAttachment, SharedCq, WorkCompletion};
use super::tx_buffers::TxBuffers;
use super::tx_plan;
use super::{Result, VerbsError, VerbsOp};
use crate::protocol::{ControlMessage, CONTROL_MESSAGE_LEN};

// Queue depths (docs/protocol.md §4.5). Upstream uses 1024 for every queue
// (`VALKEY_RDMA_MAX_WQE`); the NIC driver maps every entry into the process for each
// connection (rxe: about 200 bytes per send entry), so an idle connection paid for
// 2048 entries it never uses. A quarter is plenty: the byte window, not the queue,
// limits what is in flight, and a peer that outruns our receives waits (RNR, retried
// without limit since we accept with rnr_retry 7).

/// Receive slots, posted at all times but for the few a batch holds (`endpoint/recv.rs`);
/// each incoming SEND or WRITE_WITH_IMM uses one.
pub const RX_SLOTS: usize = 256;
/// The TX buffer is registered in chunks of this many bytes, each when a write first
/// reaches it, and one work request spans at most two (docs/protocol.md §4.3): the
/// first reply of a connection registers 64 KiB, not the whole of the peer's RX buffer
/// (1 MiB for libvalkey and ours), which on the event loop stalled every connection.
pub const TX_CHUNK: u32 = 64 * 1024;
/// Send queue depth.
const SQ_DEPTH: u32 = 256;
/// Send slots for control messages in flight (RegisterXferMemory, Keepalive, features).
const TX_SLOTS: usize = 64;
/// Data writes are signalled at least this often, so that completions keep telling us
/// how much of the send queue is free (upstream: every 512th of 1024, rdma.c:1324).
const SIGNAL_EVERY: u32 = 64;
/// Send-queue entries kept free for control messages (RegisterXferMemory, Keepalive).
const SQ_RESERVED_FOR_CONTROL: u64 = 32;
/// Writes are posted inline up to the room the device grants a send queue's entries
/// without being asked (rxe: 32 bytes), and never longer than this (docs/protocol.md
/// §4.1): `+OK`, an integer, a short value need no TX buffer then. Asking for more
/// costs queue memory on every connection: 128 bytes on rxe doubles each send queue
/// entry (128 KiB more per connection, measured).
pub(crate) const INLINE_WRITE_MAX: u32 = 128;

/// The depths of one endpoint's queues. [`QueueDepths::DEFAULT`] is what the server
/// and the ordinary client use; a client that holds many idle connections uses less
/// ([`QueueDepths::IDLE`]): each entry is memory mapped into the process, and on a
/// shared completion queue each QP reserves `send + recv` entries.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct QueueDepths {
    /// Send queue entries (data writes and control messages).
    pub send: u32,
    /// Receive slots posted at all times.
    pub recv: u32,
}

impl QueueDepths {
    pub const DEFAULT: QueueDepths = QueueDepths { send: SQ_DEPTH, recv: RX_SLOTS as u32 };
    /// For a connection that sends a command now and then: a peer that outruns 16
    /// receives waits (RNR, retried without limit).
    pub const IDLE: QueueDepths = QueueDepths { send: 16, recv: 16 };
    /// Completion queue entries the queues can fill at most.
    pub fn cqes(self) -> u32 {
        self.send + self.recv
    }
    /// Control messages in flight at most: [`TX_SLOTS`], less on a short send queue.
    fn tx_slots(self) -> usize {
        TX_SLOTS.min(self.send as usize / 2).max(1)
    }
    /// Send-queue entries kept for control messages.
    fn reserved_for_control(self) -> u64 {
        SQ_RESERVED_FOR_CONTROL.min(u64::from(self.send) / 2)
    }
    fn valid(self) -> bool {
        self.send >= 2 && self.recv >= 1 && self.recv as u64 <= WRID_SLOT_MASK
    }
}

/// Endpoints alive in this process (made and not yet dropped), for the admission by
/// memory mappings ([`super::map_budget`]).
static LIVE_ENDPOINTS: AtomicU64 = AtomicU64::new(0);

const WRID_CONTROL: u64 = 1 << 10;
const WRID_SLOT_MASK: u64 = (1 << 10) - 1;
const WRID_SEQ_SHIFT: u32 = 11;

pub struct EndpointConfig {
    pub rx_size: u32,
    /// The server side: a connect request that cannot be served is rejected at once
    /// (rdma_reject), so that the client learns it now and not at its CM timeout.
    pub reject_on_failure: bool,
    /// `None`: pick one at random; `Some(n)`: n modulo the device's vectors.
    pub comp_vector: Option<u32>,
    /// The TX buffer is registered in chunks of this many bytes, each when a write first
    /// reaches it; a work request spans at most two ([`tx_plan`]). The server
    /// uses [`TX_CHUNK`]; a client, whose TX buffer is made before it sends, `u32::MAX`
    /// (one chunk: its writes are not cut).
    pub tx_chunk: u32,
}

pub use crate::protocol::driver::Completion;

mod recv;
mod rx;
/// What only the test peer (`client::hostile`) does with an endpoint.
#[cfg(feature = "test-hooks")]
mod test_peer;
mod tx;

use recv::RecvChain;
pub use rx::PreparedRx;
use tx::TxRegion;

/// The verbs objects of one connection. Field order is drop order, the reverse of
/// creation: the QP first (nothing can use the rest after it), then the id, the
/// regions, the buffers they cover, the completion queue and last the domain.
pub struct Endpoint {
    /// The QP once [`begin_close`](Self::begin_close) took it out of the id.
    qp_taken: TakenQp,
    /// Destroys its QP, if still attached, then itself.
    id: CmId,
    /// The TX buffer, and the replaced ones that writes in flight may still read; it
    /// also numbers the send work requests (docs/protocol.md §4.3).
    tx: TxBuffers<TxRegion>,
    /// `None` only while [`build`](Self::build) runs.
    ctrl_mr: Option<MemoryRegion>,
    rx_mr: Option<MemoryRegion>,
    ctrl_buf: PinnedBuffer,
    rx_buf: PinnedBuffer,
    /// Where its completions go (`None` only while [`build`](Self::build) runs).
    cq: Option<EndpointCq>,
    /// Shared with the regions, with RX buffers being prepared off the event loop
    /// ([`RxPreparation`]) and with released TX buffers ([`ReleasedTx`]): freed by
    /// whichever drops last.
    pd: Option<Arc<ProtectionDomain>>,
    /// Counts the endpoint among the live ones until it is dropped.
    _live: LiveEndpoint,
    depths: QueueDepths,
    /// `depths.reserved_for_control()`, asked at every write.
    sq_reserved: u64,
    /// The address the peer writes the RX buffer at (docs/protocol.md §6).
    rx_iova: u64,
    /// [`EndpointConfig::tx_chunk`], at least one page.
    tx_chunk: u32,
    /// The TX buffer's size when made on demand ([`set_tx_len`](Endpoint::set_tx_len)):
    /// the peer's RX buffer.
    tx_len_wanted: u32,
    /// False only for the test peer that keeps the server's writes waiting
    /// (`stop_reposting_receives`).
    #[cfg(feature = "test-hooks")]
    repost_receives: bool,
    /// Data writes posted since the last [`release_idle_tx`](Endpoint::release_idle_tx).
    writes_since_idle_check: u64,
    free_tx_slots: Vec<u16>,
    /// The receives that completed, until posted again together.
    recv: RecvChain,
    unsignaled_run: u32,
    /// The longest write posted inline (the device copies the bytes into the work
    /// request: no TX buffer is touched); 0 where the device offers none.
    max_inline: u32,
}

/// Where an endpoint's completions go.
enum EndpointCq {
    /// A completion queue of its own.
    Own(CompletionQueue),
    /// One shared with other endpoints: this endpoint's entries are reserved in it,
    /// and the attachment keeps it alive (dropped after the QP: field order).
    Shared(CqAttachment),
}

impl EndpointCq {
    fn queue(&self) -> &CompletionQueue {
        match self {
            EndpointCq::Own(q) => q,
            EndpointCq::Shared(a) => a.cq().queue(),
        }
    }
}

/// A QP taken out of its id ([`Endpoint::begin_close`]), destroyed when dropped.
struct TakenQp(*mut ibv_qp);

impl Drop for TakenQp {
    fn drop(&mut self) {
        let qp = std::mem::replace(&mut self.0, std::ptr::null_mut());
        if !qp.is_null() {
            // SAFETY: created on the endpoint's id, which no longer names it; nothing
            // posts to it any more (its endpoint is being dropped or closed).
            unsafe { (loaded().ibv_destroy_qp)(qp) };
        }
    }
}

/// One live endpoint in [`LIVE_ENDPOINTS`] (what the map budget counts).
struct LiveEndpoint;

impl LiveEndpoint {
    fn new() -> Self {
        LIVE_ENDPOINTS.fetch_add(1, Ordering::Relaxed);
        LiveEndpoint
    }
}

impl Drop for LiveEndpoint {
    fn drop(&mut self) {
        LIVE_ENDPOINTS.fetch_sub(1, Ordering::Relaxed);
    }
}

// SAFETY: the raw pointers are verbs objects owned by this struct; the verbs library is
// thread-safe per object, and the owner serialises all use behind one lock.
unsafe impl Send for Endpoint {}

/// Memory one endpoint registers (what counts against `ulimit -l`): the control slots,
/// our RX buffer and a TX buffer the size of the peer's RX buffer, each rounded up to
/// whole pages. The one place that knows the layout; the start-up memlock check and the
/// refusal hints use it.
pub fn pinned_bytes(rx_size: u32, peer_rx_size: u32) -> u64 {
    let page = super::buffer::page_size() as u64;
    let pages = |n: u64| n.max(1).div_ceil(page) * page;
    pages(((RX_SLOTS + TX_SLOTS) * CONTROL_MESSAGE_LEN) as u64) + pages(rx_size.into()) + pages(peer_rx_size.into())
}

impl Endpoint {
    /// Builds the resources on `id`, whose device is known (after CONNECT_REQUEST on
    /// the server, after ROUTE_RESOLVED on the client), and posts every receive.
    pub fn new(id: CmId, cfg: &EndpointConfig) -> Result<Endpoint> {
        Self::build_on(id, cfg, QueueDepths::DEFAULT, None)
    }

    /// As [`new`](Self::new), with queues of `depths` whose completions go to the
    /// shared `cq` (the endpoint keeps it alive). Refused, with nothing made, when the
    /// CQ has no room left for `depths.cqes()` entries or belongs to another device.
    /// Completions are then read with [`SharedCq::poll`] and handed to
    /// [`on_completion`](Self::on_completion) of the endpoint whose
    /// [`qp_num`](Self::qp_num) they carry.
    pub fn with_shared_cq(id: CmId, cfg: &EndpointConfig, depths: QueueDepths, cq: &Arc<SharedCq>) -> Result<Endpoint> {
        Self::build_on(id, cfg, depths, Some(cq))
    }

    fn build_on(id: CmId, cfg: &EndpointConfig, depths: QueueDepths, cq: Option<&Arc<SharedCq>>) -> Result<Endpoint> {
        let refuse = |id: &CmId, e: VerbsError| {
            if cfg.reject_on_failure {
                id.reject();
            }
            e
        };
        let verbs = id.raw().verbs;
        if verbs.is_null() {
            return Err(refuse(&id, VerbsError::with(VerbsOp::NoDevice, libc::ENODEV)));
        }
        if !depths.valid() {
            return Err(refuse(&id, VerbsError::with(VerbsOp::CreateQp, libc::EINVAL)));
        }
        // Refused here, before anything is made, while the process still has room for
        // it and for a TX buffer of every live endpoint (vm.max_map_count).
        super::map_budget::admit(LIVE_ENDPOINTS.load(Ordering::Relaxed)).map_err(|e| refuse(&id, e))?;
        let shared = match cq {
            Some(cq) => {
                Some(EndpointCq::Shared(CqAttachment::reserve(cq, verbs, depths.cqes()).map_err(|e| refuse(&id, e))?))
            }
            None => None,
        };
        let tx_slots = depths.tx_slots();
        // The buffers come first, while `id` is still an ordinary owner: a failure here
        // rejects and destroys it (dropped on return) instead of leaking it.
        let ctrl_buf =
            PinnedBuffer::new((depths.recv as usize + tx_slots) * CONTROL_MESSAGE_LEN).map_err(|e| refuse(&id, e))?;
        let rx_buf = PinnedBuffer::new(cfg.rx_size as usize).map_err(|e| refuse(&id, e))?;
        let mut ep = Endpoint {
            qp_taken: TakenQp(std::ptr::null_mut()),
            id,
            tx: TxBuffers::new(),
            ctrl_mr: None,
            rx_mr: None,
            ctrl_buf,
            rx_buf,
            cq: shared,
            pd: None,
            _live: LiveEndpoint::new(),
            depths,
            sq_reserved: depths.reserved_for_control(),
            rx_iova: 0,
            tx_chunk: cfg.tx_chunk.max(super::buffer::page_size() as u32),
            tx_len_wanted: 0,
            #[cfg(feature = "test-hooks")]
            repost_receives: true,
            writes_since_idle_check: 0,
            free_tx_slots: (0..tx_slots as u16).rev().collect(),
            recv: RecvChain::new(depths.recv),
            unsignaled_run: 0,
            max_inline: 0,
        };
        match ep.build(verbs, cfg) {
            Ok(()) => Ok(ep),
            Err(e) => Err(refuse(&ep.id, e)), // `ep` drops: everything made so far is released
        }
    }

    /// Creates the verbs objects of a new endpoint and posts every receive. Each is
    /// stored in the endpoint at once, so that a failure drops whatever was made
    /// before it, in field order.
    fn build(&mut self, verbs: *mut ibv_context, cfg: &EndpointConfig) -> Result<()> {
        let ep = self;
        // SAFETY: `verbs` is the live device context of the id (rdma_cm keeps it open
        // while the id lives, and the id outlives every object made here).
        let pd = unsafe { ProtectionDomain::alloc(verbs)? };
        ep.pd = Some(Arc::clone(&pd));
        if ep.cq.is_none() {
            let vector = cfg.comp_vector.unwrap_or_else(random_u32);
            // SAFETY: as above.
            ep.cq = Some(EndpointCq::Own(unsafe { CompletionQueue::new(verbs, ep.depths.cqes(), vector)? }));
        }
        let cq = ep.cq.as_ref().map(|c| c.queue().cq_ptr()).unwrap_or(std::ptr::null_mut());
        // SAFETY: all-zero is a valid ibv_qp_init_attr (plain integers, null pointers).
        let mut attr: ibv_qp_init_attr = unsafe { std::mem::zeroed() };
        attr.send_cq = cq;
        attr.recv_cq = cq;
        attr.qp_type = ibv_qp_type::IBV_QPT_RC;
        attr.cap.max_send_wr = ep.depths.send;
        attr.cap.max_recv_wr = ep.depths.recv;
        attr.cap.max_send_sge = tx_plan::SGES_PER_WR as u32; // one per TX chunk a request touches
        attr.cap.max_recv_sge = 1;
        // No inline room is asked for: what the device grants anyway (the room its send
        // queue entries have for the scatter entries) is used, and no more is bought.
        attr.cap.max_inline_data = 0;
        // SAFETY: the id, domain and CQ are live; the id owns the QP from here on.
        if unsafe { (loaded().rdma_create_qp)(ep.id.as_ptr(), pd.as_ptr(), &mut attr) } != 0 {
            return Err(VerbsError::last(VerbsOp::CreateQp));
        }
        ep.max_inline = attr.cap.max_inline_data.min(INLINE_WRITE_MAX);
        if let Some(EndpointCq::Shared(s)) = &mut ep.cq {
            // From here on dropping the attachment retires the number on the shared CQ.
            // SAFETY: the QP was just created on the id.
            s.set_qp_num(unsafe { (*ep.id.raw().qp).qp_num })?;
        }
        // SAFETY: the regions are fields dropped before the buffers they cover.
        unsafe {
            ep.ctrl_mr = Some(pd.register_local(ep.ctrl_buf.as_ptr(), ep.ctrl_buf.len())?);
            let (rx_mr, rx_iova) = pd.register_for_peer(ep.rx_buf.as_ptr(), cfg.rx_size as usize)?;
            (ep.rx_mr, ep.rx_iova) = (Some(rx_mr), rx_iova);
        }
        ep.recv.set_lkey(ep.ctrl_lkey());
        ep.post_all_recvs()?;
        Ok(())
    }

    /// The protection domain, which regions are registered on (none before `build`).
    fn pd(&self) -> Result<&Arc<ProtectionDomain>> {
        self.pd.as_ref().ok_or_else(|| VerbsError::with(VerbsOp::RegMr, libc::ENODEV))
    }

    fn ctrl_lkey(&self) -> u32 {
        self.ctrl_mr.as_ref().map_or(0, MemoryRegion::lkey)
    }

    /// Memory this endpoint has registered now (control slots, RX, TX and any retired
    /// TX buffer still in flight), in bytes.
    pub fn pinned_bytes(&self) -> u64 {
        let tx: usize = self.tx.held().map(TxRegion::registered_bytes).sum();
        (self.ctrl_buf.len() + self.rx_buf.len() + tx) as u64
    }

    pub fn id(&self) -> &CmId {
        &self.id
    }
    /// Stores the key its CM events carry ([`CmId::set_context`]).
    pub fn set_cm_context(&mut self, key: usize) {
        self.id.set_context(key)
    }
    /// The QP's number: what a completion on a shared CQ names its endpoint by.
    pub fn qp_num(&self) -> u32 {
        // SAFETY: the QP exists once the endpoint is built and lives while self does.
        unsafe { (*self.qp()).qp_num }
    }
    /// The completion channel's fd: readable when a completion is due.
    pub fn comp_fd(&self) -> i32 {
        self.cq.as_ref().map_or(-1, |c| c.queue().fd())
    }
    pub fn comp_vector(&self) -> i32 {
        self.cq.as_ref().map_or(-1, |c| c.queue().comp_vector())
    }

    /// Whether a receive that completed is posted again (always, but in the test peer).
    fn reposts_receives(&self) -> bool {
        #[cfg(feature = "test-hooks")]
        return self.repost_receives;
        #[cfg(not(feature = "test-hooks"))]
        true
    }

    fn qp(&self) -> *mut ibv_qp {
        if self.qp_taken.0.is_null() {
            self.id.raw().qp
        } else {
            self.qp_taken.0
        }
    }

    /// Destroys the QP (once; the id's, or the one [`begin_close`](Self::begin_close)
    /// took out of it).
    ///
    /// # Safety
    /// Nothing may post to the QP afterwards.
    unsafe fn destroy_qp(&mut self) {
        let qp = if self.qp_taken.0.is_null() {
            self.id.take_qp()
        } else {
            std::mem::replace(&mut self.qp_taken.0, std::ptr::null_mut())
        };
        if !qp.is_null() {
            // SAFETY: per the contract; it was created on this endpoint's id, and neither
            // the id nor `qp_taken` names it any more.
            unsafe { (loaded().ibv_destroy_qp)(qp) };
        }
    }

    fn sq_room(&self) -> u64 {
        u64::from(self.depths.send).saturating_sub(self.tx.in_flight())
    }

    fn post_send(&mut self, wr: &mut ibv_send_wr, slot_tag: u64, always_signal: bool) -> Result<()> {
        self.post_send_chain(std::slice::from_mut(wr), slot_tag, always_signal)
    }

    /// Numbers the request `seq` (its `wr_id`) and signals it as if posted alone: at
    /// least every [`SIGNAL_EVERY`]th, and whenever the send queue is down to the
    /// entries kept for control messages (`room` free before it).
    #[inline]
    fn number(&mut self, wr: &mut ibv_send_wr, seq: u64, room: u64, slot_tag: u64, always_signal: bool) {
        self.unsignaled_run += 1;
        if always_signal || self.unsignaled_run >= SIGNAL_EVERY || room <= self.sq_reserved {
            wr.send_flags |= ibv_send_flags::IBV_SEND_SIGNALED.0;
            self.unsignaled_run = 0;
        }
        wr.wr_id = (seq << WRID_SEQ_SHIFT) | slot_tag;
    }

    /// Posts `wrs` as one chain (one doorbell), numbering each and signalling each as if
    /// posted alone: at least every [`SIGNAL_EVERY`]th, and whenever the send queue is
    /// down to the entries kept for control messages.
    #[inline(always)]
    fn post_send_chain(&mut self, wrs: &mut [ibv_send_wr], slot_tag: u64, always_signal: bool) -> Result<()> {
        let (first_seq, room) = (self.tx.next_seq(), self.sq_room());
        if let [wr] = wrs {
            // The usual post, one request: no chain to link or to search on failure. Kept
            // apart from the chain's post below: joined, this function stops being inlined
            // into the write, which costs more than the lines saved
            // (docs/measurements/instructions-2026-12-04c).
            self.number(wr, first_seq, room, slot_tag, always_signal);
            wr.next = std::ptr::null_mut();
            let mut bad = std::ptr::null_mut();
            // SAFETY: as for the chain below, of one request.
            let failed = unsafe { ibv_post_send(self.qp(), wr, &mut bad) } != 0;
            // (as below: a refusal that names no request of ours counts it as posted)
            if !failed || !std::ptr::eq(bad, wr) {
                self.tx.on_posted();
            }
            return if failed { Err(VerbsError::last(VerbsOp::PostSend)) } else { Ok(()) };
        }
        self.post_linked_chain(wrs, first_seq, room, slot_tag, always_signal)
    }

    /// [`post_send_chain`](Self::post_send_chain) of more than one request: out of line,
    /// so that the one-request post stays inlined into the write.
    #[inline(never)]
    fn post_linked_chain(
        &mut self,
        wrs: &mut [ibv_send_wr],
        first_seq: u64,
        room: u64,
        slot_tag: u64,
        always_signal: bool,
    ) -> Result<()> {
        let n = wrs.len();
        for i in 0..n {
            let (head, tail) = wrs.split_at_mut(i + 1);
            let wr = &mut head[i];
            self.number(wr, first_seq + i as u64, room.saturating_sub(i as u64), slot_tag, always_signal);
            wr.next = tail.first_mut().map_or(std::ptr::null_mut(), |w| w as *mut ibv_send_wr);
        }
        let mut bad = std::ptr::null_mut();
        // SAFETY: the QP is live; the chain is linked above and lives in `wrs`; each
        // scatter list points into registered memory that outlives the work request
        // (freed only when the send queue has completed it, or with the endpoint).
        let failed = unsafe { ibv_post_send(self.qp(), wrs.as_mut_ptr(), &mut bad) } != 0;
        // Requests before the one the device refused are posted and will complete. If the
        // device named none of ours, count them all: a TX buffer is then kept longer than
        // needed (until teardown), never freed while the device may still read it.
        let posted = if failed { wrs.iter().position(|w| std::ptr::eq(w, bad)).unwrap_or(n) } else { n };
        for _ in 0..posted {
            self.tx.on_posted();
        }
        if failed {
            return Err(VerbsError::last(VerbsOp::PostSend));
        }
        Ok(())
    }

    /// Sends a control message (IBV_WR_SEND, signalled so the slot comes back).
    pub fn post_control(&mut self, msg: &ControlMessage) -> Result<()> {
        if self.sq_room() == 0 {
            return Err(VerbsError::with(VerbsOp::ControlQueueFull, libc::ENOBUFS));
        }
        // (a slot per message in flight also where it goes inline: it bounds them)
        let slot = self.free_tx_slots.pop().ok_or(VerbsError::with(VerbsOp::ControlQueueFull, libc::ENOBUFS))? as usize;
        let encoded = msg.encode();
        let inline = CONTROL_MESSAGE_LEN as u32 <= self.max_inline;
        let mut sge = if inline {
            // docs/protocol.md §3.3: the device copies the 32 bytes as the request is posted
            ibv_sge { addr: encoded.as_ptr() as u64, length: CONTROL_MESSAGE_LEN as u32, lkey: 0 }
        } else {
            let off = (self.depths.recv as usize + slot) * CONTROL_MESSAGE_LEN;
            // SAFETY: the slot is ours (taken from the free list) until its completion,
            // and the buffer is used only from the thread that holds `&mut self`.
            unsafe { self.ctrl_buf.copy_in(off, &encoded) };
            ibv_sge {
                // SAFETY: inside the control buffer.
                addr: unsafe { self.ctrl_buf.as_ptr().add(off) } as u64,
                length: CONTROL_MESSAGE_LEN as u32,
                lkey: self.ctrl_lkey(),
            }
        };
        // SAFETY: all-zero is a valid ibv_send_wr (plain integers, null pointers).
        let mut wr: ibv_send_wr = unsafe { std::mem::zeroed() };
        wr.sg_list = &mut sge;
        wr.num_sge = 1;
        wr.opcode = ibv_wr_opcode::IBV_WR_SEND;
        if inline {
            wr.send_flags = ibv_send_flags::IBV_SEND_INLINE.0;
        }
        self.post_send(&mut wr, WRID_CONTROL | slot as u64, true).inspect_err(|_| self.free_tx_slots.push(slot as u16))
    }

    /// Consumes a pending notification of the completion channel (if any), re-arms
    /// the CQ and polls up to `budget` completions, handing each that concerns the
    /// protocol to `f`. Receives are re-posted and send slots recycled here. Returns
    /// whether completions may be left: the channel does not signal those again (it
    /// signals only new ones), so the caller must come back for them, after the other
    /// connections had their turn; a peer that sends as fast as it can then gets its
    /// share of the main thread and no more.
    ///
    /// Only for an endpoint with its own CQ: one on a shared CQ gets its completions
    /// through [`on_completion`](Self::on_completion) (here: `EINVAL`).
    pub fn poll(&mut self, budget: usize, mut f: impl FnMut(Completion)) -> Result<bool> {
        let Some(EndpointCq::Own(q)) = self.cq.as_ref() else {
            return Err(VerbsError::with(VerbsOp::PollCq, libc::EINVAL));
        };
        let (channel, cq) = (q.channel_ptr(), q.cq_ptr());
        // SAFETY: the endpoint's own channel and CQ, live while self is.
        unsafe {
            poll_channel_cq(
                channel,
                cq,
                budget,
                &mut Batches::new(|batch: &[ibv_wc]| {
                    batch.iter().try_for_each(|wc| self.complete(&WorkCompletion::from_raw(wc), &mut f))
                }),
            )
        }
    }

    /// One completion from a shared CQ whose [`WorkCompletion::qp_num`] is this
    /// endpoint's: the same bookkeeping as [`poll`](Self::poll) (receives re-posted,
    /// send slots recycled), then `f` for what concerns the protocol.
    pub fn on_completion(&mut self, wc: &WorkCompletion, mut f: impl FnMut(Completion)) -> Result<()> {
        debug_assert_eq!(wc.qp_num(), self.qp_num());
        self.complete(wc, &mut f)
    }

    fn complete(&mut self, wc: &WorkCompletion, f: &mut impl FnMut(Completion)) -> Result<()> {
        if let Some(c) = self.take_completion(wc)? {
            f(c);
        }
        Ok(())
    }

    /// [`on_completion`](Self::on_completion) returning what concerns the protocol
    /// (`None`: nothing, a send's bookkeeping only), so that a caller can hand it to
    /// the core at once, with no list between (the server's delivery from a shared CQ).
    /// Inlined: returned from a call, the 40-byte value costs more than the step.
    #[inline(always)]
    pub fn take_completion(&mut self, wc: &WorkCompletion) -> Result<Option<Completion>> {
        if wc.status() != ibv_wc_status::IBV_WC_SUCCESS {
            return Ok(Some(Completion::Failed { status: wc.status(), vendor_err: wc.vendor_err() }));
        }
        match wc.opcode() {
            ibv_wc_opcode::IBV_WC_RECV => {
                let slot = (wc.wr_id() & WRID_SLOT_MASK) as usize;
                let off = slot * CONTROL_MESSAGE_LEN;
                let mut bytes = [0u8; CONTROL_MESSAGE_LEN];
                self.ctrl_buf.copy_out(off, &mut bytes);
                if self.reposts_receives() {
                    self.repost_recv(slot)?;
                }
                Ok(Some(Completion::Control { bytes, len: wc.byte_len() }))
            }
            ibv_wc_opcode::IBV_WC_RECV_RDMA_WITH_IMM => {
                if self.reposts_receives() {
                    self.repost_recv((wc.wr_id() & WRID_SLOT_MASK) as usize)?;
                }
                Ok(Some(Completion::Data { imm: wc.imm() }))
            }
            ibv_wc_opcode::IBV_WC_SEND | ibv_wc_opcode::IBV_WC_RDMA_WRITE => {
                self.tx.on_completed(wc.wr_id() >> WRID_SEQ_SHIFT);
                if wc.wr_id() & WRID_CONTROL != 0 {
                    self.free_tx_slots.push((wc.wr_id() & WRID_SLOT_MASK) as u16);
                }
                Ok(None)
            }
            _ => Ok(None),
        }
    }

    /// Starts an orderly disconnect (the peer sees DISCONNECTED).
    pub fn disconnect(&self) {
        self.id.disconnect();
    }

    /// The first step of closing, for an endpoint whose QP is destroyed later on
    /// another thread ([`close`](Self::close)); on the thread that reads its CM events,
    /// after the last post. Takes the QP out of the id, so that librdmacm, reading a
    /// late CM event of the id (it moves the id's QP to the error state on REJECTED),
    /// cannot meet the other thread destroying it; and marks its number as closing on
    /// a shared CQ, so that no new QP takes it before it is retired.
    pub fn begin_close(&mut self) {
        if self.qp_taken.0.is_null() {
            self.qp_taken.0 = self.id.take_qp();
        }
        if let Some(EndpointCq::Shared(a)) = self.cq.as_ref() {
            a.mark_closing();
        }
    }

    /// Ends the connection for good: destroys the QP, then disconnects (the peer sees
    /// DISCONNECTED), then frees the rest. In this order the receives still posted
    /// (256) are not completed into the CQ: `rdma_disconnect` moves a QP it still has
    /// to the error state, where the device completes each posted work request as a
    /// flush error, and on a shared CQ the event loop polls them all (docs/protocol.md
    /// §4.6, teardown); a QP destroyed without passing through the error state is not
    /// flushed under Soft-RoCE, and where a device does flush it, its completions are
    /// dropped as those of a retired QP.
    pub fn close(mut self) {
        // SAFETY: `self` is consumed: nothing posts to the QP again.
        unsafe { self.destroy_qp() };
        self.id.disconnect();
    }
}

/// A cheap per-process random number for spreading connections over vectors.
fn random_u32() -> u32 {
    use std::sync::atomic::{AtomicU64, Ordering};
    static STATE: AtomicU64 = AtomicU64::new(0);
    let mut x = STATE.load(Ordering::Relaxed);
    if x == 0 {
        x = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(1, |d| d.as_nanos() as u64) | 1;
    }
    x ^= x << 13;
    x ^= x >> 7;
    x ^= x << 17;
    STATE.store(x, Ordering::Relaxed);
    (x >> 32) as u32
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pinned_bytes_counts_every_registered_buffer_in_pages() {
        // 320 control slots of 32 bytes (10 KiB: 3 pages), a 1 MiB RX buffer, a 1 MiB TX buffer
        let page = crate::verbs::buffer::page_size() as u64;
        let slots = (320 * 32u64).div_ceil(page) * page;
        assert_eq!(pinned_bytes(1 << 20, 1 << 20), slots + 2 * (1 << 20));
        assert_eq!(pinned_bytes(1, 1), slots + 2 * page);
    }
}
