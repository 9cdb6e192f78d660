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
    /// The server broke the protocol.
    Protocol(String),
    Verbs(VerbsError),
}

impl std::fmt::Display for ClientError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            ClientError::NoDevice(s) => write!(f, "no RDMA device: {s}"),
            ClientError::Refused(s) => write!(f, "connection refused: {s}"),
            ClientError::PeerGone => write!(f, "the server closed the connection"),
            ClientError::Timeout(what) => write!(f, "timed out waiting for {what}"),
            ClientError::Protocol(s) => write!(f, "protocol error: {s}"),
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
        let mut ep = Endpoint::new(id, &EndpointConfig { rx_size: opts.rx_size, comp_vector: Some(0) })?;
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
    /// Returns whether anything was processed.
    pub(crate) fn pump(&mut self) -> Result<bool> {
        let mut completions = Vec::new();
        self.ep.poll(|c| completions.push(c))?;
        let mut progressed = !completions.is_empty();
        for c in completions {
            match c {
                Completion::Control { bytes, len } => {
                    match self
                        .session
                        .on_control(&bytes[..(len as usize).min(32)])
                        .map_err(|v: Violation| ClientError::Protocol(v.to_string()))?
                    {
                        SessionEvent::PeerRxRegistered { len, resized: true } => self.ep.ensure_tx(len)?,
                        SessionEvent::ServerFeatures(f) => self.server_features = Some(f),
                        SessionEvent::Keepalive => self.keepalives += 1,
                        _ => {}
                    }
                }
                Completion::Data { imm } => {
                    self.session.on_data(imm).map_err(|v| ClientError::Protocol(v.to_string()))?
                }
                Completion::Failed { .. } => {
                    self.gone = true;
                    return Err(ClientError::PeerGone);
                }
            }
        }
        while let Some(e) = self.channel.next_event()? {
            progressed = true;
            if matches!(
                e.kind(),
                ev::RDMA_CM_EVENT_DISCONNECTED | ev::RDMA_CM_EVENT_TIMEWAIT_EXIT | ev::RDMA_CM_EVENT_DEVICE_REMOVAL
            ) {
                self.gone = true;
            }
        }
        Ok(progressed)
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
                if let Some(msg) = self.session.consume(n) {
                    self.ep.post_control(&msg)?;
                }
                return Ok(n);
            }
            self.wait(deadline, "a reply")?;
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
}

impl Client {
    pub fn connect(addr: impl ToSocketAddrs, opts: Options) -> Result<Client> {
        Ok(Client { stream: RdmaStream::connect(addr, &opts)?, inbuf: Vec::new() })
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

    /// Reads the next reply.
    pub fn read_reply(&mut self) -> Result<Reply> {
        let mut chunk = vec![0u8; 64 * 1024];
        loop {
            if let Some((r, used)) = resp::parse(&self.inbuf).map_err(ClientError::Protocol)? {
                self.inbuf.drain(..used);
                return Ok(r);
            }
            let n = self.stream.read(&mut chunk)?;
            self.inbuf.extend_from_slice(&chunk[..n]);
        }
    }
}
