//! The workload driver behind `valkey-rdma-bench`: N connections, each with its own
//! thread, sending pipelines of commands and timing them. Transport-agnostic (RDMA or
//! TCP), so that the two can be compared in one run.

use std::io::{Read, Write};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use super::{resp, ClientError, Options, RdmaStream};

/// A byte stream the driver can use.
pub trait Stream: Send {
    fn send(&mut self, data: &[u8]) -> Result<(), String>;
    fn recv(&mut self, buf: &mut [u8]) -> Result<usize, String>;
}

impl Stream for RdmaStream {
    fn send(&mut self, data: &[u8]) -> Result<(), String> {
        self.write_all(data).map_err(|e: ClientError| e.to_string())
    }
    fn recv(&mut self, buf: &mut [u8]) -> Result<usize, String> {
        self.read(buf).map_err(|e| e.to_string())
    }
}

impl Stream for std::net::TcpStream {
    fn send(&mut self, data: &[u8]) -> Result<(), String> {
        self.write_all(data).map_err(|e| e.to_string())
    }
    fn recv(&mut self, buf: &mut [u8]) -> Result<usize, String> {
        match self.read(buf) {
            Ok(0) => Err("connection closed".into()),
            Ok(n) => Ok(n),
            Err(e) => Err(e.to_string()),
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Transport {
    Rdma,
    Tcp,
}

#[derive(Debug, Clone)]
pub struct Workload {
    pub addr: String,
    pub transport: Transport,
    pub connections: usize,
    pub pipeline: usize,
    /// Commands cycled through: "set", "get", "ping", "incr", "lpush", "lrange_100", and
    /// the big replies "lrange_10000" (a list of [`BIG_REPLY_ELEMENTS`] values of
    /// `value_size` bytes) and "hgetall" (a hash of as many fields), filled by [`prepare`].
    pub commands: Vec<String>,
    pub value_size: usize,
    /// Stop after this many requests (all connections together) …
    pub requests: u64,
    /// … or after this long, whichever comes first.
    pub duration: Duration,
    pub keyspace: u64,
    /// Each RDMA connection's RX buffer (the server's TX window to it).
    pub rx_size: u32,
    /// Pipelines each connection sends before the clock starts (not counted, not timed
    /// in the samples; the first one is in [`Stats::first_use_us`]).
    pub warmup: u64,
}

#[derive(Debug, Clone, Default)]
pub struct Stats {
    pub requests: u64,
    pub seconds: f64,
    pub rps: f64,
    pub p50_us: f64,
    pub p99_us: f64,
    pub p999_us: f64,
    /// Server CPU seconds (user + system) per million requests, if its pid was known.
    pub server_cpu_s_per_mreq: Option<f64>,
    pub errors: u64,
    /// Every pipeline timed, in the order each connection sent them (for
    /// `--latency-trace`: where in a run the slow ones fall).
    pub samples: Vec<Sample>,
    /// A new connection's first use: its connect plus its first pipeline, the median
    /// over the connections (microseconds).
    pub first_use_us: f64,
}

/// One pipeline: which connection sent it, when (since the clock started), how long its
/// replies took, and the bytes that connection had sent and received before it (to line
/// slow ones up with the windows' hand-backs).
#[derive(Debug, Clone, Copy, Default)]
pub struct Sample {
    pub connection: u32,
    pub start_us: u64,
    pub latency_us: u32,
    pub sent_before: u64,
    pub received_before: u64,
}

impl Sample {
    pub const TSV_HEADER: &'static str = "connection\tstart_us\tlatency_us\tsent_before\treceived_before";

    pub fn tsv(&self) -> String {
        format!(
            "{}\t{}\t{}\t{}\t{}",
            self.connection, self.start_us, self.latency_us, self.sent_before, self.received_before
        )
    }
}

fn command(name: &str, key: &str, value: &[u8], out: &mut Vec<u8>) {
    match name {
        "set" => resp::encode(&[b"SET", key.as_bytes(), value], out),
        "get" => resp::encode(&[b"GET", key.as_bytes()], out),
        "incr" => resp::encode(&[b"INCR", key.as_bytes()], out),
        "lpush" => resp::encode(&[b"LPUSH", b"bench:list", value], out),
        "lrange_100" => resp::encode(&[b"LRANGE", b"bench:list", b"0", b"99"], out),
        "lrange_10000" => resp::encode(&[b"LRANGE", BIG_LIST, b"0", b"-1"], out),
        "hgetall" => resp::encode(&[b"HGETALL", BIG_HASH], out),
        _ => resp::encode(&[b"PING"], out),
    }
}

/// Elements of the big-reply workloads: a reply of many blocks (the server writes it in
/// pieces of about 64 KiB), the shape that single-value workloads never exercise.
pub const BIG_REPLY_ELEMENTS: usize = 10_000;
const BIG_LIST: &[u8] = b"bench:biglist";
const BIG_HASH: &[u8] = b"bench:bighash";

/// The header a reply to `name` must start with, when its size is known: a big reply cut
/// short or merged with another counts as an error, not as a fast request.
fn expected_header(name: &str) -> Option<String> {
    match name {
        "lrange_10000" => Some(format!("*{BIG_REPLY_ELEMENTS}\r\n")),
        "hgetall" => Some(format!("*{}\r\n", 2 * BIG_REPLY_ELEMENTS)),
        _ => None,
    }
}

/// Fills the keys the big-reply workloads read (once, before timing).
pub fn prepare(w: &Workload) -> Result<(), String> {
    let big = |n: &str| n == "lrange_10000" || n == "hgetall";
    if !w.commands.iter().any(|c| big(c)) {
        return Ok(());
    }
    let mut s = connect(w)?;
    let value = vec![b'v'; w.value_size];
    let mut out = Vec::new();
    resp::encode(&[b"DEL", BIG_LIST, BIG_HASH], &mut out);
    let mut expect = 1;
    for batch in (0..BIG_REPLY_ELEMENTS).collect::<Vec<_>>().chunks(500) {
        let fields: Vec<String> = batch.iter().map(|i| format!("field:{i:06}")).collect();
        let mut list: Vec<&[u8]> = vec![b"RPUSH", BIG_LIST];
        let mut hash: Vec<&[u8]> = vec![b"HSET", BIG_HASH];
        for f in &fields {
            list.push(&value);
            hash.push(f.as_bytes());
            hash.push(&value);
        }
        resp::encode(&list, &mut out);
        resp::encode(&hash, &mut out);
        expect += 2;
    }
    s.send(&out)?;
    let (mut inbuf, mut buf, mut scanner) = (Vec::new(), vec![0u8; 64 * 1024], resp::FrameScanner::default());
    while expect > 0 {
        match scanner.scan(&inbuf)? {
            Some(end) => {
                if inbuf.first() == Some(&b'-') {
                    return Err(format!("filling the big-reply keys: {}", String::from_utf8_lossy(&inbuf[..end])));
                }
                inbuf.drain(..end);
                expect -= 1;
            }
            None => {
                let k = s.recv(&mut buf)?;
                inbuf.extend_from_slice(&buf[..k]);
            }
        }
    }
    Ok(())
}

/// Server CPU time (user + system) in seconds, from /proc.
pub fn process_cpu_seconds(pid: u32) -> Option<f64> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    let after = &stat[stat.rfind(')')? + 2..];
    let f: Vec<&str> = after.split_whitespace().collect();
    let ticks: f64 = f.get(11)?.parse::<f64>().ok()? + f.get(12)?.parse::<f64>().ok()?;
    // /proc counts in USER_HZ, which Linux fixes at 100 for user space (sysconf's
    // _SC_CLK_TCK returns the same constant).
    const USER_HZ: f64 = 100.0;
    Some(ticks / USER_HZ)
}

pub fn connect(w: &Workload) -> Result<Box<dyn Stream>, String> {
    match w.transport {
        Transport::Rdma => {
            let opts = Options { rx_size: w.rx_size, ..Options::default() };
            Ok(Box::new(RdmaStream::connect(w.addr.as_str(), &opts).map_err(|e| e.to_string())?))
        }
        Transport::Tcp => {
            let s = std::net::TcpStream::connect(&w.addr).map_err(|e| e.to_string())?;
            s.set_nodelay(true).map_err(|e| e.to_string())?;
            Ok(Box::new(s))
        }
    }
}

/// One connection's side of the workload: its stream, its buffers, the next key it
/// uses, and what it has sent and received so far.
struct Driver {
    stream: Box<dyn Stream>,
    value: Vec<u8>,
    buf: Vec<u8>,
    inbuf: Vec<u8>,
    scanner: resp::FrameScanner,
    /// The next key number (each connection starts at its index and strides).
    n: u64,
    sent: u64,
    received: u64,
}

impl Driver {
    /// Sends one pipeline and waits for all its replies. Returns its sample (`start_us`
    /// measured from `t0`), and whether every reply arrived; a reply that is an error or
    /// the wrong size counts in `errors`.
    fn pipeline(&mut self, w: &Workload, t0: Instant, connection: u32, errors: &AtomicU64) -> (Sample, bool) {
        let mut out = Vec::new();
        let mut names: Vec<&str> = Vec::with_capacity(w.pipeline);
        for _ in 0..w.pipeline {
            let key = format!("key:{:012}", self.n % w.keyspace.max(1));
            let name = w.commands[(self.n as usize / w.connections.max(1)) % w.commands.len()].as_str();
            command(name, &key, &self.value, &mut out);
            names.push(name);
            self.n = self.n.wrapping_add(7919);
        }
        let start = Instant::now();
        let sample = Sample {
            connection,
            start_us: start.saturating_duration_since(t0).as_micros() as u64,
            sent_before: self.sent,
            received_before: self.received,
            ..Sample::default()
        };
        self.sent += out.len() as u64;
        if self.stream.send(&out).is_err() {
            errors.fetch_add(1, Ordering::Relaxed);
            return (sample, false);
        }
        // Replies are found by the scanner (linear however large), checked by their
        // first bytes, and dropped together once all have arrived.
        let (mut replies, mut at) = (0, 0);
        while replies < w.pipeline {
            match self.scanner.scan(&self.inbuf[at..]) {
                Ok(Some(len)) => {
                    let reply = &self.inbuf[at..at + len];
                    let wrong_size = expected_header(names[replies]).is_some_and(|h| !reply.starts_with(h.as_bytes()));
                    if reply.first() == Some(&b'-') || wrong_size {
                        errors.fetch_add(1, Ordering::Relaxed);
                    }
                    at += len;
                    replies += 1;
                    continue;
                }
                Ok(None) => {}
                Err(_) => break,
            }
            match self.stream.recv(&mut self.buf) {
                Ok(k) => {
                    self.received += k as u64;
                    self.inbuf.extend_from_slice(&self.buf[..k]);
                }
                Err(_) => {
                    errors.fetch_add(1, Ordering::Relaxed);
                    break;
                }
            }
        }
        self.inbuf.drain(..at);
        (Sample { latency_us: start.elapsed().as_micros() as u32, ..sample }, replies == w.pipeline)
    }
}

/// Runs the workload; `progress` is called about once a second with requests so far.
///
/// Each connection first sends [`Workload::warmup`] pipelines; the clock, the server's
/// CPU count and the samples start when every connection is done with them. The
/// connection's first use (its connect plus its first pipeline, warm-up or not) is
/// recorded apart, in [`Stats::first_use_us`]: the C module pays for its buffers when a
/// client connects and ours when the client first uses them, so neither is hidden.
pub fn run(w: &Workload, server_pid: Option<u32>, mut progress: impl FnMut(u64, f64)) -> Result<Stats, String> {
    prepare(w)?;
    let mut streams: Vec<(Box<dyn Stream>, u64)> = Vec::with_capacity(w.connections);
    for _ in 0..w.connections {
        let started = Instant::now();
        let s = connect(w)?;
        streams.push((s, started.elapsed().as_micros() as u64));
    }
    let done = Arc::new(AtomicU64::new(0));
    let errors = Arc::new(AtomicU64::new(0));
    let stop = Arc::new(AtomicBool::new(false));
    let warmed_up = Arc::new(std::sync::Barrier::new(w.connections + 1));
    let handles: Vec<_> = streams
        .into_iter()
        .enumerate()
        .map(|(i, (stream, connect_us))| {
            let (w, done, errors, stop, warmed_up) =
                (w.clone(), done.clone(), errors.clone(), stop.clone(), warmed_up.clone());
            std::thread::spawn(move || {
                let mut d = Driver {
                    stream,
                    value: vec![b'x'; w.value_size],
                    buf: vec![0u8; 256 * 1024],
                    inbuf: Vec::new(),
                    scanner: resp::FrameScanner::default(),
                    n: i as u64,
                    sent: 0,
                    received: 0,
                };
                let mut first_use_us = None;
                let mut ok = true;
                for _ in 0..w.warmup {
                    let (sample, complete) = d.pipeline(&w, Instant::now(), i as u32, &errors);
                    first_use_us.get_or_insert(connect_us + u64::from(sample.latency_us));
                    ok &= complete;
                    if !ok {
                        break;
                    }
                }
                // every thread reaches the barrier, failed or not, or the others would wait
                warmed_up.wait();
                let t0 = Instant::now();
                let mut samples: Vec<Sample> = Vec::new();
                while ok && !stop.load(Ordering::Relaxed) {
                    if done.fetch_add(w.pipeline as u64, Ordering::Relaxed) >= w.requests {
                        break;
                    }
                    let (sample, complete) = d.pipeline(&w, t0, i as u32, &errors);
                    first_use_us.get_or_insert(connect_us + u64::from(sample.latency_us));
                    samples.push(sample);
                    ok = complete;
                }
                (samples, first_use_us)
            })
        })
        .collect();
    warmed_up.wait();
    let cpu0 = server_pid.and_then(process_cpu_seconds);
    let t0 = Instant::now();
    let mut last = Instant::now();
    while !handles.iter().all(|h| h.is_finished()) {
        std::thread::sleep(Duration::from_millis(50));
        if t0.elapsed() >= w.duration {
            stop.store(true, Ordering::Relaxed);
        }
        if last.elapsed() >= Duration::from_secs(1) {
            last = Instant::now();
            progress(done.load(Ordering::Relaxed).min(w.requests), t0.elapsed().as_secs_f64());
        }
    }
    let seconds = t0.elapsed().as_secs_f64();
    let cpu1 = server_pid.and_then(process_cpu_seconds);
    let (mut samples, mut first_use): (Vec<Sample>, Vec<u64>) = (Vec::new(), Vec::new());
    for h in handles {
        let (s, first) = h.join().unwrap_or_default();
        samples.extend(s);
        first_use.extend(first);
    }
    first_use.sort_unstable();
    let mut lat: Vec<u32> = samples.iter().map(|s| s.latency_us).collect();
    lat.sort_unstable();
    let requests = lat.len() as u64 * w.pipeline as u64;
    let pct = |p: f64| {
        lat.get(((lat.len() as f64 * p) as usize).min(lat.len().saturating_sub(1))).copied().unwrap_or(0) as f64
    };
    Ok(Stats {
        requests,
        seconds,
        rps: requests as f64 / seconds,
        p50_us: pct(0.50),
        p99_us: pct(0.99),
        p999_us: pct(0.999),
        server_cpu_s_per_mreq: match (cpu0, cpu1) {
            (Some(a), Some(b)) if requests > 0 => Some((b - a) / requests as f64 * 1e6),
            _ => None,
        },
        errors: errors.load(Ordering::Relaxed),
        samples,
        first_use_us: first_use.get(first_use.len() / 2).map_or(0.0, |&us| us as f64),
    })
}

impl Stats {
    pub fn to_json(&self, label: &str) -> String {
        format!(
            "{{\"label\":\"{label}\",\"requests\":{},\"seconds\":{:.3},\"rps\":{:.1},\"p50_us\":{},\"p99_us\":{},\"p999_us\":{},\"server_cpu_s_per_mreq\":{},\"errors\":{},\"first_use_us\":{}}}",
            self.requests,
            self.seconds,
            self.rps,
            self.p50_us,
            self.p99_us,
            self.p999_us,
            self.server_cpu_s_per_mreq.map_or("null".into(), |v| format!("{v:.3}")),
            self.errors,
            self.first_use_us
        )
    }
}

/// A bar chart (SVG) of one metric over several labelled runs.
pub fn svg_bars(title: &str, unit: &str, bars: &[(String, f64)]) -> String {
    let (w, bar_h, gap, left) = (640.0, 28.0, 10.0, 220.0);
    let h = 50.0 + bars.len() as f64 * (bar_h + gap);
    let max = bars.iter().map(|b| b.1).fold(0.0f64, f64::max).max(1e-9);
    let mut s = format!(
        "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"{w}\" height=\"{h}\" font-family=\"sans-serif\" font-size=\"13\">\n<text x=\"10\" y=\"22\" font-size=\"16\">{title}</text>\n"
    );
    for (i, (label, v)) in bars.iter().enumerate() {
        let y = 40.0 + i as f64 * (bar_h + gap);
        let bw = (w - left - 110.0) * v / max;
        let colour = if label.contains("ours") {
            "#2a7ab0"
        } else if label.contains("TCP") {
            "#999999"
        } else {
            "#d08030"
        };
        s += &format!(
            "<text x=\"10\" y=\"{:.0}\">{label}</text><rect x=\"{left}\" y=\"{y:.0}\" width=\"{bw:.1}\" height=\"{bar_h}\" fill=\"{colour}\"/><text x=\"{:.1}\" y=\"{:.0}\">{v:.1} {unit}</text>\n",
            y + 19.0,
            left + bw + 6.0,
            y + 19.0
        );
    }
    s + "</svg>\n"
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn json_and_svg_carry_the_numbers() {
        let s = Stats {
            requests: 10,
            seconds: 2.0,
            rps: 5.0,
            p50_us: 1.0,
            p99_us: 2.0,
            p999_us: 3.0,
            server_cpu_s_per_mreq: Some(0.5),
            errors: 0,
            samples: Vec::new(),
            first_use_us: 1500.0,
        };
        let j = s.to_json("ours");
        assert!(
            j.contains("\"rps\":5.0")
                && j.contains("\"first_use_us\":1500")
                && j.contains("\"server_cpu_s_per_mreq\":0.500")
                && j.contains("\"label\":\"ours\"")
        );
        let svg = svg_bars("SET", "req/s", &[("ours".into(), 10.0), ("C module".into(), 5.0)]);
        assert_eq!(svg.matches("<rect").count(), 2);
        assert!(svg.contains("10.0 req/s") && svg.contains("5.0 req/s"));
    }

    #[test]
    fn commands_are_encoded_per_name() {
        let mut out = Vec::new();
        command("set", "k", b"v", &mut out);
        command("lrange_100", "k", b"v", &mut out);
        command("anything", "k", b"v", &mut out);
        assert_eq!(out, b"*3\r\n$3\r\nSET\r\n$1\r\nk\r\n$1\r\nv\r\n*4\r\n$6\r\nLRANGE\r\n$10\r\nbench:list\r\n$1\r\n0\r\n$2\r\n99\r\n*1\r\n$4\r\nPING\r\n");
        let mut out = Vec::new();
        command("lrange_10000", "k", b"v", &mut out);
        command("hgetall", "k", b"v", &mut out);
        assert_eq!(out, b"*4\r\n$6\r\nLRANGE\r\n$13\r\nbench:biglist\r\n$1\r\n0\r\n$2\r\n-1\r\n*2\r\n$7\r\nHGETALL\r\n$13\r\nbench:bighash\r\n");
        assert_eq!(expected_header("lrange_10000").as_deref(), Some("*10000\r\n"));
        assert_eq!(expected_header("hgetall").as_deref(), Some("*20000\r\n"));
        assert_eq!(expected_header("get"), None);
    }
}
