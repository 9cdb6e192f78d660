//! RAII owners for rdma_cm and verbs objects. Each `Drop` calls the matching destroy
//! function; each constructor returns a [`VerbsError`] carrying errno on failure.

use std::ffi::c_void;
use std::ptr::NonNull;

use rdma_sys::*;

use super::{lib, Lib, Result, VerbsError, VerbsOp};

/// The loaded libraries. Only called by owners that exist, which proves loading worked.
pub(super) fn loaded() -> &'static Lib {
    lib().expect("verbs objects exist only after the libraries were loaded")
}

fn not_loaded(op: VerbsOp) -> VerbsError {
    VerbsError::with(op, libc::ELIBACC)
}

/// An rdma_cm event channel: a non-blocking fd that becomes readable when CM events
/// (connect requests, ESTABLISHED, DISCONNECTED, …) are queued.
pub struct EventChannel(NonNull<rdma_event_channel>);

// SAFETY: an event channel is a kernel fd plus plain data; librdmacm allows its use
// from any thread. Events are read on one thread only; another may destroy or
// disconnect an id of the channel meanwhile (the connections' teardown on
// `rdma-release`), which librdmacm and the kernel serialise per id.
unsafe impl Send for EventChannel {}
// SAFETY: as for Send: reading events takes `&self` on the one thread that reads them;
// what other threads do through `&self` librdmacm serialises per id.
unsafe impl Sync for EventChannel {}

impl EventChannel {
    pub fn new() -> Result<Self> {
        let l = lib().map_err(|_| not_loaded(VerbsOp::CreateEventChannel))?;
        // SAFETY: no arguments; a NULL return is handled.
        let ch = NonNull::new(unsafe { (l.rdma_create_event_channel)() })
            .ok_or_else(|| VerbsError::last(VerbsOp::CreateEventChannel))?;
        let ch = EventChannel(ch);
        set_nonblocking(ch.fd()).map_err(|e| VerbsError::with(VerbsOp::SetNonblocking, e))?;
        Ok(ch)
    }
    pub fn fd(&self) -> i32 {
        // SAFETY: the channel is live while self is.
        unsafe { self.0.as_ref().fd }
    }
    pub fn as_ptr(&self) -> *mut rdma_event_channel {
        self.0.as_ptr()
    }
    /// The next queued event, already acknowledged, or `None` when there is none
    /// (EAGAIN). Acking first is what librdmacm needs before an id is migrated, accepted
    /// or destroyed (those wait for the acks of its events), so callers get plain values.
    pub fn next_event(&self) -> Result<Option<CmEvent>> {
        let mut ev: *mut rdma_cm_event = std::ptr::null_mut();
        // SAFETY: the channel is live; `ev` receives an event that is acked below.
        if unsafe { (loaded().rdma_get_cm_event)(self.as_ptr(), &mut ev) } != 0 {
            let e = VerbsError::last(VerbsOp::GetCmEvent);
            return if e.errno == libc::EAGAIN { Ok(None) } else { Err(e) };
        }
        let Some(ev) = NonNull::new(ev) else { return Ok(None) };
        // SAFETY: the event is live until acked; only plain fields are copied, and the
        // id's user context (set by `CmId::set_context`) is read while the id is live.
        let out = unsafe {
            let e = ev.as_ref();
            let context = if e.id.is_null() { 0 } else { (*e.id).context as usize };
            let new_id = if e.event == rdma_cm_event_type::RDMA_CM_EVENT_CONNECT_REQUEST {
                // A CONNECT_REQUEST's id is new and belongs to whoever receives the
                // event: dropping it unaccepted rejects the request.
                NonNull::new(e.id).map(CmId)
            } else {
                None
            };
            CmEvent { kind: e.event, status: e.status, context, new_id }
        };
        // SAFETY: acked exactly once; nothing points into it afterwards.
        unsafe { (loaded().rdma_ack_cm_event)(ev.as_ptr()) };
        Ok(Some(out))
    }
}

impl Drop for EventChannel {
    fn drop(&mut self) {
        // SAFETY: every id on this channel was destroyed first (owners of ids keep
        // their channel alive by construction order); the pointer is not used again.
        unsafe { (loaded().rdma_destroy_event_channel)(self.0.as_ptr()) }
    }
}

/// A received (and acknowledged) CM event.
pub struct CmEvent {
    pub kind: rdma_cm_event_type::Type,
    pub status: i32,
    /// The user context of the event's id ([`CmId::set_context`]); 0 if none was set.
    pub context: usize,
    /// For a CONNECT_REQUEST, the new connection's id, now the receiver's to accept or
    /// drop (which rejects the request).
    pub new_id: Option<CmId>,
}

