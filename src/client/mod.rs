//! The client side of Valkey Over RDMA, on the same protocol core and verbs layer as
//! the module: connect over rdma_cm, a raw byte stream ([`RdmaStream`]) and a blocking
//! RESP API ([`Client`]). It interoperates with the upstream C module and with ours.
//!
//! ```no_run
//! let mut c = rdma::client::Client::connect("10.0.0.1:6379", Default::default())?;
//! let reply = c.command(&[b"SET", b"key", b"value"])?;
//! # Ok::<(), rdma::client::ClientError>(())
//! ```

pub mod bench;
pub mod hostile;
pub mod resp;

use std::net::{SocketAddr, ToSocketAddrs};
use std::time::{Duration, Instant};

use rdma_sys::{rdma_cm_event_type as ev, rdma_conn_param};

use crate::protocol::session::Role;
use crate::protocol::{ControlMessage, Session, SessionEvent, Violation, DEFAULT_RX_SIZE};
use crate::verbs::{self, CmId, Completion, Endpoint, EndpointConfig, EventChannel, VerbsError};
pub use resp::Reply;

/// Errors a user can act on.
#[derive(Debug)]
pub enum ClientError {
    /// No RDMA device, or rdma-core is missing: nothing can connect.
    NoDevice(String),
    /// The address does not resolve over RDMA, or the server refused the connection.
    Refused(String),
    /// The server went away.
    PeerGone,
    /// No answer in time.
    Timeout(&'static str),
    /// The server broke the Valkey Over RDMA protocol (docs/protocol.md §6).
    Protocol(Violation),
    /// The server's bytes are not RESP (what the parser could not read).
    Resp(String),
    Verbs(VerbsError),
}

impl std::fmt::Display for ClientError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            ClientError::NoDevice(s) => write!(f, "no RDMA device: {s}"),
            ClientError::Refused(s) => write!(f, "connection refused: {s}"),
            ClientError::PeerGone => write!(f, "the server closed the connection"),
            ClientError::Timeout(what) => write!(f, "timed out waiting for {what}"),
            ClientError::Protocol(v) => write!(f, "protocol error: {v}"),
            ClientError::Resp(s) => write!(f, "not a RESP reply: {s}"),
            ClientError::Verbs(e) => write!(f, "{e}"),
        }
    }
}

impl std::error::Error for ClientError {}

impl From<VerbsError> for ClientError {
    fn from(e: VerbsError) -> Self {
        ClientError::Verbs(e)
    }
}

pub type Result<T> = std::result::Result<T, ClientError>;

#[derive(Debug, Clone)]
pub struct Options {
    /// Our RX buffer (upstream clients use 1 MiB).
    pub rx_size: u32,
    /// Connect and per-operation timeout.
    pub timeout: Duration,
}

impl Default for Options {
    fn default() -> Self {
        Options { rx_size: DEFAULT_RX_SIZE, timeout: Duration::from_secs(10) }
    }
}

/// A connected RDMA byte stream to a Valkey server.
pub struct RdmaStream {
    // Field order is drop order: the endpoint (with its id) before the channel.
    ep: Endpoint,
    channel: EventChannel,
    pub(crate) session: Session,
    timeout: Duration,
    gone: bool,
    /// Features the server reported, once asked.
    pub server_features: Option<u64>,
    /// Keepalive messages received from the server.
    pub keepalives: u64,
}

fn wait_readable(fds: &[i32], timeout: Duration) -> bool {
    let mut p: Vec<libc::pollfd> =
        fds.iter().map(|&fd| libc::pollfd { fd, events: libc::POLLIN, revents: 0 }).collect();
    // SAFETY: `p` is a live array of pollfd of the length passed.
    let n = unsafe {
        libc::poll(p.as_mut_ptr(), p.len() as libc::nfds_t, timeout.as_millis().min(i32::MAX as u128) as i32)
    };
    n > 0
}

