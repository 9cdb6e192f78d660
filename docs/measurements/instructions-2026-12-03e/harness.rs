// Appended to src/protocol/driver.rs by run.sh (see README.md); not part of the build.

#[cfg(test)]
mod instr_harness {
    use super::*;
    use crate::protocol::conn::Postpone;
    use crate::protocol::session::Role;
    use std::sync::Mutex;

    struct N;
    impl Nic for N {
        fn post_control(&mut self, _msg: &ControlMessage) -> Result<(), LocalError> { Ok(()) }
        fn sq_room(&self) -> bool { std::hint::black_box(true) }
        fn copy_rx(&mut self, range: Range<usize>, out: &mut [u8]) { out[0] = range.len() as u8; }
        fn peer_rx_registered(&mut self, _len: u32, _resized: bool) -> Result<(), TxBuffersHeld> { Ok(()) }
        fn write_limit(&self, _tx_offset: u32) -> usize { 1 << 20 }
        fn write_never_cut(&self) -> usize { 65536 }
        fn post_write(&mut self, grant: &WriteGrant, parts: &[&[u8]]) -> Result<(), LocalError> {
            std::hint::black_box((grant, parts)); Ok(())
        }
    }
    struct H<'a> { m: &'a Mutex<Driver<N>>, buf: Vec<u8> }
    impl Host for H<'_> {
        type Nic = N;
        fn with_driver<R>(&mut self, f: impl FnOnce(&mut Driver<N>) -> R) -> R { f(&mut self.m.lock().unwrap()) }
        fn call(&mut self, h: Handler) {
            if h == Handler::Read {
                let (r, _) = self.m.lock().unwrap().read(&mut self.buf);
                std::hint::black_box(r.ok());
            }
        }
    }

    #[test]
    #[ignore]
    fn harness_request() {
        let rx = RxBuffer { addr: 0x1000, len: 1 << 20, key: 7 };
        let mut core = Conn::new(Role::Server, rx);
        core.set_read_handler(true);
        core.on_accepted().unwrap();
        core.on_established();
        let _ = core.poll_control();
        let reg = ControlMessage::RegisterXferMemory { addr: 0x9000, length: 1 << 24, key: 3 }.encode();
        core.on_control(&reg).unwrap();
        core.postpone(Postpone::NONE);
        let m = Mutex::new(Driver::new(core, N));
        let n: usize = std::env::var("HARNESS_N").ok().and_then(|s| s.parse().ok()).unwrap_or(10_000);
        let mut h = H { m: &m, buf: vec![0; 16384] };
        for _ in 0..n {
            request(std::hint::black_box(&mut h));
        }
        let d = m.lock().unwrap();
        assert_eq!(d.core.state(), &crate::protocol::conn::State::Established);
        assert_eq!(d.core.bytes_read(), 30 * n as u64, "{:?}", d.core.failure());
    }

    #[inline(never)]
    fn request(h: &mut H) {
        let _ = h.m.lock().unwrap().feed(&[Completion::Data { imm: 30 }], |_| {});
        let end = run(h);
        std::hint::black_box(end);
        let _ = h.m.lock().unwrap().write(&[b"+OK\r\n"]);
    }
}