impl CmEvent {
    pub fn name(&self) -> String {
        event_name(self.kind)
    }
    pub fn is_addr_resolved(&self) -> bool {
        self.kind == rdma_cm_event_type::RDMA_CM_EVENT_ADDR_RESOLVED
    }
    pub fn is_route_resolved(&self) -> bool {
        self.kind == rdma_cm_event_type::RDMA_CM_EVENT_ROUTE_RESOLVED
    }
    /// The address or route does not resolve (not on an RDMA device?).
    pub fn is_resolve_error(&self) -> bool {
        matches!(
            self.kind,
            rdma_cm_event_type::RDMA_CM_EVENT_ADDR_ERROR | rdma_cm_event_type::RDMA_CM_EVENT_ROUTE_ERROR
        )
    }
    /// An orderly DISCONNECTED (the other ends of a connection are errors).
    pub fn is_disconnected(&self) -> bool {
        self.kind == rdma_cm_event_type::RDMA_CM_EVENT_DISCONNECTED
    }
    pub fn is_established(&self) -> bool {
        self.kind == rdma_cm_event_type::RDMA_CM_EVENT_ESTABLISHED
    }
    /// The id's device is being removed (docs/operator-guide.md, "When a device goes away").
    pub fn is_device_removal(&self) -> bool {
        self.kind == rdma_cm_event_type::RDMA_CM_EVENT_DEVICE_REMOVAL
    }
    /// The id's address moved to another device, or went away.
    pub fn is_addr_change(&self) -> bool {
        self.kind == rdma_cm_event_type::RDMA_CM_EVENT_ADDR_CHANGE
    }
    /// The connection is over for this event's id (docs/protocol.md §1).
    pub fn is_disconnect(&self) -> bool {
        use rdma_cm_event_type as ev;
        matches!(
            self.kind,
            ev::RDMA_CM_EVENT_DISCONNECTED
                | ev::RDMA_CM_EVENT_TIMEWAIT_EXIT
                | ev::RDMA_CM_EVENT_DEVICE_REMOVAL
                | ev::RDMA_CM_EVENT_CONNECT_ERROR
                | ev::RDMA_CM_EVENT_UNREACHABLE
                | ev::RDMA_CM_EVENT_REJECTED
                | ev::RDMA_CM_EVENT_ADDR_CHANGE
        )
    }
}

pub fn event_name(kind: rdma_cm_event_type::Type) -> String {
    // SAFETY: rdma_event_str returns a static string for any value.
    unsafe { std::ffi::CStr::from_ptr((loaded().rdma_event_str)(kind)).to_string_lossy().into_owned() }
}

/// The connection parameters of `rdma_accept`/`rdma_connect` this project uses: one
/// outstanding RDMA read each way (we never read), and the retry counts.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ConnParams {
    /// Transport retries before a work request fails (7 is the maximum).
    pub retry_count: u8,
    /// Receiver-not-ready retries; 7 means "retry forever".
    pub rnr_retry_count: u8,
}

impl ConnParams {
    fn to_raw(self) -> rdma_conn_param {
        // SAFETY: all-zero is a valid rdma_conn_param (no private data).
        let mut p: rdma_conn_param = unsafe { std::mem::zeroed() };
        p.responder_resources = 1;
        p.initiator_depth = 1;
        p.retry_count = self.retry_count;
        p.rnr_retry_count = self.rnr_retry_count;
        p
    }
}

/// An rdma_cm identifier (a listener or one connection's endpoint). Destroys its QP, if
/// one was created on it, and then itself.
pub struct CmId(NonNull<rdma_cm_id>);

// SAFETY: see EventChannel: librdmacm allows an id's calls from any thread.
unsafe impl Send for CmId {}
// SAFETY: every method taking `&self` is a librdmacm call, which serialises per id, or
// reads fields librdmacm changes only inside such calls; the one field this crate
// writes (`context`) takes `&mut self`.
unsafe impl Sync for CmId {}

