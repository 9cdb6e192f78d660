//! Link settings for librdma.so.
//!
//! - `--as-needed`: rdma-sys asks to link libibverbs and librdmacm, but the module only
//!   uses their types and inline verbs and resolves their functions with dlopen at run
//!   time (src/verbs/dynlib.rs). Dropping the unused DT_NEEDED entries is what keeps a
//!   distro server (system jemalloc + RTLD_DEEPBIND) from aborting at load; a host test
//!   checks that they stay out.
//! - `-z nodelete`: the server keeps pointers into our ConnectionType table for its
//!   lifetime, so the library must never be unmapped, whatever dlclose is called.
fn main() {
    println!("cargo:rustc-cdylib-link-arg=-Wl,--as-needed");
    println!("cargo:rustc-cdylib-link-arg=-Wl,-z,nodelete");
    println!("cargo:rerun-if-changed=build.rs");
}
