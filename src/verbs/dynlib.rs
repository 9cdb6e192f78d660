//! librdmacm/libibverbs resolved with `dlopen` + `dlsym` (see the module doc for why).

use std::ffi::{c_char, c_int, c_void, CStr};
use std::sync::OnceLock;

use rdma_sys::*;

macro_rules! function_table {
    ($( $lib:ident { $( fn $name:ident($($arg:ty),*) -> $ret:ty; )* } )*) => {
        /// The exported functions of librdmacm.so.1 and libibverbs.so.1.
        #[allow(non_snake_case)]
        // (`ibv_modify_qp` is the test peer's alone)
        #[cfg_attr(not(feature = "test-hooks"), allow(dead_code))]
        pub struct Lib {
            $( $( pub(super) $name: unsafe extern "C" fn($($arg),*) -> $ret, )* )*
        }

        impl Lib {
            fn load() -> Result<Lib, String> {
                $( let $lib = open(concat!(stringify!($lib), ".so.1\0"))?; )*
                // SAFETY: each symbol is looked up by its C name in the library that
                // exports it, and the pointer is given the prototype from rdma-core's
                // headers (as bound by rdma-sys), so calls through it are well-typed.
                unsafe {
                    Ok(Lib { $( $( $name: std::mem::transmute::<*mut c_void, unsafe extern "C" fn($($arg),*) -> $ret>(
                        symbol($lib, concat!(stringify!($name), "\0"))?), )* )* })
                }
            }
        }
    };
}

function_table! {
    librdmacm {
        fn rdma_create_event_channel() -> *mut rdma_event_channel;
        fn rdma_destroy_event_channel(*mut rdma_event_channel) -> ();
        fn rdma_create_id(*mut rdma_event_channel, *mut *mut rdma_cm_id, *mut c_void, rdma_port_space::Type) -> c_int;
        fn rdma_destroy_id(*mut rdma_cm_id) -> c_int;
        fn rdma_bind_addr(*mut rdma_cm_id, *mut libc::sockaddr) -> c_int;
        fn rdma_listen(*mut rdma_cm_id, c_int) -> c_int;
        fn rdma_accept(*mut rdma_cm_id, *mut rdma_conn_param) -> c_int;
        fn rdma_reject(*mut rdma_cm_id, *const c_void, u8) -> c_int;
        fn rdma_get_cm_event(*mut rdma_event_channel, *mut *mut rdma_cm_event) -> c_int;
        fn rdma_ack_cm_event(*mut rdma_cm_event) -> c_int;
        fn rdma_create_qp(*mut rdma_cm_id, *mut ibv_pd, *mut ibv_qp_init_attr) -> c_int;
        fn rdma_destroy_qp(*mut rdma_cm_id) -> ();
        fn rdma_disconnect(*mut rdma_cm_id) -> c_int;
        fn rdma_set_option(*mut rdma_cm_id, c_int, c_int, *mut c_void, usize) -> c_int;
        fn rdma_migrate_id(*mut rdma_cm_id, *mut rdma_event_channel) -> c_int;
        fn rdma_resolve_addr(*mut rdma_cm_id, *mut libc::sockaddr, *mut libc::sockaddr, c_int) -> c_int;
        fn rdma_resolve_route(*mut rdma_cm_id, c_int) -> c_int;
        fn rdma_connect(*mut rdma_cm_id, *mut rdma_conn_param) -> c_int;
        fn rdma_event_str(rdma_cm_event_type::Type) -> *const c_char;
        fn rdma_get_devices(*mut c_int) -> *mut *mut ibv_context;
        fn rdma_free_devices(*mut *mut ibv_context) -> ();
    }
    libibverbs {
        fn ibv_get_device_list(*mut c_int) -> *mut *mut ibv_device;
        fn ibv_free_device_list(*mut *mut ibv_device) -> ();
        fn ibv_alloc_pd(*mut ibv_context) -> *mut ibv_pd;
        fn ibv_dealloc_pd(*mut ibv_pd) -> c_int;
        fn ibv_create_comp_channel(*mut ibv_context) -> *mut ibv_comp_channel;
        fn ibv_destroy_comp_channel(*mut ibv_comp_channel) -> c_int;
        fn ibv_create_cq(*mut ibv_context, c_int, *mut c_void, *mut ibv_comp_channel, c_int) -> *mut ibv_cq;
        fn ibv_destroy_cq(*mut ibv_cq) -> c_int;
        fn ibv_reg_mr_iova(*mut ibv_pd, *mut c_void, usize, u64, c_int) -> *mut ibv_mr;
        fn ibv_dereg_mr(*mut ibv_mr) -> c_int;
        fn ibv_get_cq_event(*mut ibv_comp_channel, *mut *mut ibv_cq, *mut *mut c_void) -> c_int;
        fn ibv_ack_cq_events(*mut ibv_cq, u32) -> ();
        fn ibv_fork_init() -> c_int;
        fn ibv_modify_qp(*mut ibv_qp, *mut ibv_qp_attr, c_int) -> c_int;
        fn ibv_destroy_qp(*mut ibv_qp) -> c_int;
        fn ibv_query_device(*mut ibv_context, *mut ibv_device_attr) -> c_int;
    }
}

fn open(name: &'static str) -> Result<*mut c_void, String> {
    // SAFETY: `name` is NUL-terminated; dlopen has no other preconditions.
    let h = unsafe { libc::dlopen(name.as_ptr().cast(), libc::RTLD_NOW | libc::RTLD_GLOBAL) };
    if h.is_null() {
        return Err(format!(
            "cannot load {}: {} (install rdma-core: librdmacm1, libibverbs1, ibverbs-providers)",
            name.trim_end_matches('\0'),
            dlerror()
        ));
    }
    Ok(h)
}

fn symbol(handle: *mut c_void, name: &'static str) -> Result<*mut c_void, String> {
    // SAFETY: `handle` came from a successful dlopen; `name` is NUL-terminated.
    let p = unsafe { libc::dlsym(handle, name.as_ptr().cast()) };
    if p.is_null() {
        return Err(format!("symbol {} missing: {}", name.trim_end_matches('\0'), dlerror()));
    }
    Ok(p)
}

fn dlerror() -> String {
    // SAFETY: dlerror returns NULL or a NUL-terminated string owned by libc, valid
    // until the next dl* call on this thread; it is copied at once.
    unsafe {
        let e = libc::dlerror();
        if e.is_null() {
            "unknown error".into()
        } else {
            CStr::from_ptr(e).to_string_lossy().into_owned()
        }
    }
}

static LIB: OnceLock<Result<Lib, String>> = OnceLock::new();

/// The loaded libraries, or why they could not be loaded.
pub fn lib() -> Result<&'static Lib, &'static str> {
    LIB.get_or_init(Lib::load).as_ref().map_err(|e| e.as_str())
}
