//! What only the test peer (`client::hostile`, the `test-hooks` build) does with an
//! endpoint: malformed messages, reads, immediates that lie, receives not re-posted, a
//! queue pair that falls silent. Not in the shipped build.

use rdma_sys::*;

use super::{Endpoint, Result, VerbsError, VerbsOp};
use crate::verbs::resources::loaded;

impl Endpoint {
    /// The TX buffer the peer's window asked for, made now (an ordinary write makes it
    /// at the first write; the raw sends and reads use it before any).
    fn make_tx(&mut self) -> Result<()> {
        if self.tx.current().is_none() && self.tx_len_wanted > 0 {
            self.ensure_tx(self.tx_len_wanted)?;
        }
        Ok(())
    }

    /// Control messages posted and not yet completed. Control sends are signalled, and a
    /// completed send was acknowledged by the peer's device: 0 means every one arrived.
    pub fn control_in_flight(&self) -> usize {
        self.depths.tx_slots() - self.free_tx_slots.len()
    }

    /// Sends `bytes` as one IBV_WR_SEND from the TX buffer, whatever their length. Only
    /// the test peer uses this, to send malformed control messages.
    pub fn post_send_raw(&mut self, bytes: &[u8]) -> Result<()> {
        self.make_tx()?;
        let buf = &self.tx.current().ok_or(VerbsError::with(VerbsOp::NotRegistered, libc::ENOTCONN))?.buf;
        if bytes.len() > buf.len() {
            return Err(VerbsError::with(VerbsOp::TxOverrun, libc::EINVAL));
        }
        // SAFETY: the test peer owns its TX buffer; nothing else is in flight from it.
        unsafe { buf.copy_in(0, bytes) };
        // A client's TX buffer is one chunk: one scatter entry.
        let mut sge = self.tx_sge(0, bytes.len() as u32)?;
        // SAFETY: all-zero is a valid ibv_send_wr (plain integers, null pointers).
        let mut wr: ibv_send_wr = unsafe { std::mem::zeroed() };
        wr.sg_list = &mut sge;
        wr.num_sge = 1;
        wr.opcode = ibv_wr_opcode::IBV_WR_SEND;
        self.post_send(&mut wr, 0, true)
    }

    /// Reads `len` bytes of the peer's memory at `remote_addr` with `rkey` into the TX
    /// buffer (one IBV_WR_RDMA_READ). Only the test peer uses this: the protocol never
    /// reads, so a server's buffers must refuse it (docs/protocol.md §6).
    pub fn post_read_raw(&mut self, remote_addr: u64, rkey: u32, len: u32) -> Result<()> {
        self.make_tx()?;
        let mut sge = self.tx_sge(0, len)?;
        // SAFETY: all-zero is a valid ibv_send_wr (plain integers, null pointers).
        let mut wr: ibv_send_wr = unsafe { std::mem::zeroed() };
        wr.sg_list = &mut sge;
        wr.num_sge = 1;
        wr.opcode = ibv_wr_opcode::IBV_WR_RDMA_READ;
        wr.wr.rdma = rdma_t { remote_addr, rkey };
        self.post_send(&mut wr, 0, true)
    }

    /// From here on a receive that completes is not posted again: once the posted ones
    /// are used up, the peer's sends and writes with immediate wait for a receive (RNR)
    /// and, with the infinite RNR retry this project's client asks for, stay in flight.
    /// Only the test peer (`client::hostile`, case `grow-in-flight`) uses this.
    pub fn stop_reposting_receives(&mut self) {
        self.repost_receives = false;
    }

    /// Moves the queue pair to the error state without telling the peer: from here
    /// on it answers nothing, as a crashed host or a pulled cable would. Only the test
    /// peer (`client::hostile`, case `vanish`) uses this.
    pub fn fall_silent(&mut self) -> Result<()> {
        // SAFETY: all-zero is a valid ibv_qp_attr (plain integers).
        let mut attr: ibv_qp_attr = unsafe { std::mem::zeroed() };
        attr.qp_state = ibv_qp_state::IBV_QPS_ERR;
        // SAFETY: the QP is live; only the state is changed (the mask says so).
        if unsafe { (loaded().ibv_modify_qp)(self.qp(), &mut attr, ibv_qp_attr_mask::IBV_QP_STATE.0 as i32) } != 0 {
            return Err(VerbsError::last(VerbsOp::ModifyQp));
        }
        Ok(())
    }
}
