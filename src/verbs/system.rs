//! What the host offers RDMA, asked of the libraries and the kernel: devices, the
//! locked-memory limit, fork safety, and waiting on the channels' fds.

use std::time::Duration;

use super::lib;

/// RDMA devices libibverbs can open (0 when the library is missing).
pub fn device_count() -> usize {
    let Ok(l) = lib() else { return 0 };
    let mut n = 0;
    // SAFETY: the list is freed right away; only the count is used.
    unsafe {
        let list = (l.ibv_get_device_list)(&mut n);
        if !list.is_null() {
            (l.ibv_free_device_list)(list);
        }
    }
    n.max(0) as usize
}

/// `ibv_fork_init`: keeps registered memory out of fork children (BGSAVE), which must
/// not share pages the NIC writes into. Must run before any memory is registered.
/// Err: the errno it returned (the memory would then be shared with fork children).
pub fn fork_init() -> std::result::Result<(), i32> {
    let Ok(l) = lib() else { return Ok(()) };
    // SAFETY: no arguments; called once at start-up, before any registration.
    match unsafe { (l.ibv_fork_init)() } {
        0 => Ok(()),
        errno => Err(errno),
    }
}

/// The machine's memory in bytes (0 if unknown).
pub fn physical_memory() -> u64 {
    // SAFETY: sysconf reads system constants.
    let (pages, page) = unsafe { (libc::sysconf(libc::_SC_PHYS_PAGES), libc::sysconf(libc::_SC_PAGESIZE)) };
    (pages.max(0) as u64).saturating_mul(page.max(0) as u64)
}

/// The soft `RLIMIT_MEMLOCK` in bytes; `None` when unlimited or unknown.
pub fn memlock_limit() -> Option<u64> {
    let mut lim = libc::rlimit { rlim_cur: 0, rlim_max: 0 };
    // SAFETY: getrlimit writes into the struct passed.
    if unsafe { libc::getrlimit(libc::RLIMIT_MEMLOCK, &mut lim) } != 0 || lim.rlim_cur == libc::RLIM_INFINITY {
        return None;
    }
    Some(lim.rlim_cur)
}

/// Waits until one of `fds` is readable or `timeout` passes; whether one is.
pub fn wait_readable(fds: &[i32], timeout: Duration) -> bool {
    let mut p: Vec<libc::pollfd> =
        fds.iter().map(|&fd| libc::pollfd { fd, events: libc::POLLIN, revents: 0 }).collect();
    // SAFETY: `p` is a live array of pollfd of the length passed.
    let n = unsafe {
        libc::poll(p.as_mut_ptr(), p.len() as libc::nfds_t, timeout.as_millis().min(i32::MAX as u128) as i32)
    };
    n > 0
}