impl RdmaStream {
    pub fn connect(addr: impl ToSocketAddrs, opts: &Options) -> Result<RdmaStream> {
        let addr: SocketAddr = addr
            .to_socket_addrs()
            .map_err(|e| ClientError::Refused(e.to_string()))?
            .next()
            .ok_or_else(|| ClientError::Refused("the address resolves to nothing".into()))?;
        verbs::lib().map_err(|e| ClientError::NoDevice(e.to_string()))?;
        let channel = EventChannel::new().map_err(|e| ClientError::NoDevice(format!("{e} (is rdma_ucm loaded?)")))?;
        let id = CmId::new(&channel)?;
        let deadline = Instant::now() + opts.timeout;
        id.resolve_addr(&addr, 2000).map_err(|e| ClientError::Refused(format!("{addr}: {e}")))?;
        expect_event(&channel, ev::RDMA_CM_EVENT_ADDR_RESOLVED, deadline, &addr)?;
        id.resolve_route(2000).map_err(|e| ClientError::Refused(format!("{addr}: {e}")))?;
        expect_event(&channel, ev::RDMA_CM_EVENT_ROUTE_RESOLVED, deadline, &addr)?;
        let mut ep = Endpoint::new(
            id,
            &EndpointConfig { rx_size: opts.rx_size, comp_vector: Some(0), reject_on_failure: false },
        )?;
        // SAFETY: all-zero is a valid rdma_conn_param (no private data).
        let mut param: rdma_conn_param = unsafe { std::mem::zeroed() };
        param.responder_resources = 1;
        param.initiator_depth = 1;
        param.retry_count = 7;
        param.rnr_retry_count = 7;
        ep.id().connect(&mut param).map_err(|e| ClientError::Refused(format!("{addr}: {e}")))?;
        expect_event(&channel, ev::RDMA_CM_EVENT_ESTABLISHED, deadline, &addr)?;
        let session = Session::new(Role::Client, ep.rx_addr(), ep.rx_len(), ep.rx_key());
        ep.post_control(&session.register_rx())?;
        let mut s = RdmaStream {
            ep,
            channel,
            session,
            timeout: opts.timeout,
            gone: false,
            server_features: None,
            keepalives: 0,
        };
        // Wait for the server's RegisterXferMemory: until then nothing can be written.
        while s.session.tx.is_empty() {
            s.wait(deadline, "the server's RegisterXferMemory")?;
        }
        Ok(s)
    }

    pub fn peer_addr(&self) -> Option<SocketAddr> {
        self.ep.id().peer_addr()
    }

    /// Processes completions and CM events that are already there (no waiting).
    /// Returns whether anything was processed. Public so that a non-blocking driver
    /// (the TCP bridge) can run it when one of [`poll_fds`](Self::poll_fds) wakes.
    ///
    /// Data that arrived before a disconnect stays readable: completions are handled
    /// before CM events, every successful completion of a batch is handled even when a
    /// later one failed (flushes after the peer left), and once a CM event says the
    /// peer is gone the CQ is drained once more, for writes that completed between the
    /// two looks. Returns `PeerGone` when a work request failed.
    pub fn pump(&mut self) -> Result<bool> {
        let (mut progressed, mut failed) = self.drain_completions()?;
        let was_gone = self.gone;
        while let Some(e) = self.channel.next_event()? {
            progressed = true;
            if matches!(
                e.kind(),
                ev::RDMA_CM_EVENT_DISCONNECTED | ev::RDMA_CM_EVENT_TIMEWAIT_EXIT | ev::RDMA_CM_EVENT_DEVICE_REMOVAL
            ) {
                self.gone = true;
            }
        }
        if self.gone && !was_gone {
            let (p, f) = self.drain_completions()?;
            progressed |= p;
            failed |= f;
        }
        if failed {
            self.gone = true;
            return Err(ClientError::PeerGone);
        }
        Ok(progressed)
    }

    /// Polls the CQ empty and feeds the session. Returns (anything processed, a work
    /// request failed).
    fn drain_completions(&mut self) -> Result<(bool, bool)> {
        let mut completions = Vec::new();
        self.ep.poll(usize::MAX, |c| completions.push(c))?;
        let mut failed = false;
        for c in &completions {
            match *c {
                Completion::Control { bytes, len } => {
                    match self.session.on_control(&bytes[..(len as usize).min(32)]).map_err(ClientError::Protocol)? {
                        SessionEvent::PeerRxRegistered { len, resized: true } => self.ep.ensure_tx(len)?,
                        SessionEvent::ServerFeatures(f) => self.server_features = Some(f),
                        SessionEvent::Keepalive => self.keepalives += 1,
                        _ => {}
                    }
                }
                Completion::Data { imm } => self.session.on_data(imm).map_err(ClientError::Protocol)?,
                Completion::Failed { .. } => failed = true,
            }
        }
        Ok((!completions.is_empty(), failed))
    }

    /// The fds a non-blocking driver polls for POLLIN: the completion channel and the
    /// rdma_cm event channel. When either is readable, call [`pump`](Self::pump)
    /// (or [`peek`](Self::peek) / [`try_read`](Self::try_read), which pump first).
    pub fn poll_fds(&self) -> [i32; 2] {
        [self.ep.comp_fd(), self.channel.fd()]
    }