impl CmId {
    pub fn new(channel: &EventChannel) -> Result<Self> {
        let mut id = std::ptr::null_mut();
        // SAFETY: the channel is live; `id` receives a new id owned by the result.
        let rc = unsafe {
            (loaded().rdma_create_id)(channel.as_ptr(), &mut id, std::ptr::null_mut(), rdma_port_space::RDMA_PS_TCP)
        };
        if rc != 0 {
            return Err(VerbsError::last(VerbsOp::CreateId));
        }
        NonNull::new(id).map(CmId).ok_or_else(|| VerbsError::with(VerbsOp::CreateId, libc::EINVAL))
    }
    pub(super) fn as_ptr(&self) -> *mut rdma_cm_id {
        self.0.as_ptr()
    }
    pub(super) fn raw(&self) -> &rdma_cm_id {
        // SAFETY: the id is live while self is; rdma_cm only changes it inside calls.
        unsafe { self.0.as_ref() }
    }
    /// Stores a key in the id's user field, returned as [`CmEvent::context`] with its
    /// CM events. Never dereferenced.
    pub fn set_context(&mut self, key: usize) {
        // SAFETY: `context` is the user's field of a live id; librdmacm never reads it.
        unsafe { (*self.0.as_ptr()).context = key as *mut c_void }
    }
    pub fn migrate(&self, channel: &EventChannel) -> Result<()> {
        // SAFETY: both live; all events of this id were acked before (see CmEvent).
        check(unsafe { (loaded().rdma_migrate_id)(self.as_ptr(), channel.as_ptr()) }, VerbsOp::MigrateId)
    }
    /// `rdma_set_option(RDMA_OPTION_ID, name, value)`.
    fn set_option<T: Copy>(&self, name: i32, value: T) -> Result<()> {
        let mut v = value;
        // SAFETY: the option value is a live `T` of the size passed; the id is live.
        check(
            unsafe {
                (loaded().rdma_set_option)(
                    self.as_ptr(),
                    RDMA_OPTION_LEVEL_ID,
                    name,
                    (&mut v as *mut T).cast(),
                    std::mem::size_of::<T>(),
                )
            },
            VerbsOp::SetOption,
        )
    }
    /// IPv6 only (like IPV6_V6ONLY), so that `::` and `0.0.0.0` can both listen.
    pub fn set_afonly(&self) -> Result<()> {
        self.set_option(RDMA_OPTION_ID_AFONLY, 1i32)
    }
    pub fn bind(&self, addr: &std::net::SocketAddr) -> Result<()> {
        let mut sa = SockAddr::from(addr);
        // SAFETY: `sa` is a valid sockaddr_in/in6 for the call's duration.
        check(unsafe { (loaded().rdma_bind_addr)(self.as_ptr(), sa.as_mut_ptr()) }, VerbsOp::BindAddr)
    }
    pub fn listen(&self, backlog: i32) -> Result<()> {
        // SAFETY: the id is live and bound.
        check(unsafe { (loaded().rdma_listen)(self.as_ptr(), backlog) }, VerbsOp::Listen)
    }
    pub fn resolve_addr(&self, dst: &std::net::SocketAddr, timeout_ms: i32) -> Result<()> {
        let mut sa = SockAddr::from(dst);
        // SAFETY: `sa` is valid for the call; a NULL source lets rdma_cm choose.
        check(
            unsafe { (loaded().rdma_resolve_addr)(self.as_ptr(), std::ptr::null_mut(), sa.as_mut_ptr(), timeout_ms) },
            VerbsOp::ResolveAddr,
        )
    }
    pub fn resolve_route(&self, timeout_ms: i32) -> Result<()> {
        // SAFETY: the id is live with a resolved address.
        check(unsafe { (loaded().rdma_resolve_route)(self.as_ptr(), timeout_ms) }, VerbsOp::ResolveRoute)
    }
    pub fn accept(&self, params: ConnParams) -> Result<()> {
        let mut p = params.to_raw();
        // SAFETY: `p` is valid for the call.
        check(unsafe { (loaded().rdma_accept)(self.as_ptr(), &mut p) }, VerbsOp::Accept)
    }
    pub fn connect(&self, params: ConnParams) -> Result<()> {
        let mut p = params.to_raw();
        // SAFETY: `p` is valid for the call.
        check(unsafe { (loaded().rdma_connect)(self.as_ptr(), &mut p) }, VerbsOp::Connect)
    }
    pub fn reject(&self) {
        // SAFETY: the id is live; no private data.
        unsafe { (loaded().rdma_reject)(self.as_ptr(), std::ptr::null(), 0) };
    }
    pub fn disconnect(&self) {
        // SAFETY: the id is live; disconnecting twice or before connecting only errors.
        unsafe { (loaded().rdma_disconnect)(self.as_ptr()) };
    }
    /// The device port the id is bound to (0 before its address is bound or resolved).
    pub fn port_num(&self) -> u8 {
        self.raw().port_num
    }
    pub fn local_addr(&self) -> Option<std::net::SocketAddr> {
        // SAFETY: route.addr is plain data inside the live id.
        sockaddr_to_std(unsafe { &*std::ptr::addr_of!(self.raw().route.addr.src_addr_union).cast() })
    }
    pub fn peer_addr(&self) -> Option<std::net::SocketAddr> {
        // SAFETY: as above.
        sockaddr_to_std(unsafe { &*std::ptr::addr_of!(self.raw().route.addr.dst_addr_union).cast() })
    }
}

