//! A verbs endpoint is the NIC side of the protocol driver (`protocol::driver`): the
//! client drives one directly; the server's transport wraps one with its RX growth.

use std::ops::Range;

use super::{Endpoint, VerbsError};
use crate::protocol::conn::WriteGrant;
use crate::protocol::driver::{LocalError, Nic, TxBuffersHeld};
use crate::protocol::ControlMessage;

impl From<VerbsError> for LocalError {
    fn from(e: VerbsError) -> Self {
        LocalError { call: e.op.name(), errno: e.errno }
    }
}

impl Nic for Endpoint {
    fn post_control(&mut self, msg: &ControlMessage) -> Result<(), LocalError> {
        Endpoint::post_control(self, msg).map_err(LocalError::from)
    }
    fn sq_room(&self) -> bool {
        self.can_write()
    }
    fn copy_rx(&mut self, range: Range<usize>, out: &mut [u8]) {
        Endpoint::copy_rx(self, range, out)
    }
    fn peer_rx_registered(&mut self, len: u32, _resized: bool) -> Result<(), TxBuffersHeld> {
        self.set_tx_len(len).map_err(|held| TxBuffersHeld(held as u32))
    }
    fn write_limit(&self, tx_offset: u32) -> usize {
        self.tx_write_limit(tx_offset) as usize
    }
    fn write_never_cut(&self) -> usize {
        self.tx_write_never_cut() as usize
    }
    #[inline(always)]
    fn post_write(&mut self, g: &WriteGrant, parts: &[&[u8]]) -> Result<(), LocalError> {
        Endpoint::post_write(self, g.offset, parts, g.len, g.remote_addr, g.rkey).map_err(LocalError::from)
    }
}