    /// Bytes [`try_write`](Self::try_write) accepts now, in one write: the room left in
    /// the server's RX window, or 0 when that window is used up, the send queue is
    /// full or the peer is gone. A relay reads only this much from its source, so
    /// nothing is buffered beyond the window and backpressure reaches the source.
    pub fn write_room(&self) -> usize {
        if self.gone || !self.ep.can_write() {
            return 0;
        }
        self.session.tx.available() as usize
    }

    /// The unread received bytes, after processing what is there (never waits). Empty
    /// when nothing is there yet; `PeerGone` only once the peer is gone *and* every byte
    /// it sent before leaving was consumed. Give back what was used with
    /// [`consume`](Self::consume): a relay consumes only what its sink accepted, so the
    /// server's window stays closed while the sink is blocked.
    pub fn peek(&mut self) -> Result<&[u8]> {
        match self.pump() {
            Ok(_) | Err(ClientError::PeerGone) => {}
            Err(e) => return Err(e),
        }
        let range = self.session.rx.readable();
        if range.is_empty() && self.gone {
            return Err(ClientError::PeerGone);
        }
        Ok(&self.ep.rx_bytes()[range])
    }

    /// Marks `n` bytes of what [`peek`](Self::peek) returned as used; when that empties
    /// a full RX buffer it is handed back to the server (RegisterXferMemory), unless
    /// the server is gone.
    pub fn consume(&mut self, n: usize) -> Result<()> {
        if let Some(msg) = self.session.consume(n) {
            if !self.gone {
                self.ep.post_control(&msg)?;
            }
        }
        Ok(())
    }

    /// Copies what was received into `buf` without waiting: `Ok(0)` means nothing now
    /// (the blocking [`read`](Self::read) waits instead). Bytes that arrived before the
    /// peer left are returned first; `PeerGone` comes once none is left.
    pub fn try_read(&mut self, buf: &mut [u8]) -> Result<usize> {
        let bytes = self.peek()?;
        let n = bytes.len().min(buf.len());
        buf[..n].copy_from_slice(&bytes[..n]);
        self.consume(n)?;
        Ok(n)
    }

    /// Waits until something happens (a completion or a CM event), then processes it.
    /// Returns at once if something was already there: the caller re-checks its
    /// condition (blocking now would sleep through what just arrived).
    fn wait(&mut self, deadline: Instant, what: &'static str) -> Result<()> {
        if self.pump()? && !self.gone {
            return Ok(());
        }
        if self.gone {
            return Err(ClientError::PeerGone);
        }
        let now = Instant::now();
        if now >= deadline {
            return Err(ClientError::Timeout(what));
        }
        wait_readable(&[self.ep.comp_fd(), self.channel.fd()], deadline - now);
        self.pump().map(|_| ())
    }

    /// Writes all of `data`, waiting for the server to re-open its RX buffer when full.
    pub fn write_all(&mut self, mut data: &[u8]) -> Result<()> {
        let deadline = Instant::now() + self.timeout;
        while !data.is_empty() {
            let n = self.try_write(data)?;
            data = &data[n..];
            if n == 0 {
                self.wait(deadline, "the server to consume its RX buffer")?;
            }
        }
        Ok(())
    }

    /// Writes as much as the window takes now (one RDMA_WRITE_WITH_IMM).
    pub fn try_write(&mut self, data: &[u8]) -> Result<usize> {
        if self.gone {
            return Err(ClientError::PeerGone);
        }
        if !self.ep.can_write() {
            return Ok(0);
        }
        let Some((offset, n)) = self.session.tx.reserve(data.len()) else { return Ok(0) };
        let (addr, rkey) = (self.session.tx.remote_addr, self.session.tx.rkey);
        self.ep.post_write(offset, &[data], n, addr, rkey)?;
        Ok(n as usize)
    }

    /// Reads what is there, waiting up to the timeout for at least one byte.
    pub fn read(&mut self, buf: &mut [u8]) -> Result<usize> {
        let deadline = Instant::now() + self.timeout;
        loop {
            let range = self.session.rx.readable();
            if !range.is_empty() {
                let n = range.len().min(buf.len());
                buf[..n].copy_from_slice(&self.ep.rx_bytes()[range.start..range.start + n]);
                self.consume(n)?;
                return Ok(n);
            }
            match self.wait(deadline, "a reply") {
                // the last bytes and the disconnect came together: hand out the bytes first
                Err(ClientError::PeerGone) if self.session.rx.has_unread() => {}
                r => r?,
            }
        }
    }