impl CmId {
    /// Takes the QP out of the id: from here on librdmacm does not touch it (it moves
    /// an id's QP to the error state itself while it reads some CM events, and in
    /// `rdma_disconnect`), and `Drop` does not destroy it. The caller owns it and
    /// destroys it with `ibv_destroy_qp` before the id. That is all `rdma_destroy_qp`
    /// would do: our QPs' CQs are always our own, never ones librdmacm made for the id.
    /// Only on the thread that reads this id's CM events.
    pub fn take_qp(&self) -> *mut ibv_qp {
        // SAFETY: a plain field of the live id, which librdmacm reads only on the thread
        // that reads its events (the one calling this) or in calls made on the id.
        unsafe { std::mem::replace(&mut (*self.0.as_ptr()).qp, std::ptr::null_mut()) }
    }
}

impl Drop for CmId {
    fn drop(&mut self) {
        // SAFETY: the QP (if any) was created on this id and nothing posts to it any
        // more; its events were all acked. Neither pointer is used afterwards.
        unsafe {
            if !self.raw().qp.is_null() {
                (loaded().rdma_destroy_qp)(self.as_ptr());
            }
            (loaded().rdma_destroy_id)(self.as_ptr());
        }
    }
}

/// rdma_cma.h: option level `RDMA_OPTION_ID` and option `RDMA_OPTION_ID_AFONLY` (~IPV6_V6ONLY);
/// anonymous enums that bindgen does not carry into rdma-sys.
const RDMA_OPTION_LEVEL_ID: i32 = 0;
const RDMA_OPTION_ID_AFONLY: i32 = 2;

fn check(rc: i32, op: VerbsOp) -> Result<()> {
    if rc == 0 {
        Ok(())
    } else {
        Err(VerbsError::last(op))
    }
}

pub fn set_nonblocking(fd: i32) -> std::result::Result<(), i32> {
    // SAFETY: fcntl on an fd we own; failures are reported through errno.
    unsafe {
        let flags = libc::fcntl(fd, libc::F_GETFL);
        if flags < 0 || libc::fcntl(fd, libc::F_SETFL, flags | libc::O_NONBLOCK) < 0 {
            return Err(std::io::Error::last_os_error().raw_os_error().unwrap_or(0));
        }
        let fdflags = libc::fcntl(fd, libc::F_GETFD);
        if fdflags >= 0 {
            libc::fcntl(fd, libc::F_SETFD, fdflags | libc::FD_CLOEXEC);
        }
    }
    Ok(())
}

/// A sockaddr_in or sockaddr_in6 built from a std address.
#[repr(C)]
pub union SockAddr {
    v4: libc::sockaddr_in,
    v6: libc::sockaddr_in6,
}

impl SockAddr {
    fn as_mut_ptr(&mut self) -> *mut libc::sockaddr {
        (self as *mut Self).cast()
    }
}

impl From<&std::net::SocketAddr> for SockAddr {
    fn from(a: &std::net::SocketAddr) -> Self {
        match a {
            std::net::SocketAddr::V4(a) => SockAddr {
                v4: libc::sockaddr_in {
                    sin_family: libc::AF_INET as u16,
                    sin_port: a.port().to_be(),
                    sin_addr: libc::in_addr { s_addr: u32::from_ne_bytes(a.ip().octets()) },
                    sin_zero: [0; 8],
                },
            },
            std::net::SocketAddr::V6(a) => SockAddr {
                v6: libc::sockaddr_in6 {
                    sin6_family: libc::AF_INET6 as u16,
                    sin6_port: a.port().to_be(),
                    sin6_flowinfo: 0,
                    sin6_addr: libc::in6_addr { s6_addr: a.ip().octets() },
                    sin6_scope_id: a.scope_id(),
                },
            },
        }
    }
}

fn sockaddr_to_std(sa: &libc::sockaddr_storage) -> Option<std::net::SocketAddr> {
    match sa.ss_family as i32 {
        libc::AF_INET => {
            // SAFETY: the family says this storage holds a sockaddr_in.
            let s = unsafe { &*(sa as *const libc::sockaddr_storage).cast::<libc::sockaddr_in>() };
            Some(std::net::SocketAddr::from((s.sin_addr.s_addr.to_ne_bytes(), u16::from_be(s.sin_port))))
        }
        libc::AF_INET6 => {
            // SAFETY: the family says this storage holds a sockaddr_in6.
            let s = unsafe { &*(sa as *const libc::sockaddr_storage).cast::<libc::sockaddr_in6>() };
            Some(std::net::SocketAddr::from((s.sin6_addr.s6_addr, u16::from_be(s.sin6_port))))
        }
        _ => None,
    }
}
