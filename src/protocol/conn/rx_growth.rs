//! Growing the server's RX buffer at hand-backs (the adaptive RX window,
//! docs/protocol.md §4.3): the core decides when and how large, the driver prepares the
//! buffer off the event loop and swaps it in.

use super::{Conn, RxBuffer};

/// Growing the server's RX buffer (adaptive RX window, docs/protocol.md §4.3).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum RxGrowth {
    None,
    /// The peer outgrew a buffer below the cap: the driver should prepare this size.
    Wanted(u32),
    /// The driver is preparing it.
    Preparing,
    /// Prepared: the next hand-back names it.
    Ready(RxBuffer),
}

impl Conn {
    /// Server: the RX buffer may grow up to `cap` bytes at hand-backs (the operator's
    /// `rdma-rx-size`; the connection starts with a smaller buffer, so that an idle
    /// connection pins little). Never below the current buffer.
    pub fn set_rx_cap(&mut self, cap: u32) {
        self.rx_cap = cap.max(self.session.rx.len());
    }

    /// The size of the next RX buffer: one growth step up, at most the cap
    /// (docs/protocol.md §4.3).
    pub(super) fn next_rx_size(&self) -> u32 {
        self.session.rx.len().saturating_mul(crate::protocol::RX_GROWTH_FACTOR).min(self.rx_cap)
    }

    /// A larger RX buffer of this many bytes is wanted: the driver starts preparing it
    /// (once; it answers with [`rx_growth_ready`](Self::rx_growth_ready)).
    pub fn take_rx_growth_wanted(&mut self) -> Option<u32> {
        match self.rx_growth {
            RxGrowth::Wanted(len) => {
                self.rx_growth = RxGrowth::Preparing;
                Some(len)
            }
            _ => None,
        }
    }

    /// The driver's answer to [`take_rx_growth_wanted`](Self::take_rx_growth_wanted):
    /// the prepared buffer (registered, not yet named to the peer), or `None` when it
    /// could not be made (the cap is lowered to the current buffer: no retry).
    pub fn rx_growth_ready(&mut self, new: Option<RxBuffer>) {
        if self.rx_growth != RxGrowth::Preparing {
            return;
        }
        match new {
            Some(b) => self.rx_growth = RxGrowth::Ready(b),
            None => {
                self.rx_growth = RxGrowth::None;
                self.rx_cap = self.session.rx.len();
            }
        }
    }

    /// True once after a hand-back named the prepared buffer: the driver makes it the
    /// RX buffer now, after copying out the bytes just read and before posting control
    /// messages. The old buffer may be freed then.
    pub fn take_rx_swap(&mut self) -> bool {
        std::mem::take(&mut self.rx_swap_due)
    }
}