    /// Asks the server for its features (GetServerFeature) and waits for the answer.
    pub fn server_features(&mut self) -> Result<u64> {
        self.ep.post_control(&ControlMessage::GetServerFeature { select_raw: [0, 0], features: 0 })?;
        let deadline = Instant::now() + self.timeout;
        self.server_features = None;
        loop {
            if let Some(f) = self.server_features {
                return Ok(f);
            }
            self.wait(deadline, "GetServerFeature's answer")?;
        }
    }

    /// Tells the server which features we want (SetClientFeature); none is defined,
    /// so only 0 is meaningful today.
    pub fn set_client_features(&mut self, features: u64) -> Result<()> {
        Ok(self.ep.post_control(&ControlMessage::SetClientFeature { select_raw: [0, 0], features })?)
    }

    pub(crate) fn endpoint(&mut self) -> &mut Endpoint {
        &mut self.ep
    }

    /// Processes whatever arrives for `d` (lets the server's messages arrive).
    pub fn settle(&mut self, d: Duration) -> Result<()> {
        let deadline = Instant::now() + d;
        while Instant::now() < deadline {
            match self.wait(deadline, "nothing") {
                Ok(()) | Err(ClientError::Timeout(_)) => {}
                Err(e) => return Err(e),
            }
        }
        Ok(())
    }

    pub fn is_gone(&self) -> bool {
        self.gone
    }
}

impl Drop for RdmaStream {
    fn drop(&mut self) {
        self.ep.disconnect();
    }
}

fn expect_event(ch: &EventChannel, want: u32, deadline: Instant, addr: &SocketAddr) -> Result<()> {
    loop {
        if let Some(e) = ch.next_event()? {
            let (kind, status) = (e.kind(), e.status());
            drop(e);
            if kind == want {
                return Ok(());
            }
            return Err(ClientError::Refused(format!(
                "{addr}: {} (status {status}){}",
                verbs::event_name(kind),
                if kind == ev::RDMA_CM_EVENT_ADDR_ERROR || kind == ev::RDMA_CM_EVENT_ROUTE_ERROR {
                    " - is the address on an RDMA device?"
                } else {
                    ""
                }
            )));
        }
        let now = Instant::now();
        if now >= deadline {
            return Err(ClientError::Timeout("the connection to be set up"));
        }
        wait_readable(&[ch.fd()], deadline - now);
    }
}

/// A blocking RESP client over an [`RdmaStream`].
pub struct Client {
    stream: RdmaStream,
    inbuf: Vec<u8>,
    /// Where each read lands before it joins `inbuf` (allocated once, not per read).
    chunk: Vec<u8>,
    scanner: resp::FrameScanner,
}

impl Client {
    pub fn connect(addr: impl ToSocketAddrs, opts: Options) -> Result<Client> {
        Ok(Client {
            stream: RdmaStream::connect(addr, &opts)?,
            inbuf: Vec::new(),
            chunk: vec![0; 256 * 1024],
            scanner: Default::default(),
        })
    }

    pub fn stream(&mut self) -> &mut RdmaStream {
        &mut self.stream
    }

    /// Sends one command and waits for its reply.
    pub fn command(&mut self, args: &[&[u8]]) -> Result<Reply> {
        Ok(self.pipeline(&[args.to_vec()])?.pop().expect("one reply per command"))
    }

    /// Sends all commands at once, then reads one reply per command.
    pub fn pipeline(&mut self, cmds: &[Vec<&[u8]>]) -> Result<Vec<Reply>> {
        let mut out = Vec::new();
        for c in cmds {
            resp::encode(c, &mut out);
        }
        self.stream.write_all(&out)?;
        (0..cmds.len()).map(|_| self.read_reply()).collect()
    }

    /// Reads the next reply. The scanner finds its end as bytes arrive; it is parsed
    /// once, when complete (linear in the reply's size, however many windows it spans).
    pub fn read_reply(&mut self) -> Result<Reply> {
        loop {
            if let Some(end) = self.scanner.scan(&self.inbuf).map_err(ClientError::Resp)? {
                let (r, used) = resp::parse(&self.inbuf[..end])
                    .map_err(ClientError::Resp)?
                    .ok_or_else(|| ClientError::Resp("reply ends where the scanner said it would not".into()))?;
                self.inbuf.drain(..used);
                return Ok(r);
            }
            let n = self.stream.read(&mut self.chunk)?;
            self.inbuf.extend_from_slice(&self.chunk[..n]);
        }
    }
}
