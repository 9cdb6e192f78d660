//! RESP2/RESP3 encoding of commands and parsing of replies (pure).

/// A parsed reply.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Reply {
    Status(String),
    Error(String),
    Integer(i64),
    Bulk(Vec<u8>),
    Nil,
    Array(Vec<Reply>),
}

/// Encodes one command as a RESP array of bulk strings.
pub fn encode(args: &[&[u8]], out: &mut Vec<u8>) {
    out.extend_from_slice(format!("*{}\r\n", args.len()).as_bytes());
    for a in args {
        out.extend_from_slice(format!("${}\r\n", a.len()).as_bytes());
        out.extend_from_slice(a);
        out.extend_from_slice(b"\r\n");
    }
}

/// Parses one reply from the start of `buf`: `Ok(Some((reply, used)))`, `Ok(None)` if
/// more bytes are needed, `Err` if the bytes are not RESP.
pub fn parse(buf: &[u8]) -> Result<Option<(Reply, usize)>, String> {
    parse_at(buf, 0, 0)
}

const MAX_DEPTH: usize = 64;

fn line(buf: &[u8], at: usize) -> Option<(&[u8], usize)> {
    let rest = buf.get(at..)?;
    let end = rest.windows(2).position(|w| w == b"\r\n")?;
    Some((&rest[..end], at + end + 2))
}

fn parse_at(buf: &[u8], at: usize, depth: usize) -> Result<Option<(Reply, usize)>, String> {
    if depth > MAX_DEPTH {
        return Err("reply nested too deeply".into());
    }
    let Some(&kind) = buf.get(at) else { return Ok(None) };
    let Some((text, next)) = line(buf, at + 1) else { return Ok(None) };
    let text_str = || String::from_utf8_lossy(text).into_owned();
    let int = || text_str().parse::<i64>().map_err(|_| format!("bad integer {:?}", text_str()));
    Ok(Some(match kind {
        b'+' | b',' | b'(' => (Reply::Status(text_str()), next - at),
        b'-' => (Reply::Error(text_str()), next - at),
        b':' => (Reply::Integer(int()?), next - at),
        b'_' => (Reply::Nil, next - at),
        b'#' => (Reply::Integer((text == b"t") as i64), next - at),
        b'$' | b'=' | b'!' => {
            let n = int()?;
            if n < 0 {
                return Ok(Some((Reply::Nil, next - at)));
            }
            let end = next + n as usize;
            if buf.len() < end + 2 {
                return Ok(None);
            }
            let bytes = buf[next..end].to_vec();
            let reply = if kind == b'!' {
                Reply::Error(String::from_utf8_lossy(&bytes).into_owned())
            } else {
                Reply::Bulk(bytes)
            };
            (reply, end + 2 - at)
        }
        b'*' | b'~' | b'>' | b'%' => {
            let n = int()?;
            if n < 0 {
                return Ok(Some((Reply::Nil, next - at)));
            }
            let count = if kind == b'%' { n as usize * 2 } else { n as usize };
            let mut items = Vec::with_capacity(count.min(1024));
            let mut pos = next;
            for _ in 0..count {
                match parse_at(buf, pos, depth + 1)? {
                    Some((r, used)) => {
                        items.push(r);
                        pos += used;
                    }
                    None => return Ok(None),
                }
            }
            (Reply::Array(items), pos - at)
        }
        other => return Err(format!("unknown reply type byte {other:#04x}")),
    }))
}

/// Finds where the first complete reply in a growing buffer ends, without building it,
/// resuming where the previous call stopped. A reader that calls [`parse`] after every
/// chunk re-parses the whole reply each time: quadratic in its size, which a 64 MiB
/// LRANGE reply read in 1 MiB windows makes very visible. With the scanner each byte is
/// looked at about once, and [`parse`] runs once, on a complete reply.
#[derive(Debug, Default, Clone)]
pub struct FrameScanner {
    /// Where scanning resumes: the start of the first element not yet complete.
    pos: usize,
    /// For each open aggregate, the elements it still expects (innermost last).
    open: Vec<u64>,
}

impl FrameScanner {
    /// `buf` must be the buffer of the previous call, grown at its end (not drained)
    /// since then. Returns the length of the first complete reply once it is there and
    /// starts afresh (for the buffer with that reply drained).
    pub fn scan(&mut self, buf: &[u8]) -> Result<Option<usize>, String> {
        loop {
            let at = self.pos;
            let Some(&kind) = buf.get(at) else { return Ok(None) };
            let Some((text, next)) = line(buf, at + 1) else { return Ok(None) };
            let len = || {
                std::str::from_utf8(text)
                    .ok()
                    .and_then(|t| t.parse::<i64>().ok())
                    .ok_or_else(|| format!("bad length {:?}", String::from_utf8_lossy(text)))
            };
            match kind {
                b'+' | b'-' | b':' | b'_' | b'#' | b',' | b'(' => self.pos = next,
                b'$' | b'=' | b'!' => {
                    let n = len()?;
                    let end = if n < 0 { next } else { next + n as usize + 2 };
                    if buf.len() < end {
                        return Ok(None);
                    }
                    self.pos = end;
                }
                b'*' | b'~' | b'>' | b'%' => {
                    let n = len()?;
                    self.pos = next;
                    if n > 0 {
                        if self.open.len() >= MAX_DEPTH {
                            return Err("reply nested too deeply".into());
                        }
                        self.open.push(if kind == b'%' { n as u64 * 2 } else { n as u64 });
                        continue;
                    }
                }
                other => return Err(format!("unknown reply type byte {other:#04x}")),
            }
            // One element is complete: close every aggregate it completes.
            loop {
                match self.open.last_mut() {
                    None => {
                        let end = self.pos;
                        *self = FrameScanner::default();
                        return Ok(Some(end));
                    }
                    Some(left) => {
                        *left -= 1;
                        if *left > 0 {
                            break;
                        }
                        self.open.pop();
                    }
                }
            }
        }
    }
}

/// Prints a reply the way valkey-cli does on a terminal (`"bulk"`, `(integer) 1`, …).
pub fn format_cli(r: &Reply, out: &mut String, indent: usize) {
    match r {
        Reply::Status(s) => out.push_str(s),
        Reply::Error(e) => {
            out.push_str("(error) ");
            out.push_str(e)
        }
        Reply::Integer(i) => out.push_str(&format!("(integer) {i}")),
        Reply::Bulk(b) => out.push_str(&format!("\"{}\"", String::from_utf8_lossy(b).escape_default())),
        Reply::Nil => out.push_str("(nil)"),
        Reply::Array(items) if items.is_empty() => out.push_str("(empty array)"),
        Reply::Array(items) => {
            let width = items.len().to_string().len();
            for (i, item) in items.iter().enumerate() {
                if i > 0 {
                    out.push('\n');
                    out.push_str(&" ".repeat(indent));
                }
                let prefix = format!("{:>width$}) ", i + 1);
                out.push_str(&prefix);
                format_cli(item, out, indent + prefix.len());
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn encodes_commands_as_bulk_arrays() {
        let mut out = Vec::new();
        encode(&[b"SET", b"k", b"v v"], &mut out);
        assert_eq!(out, b"*3\r\n$3\r\nSET\r\n$1\r\nk\r\n$3\r\nv v\r\n");
    }

    #[test]
    fn parses_every_reply_type_and_waits_for_partial_input() {
        let input = b"+OK\r\n-ERR x\r\n:42\r\n$3\r\nabc\r\n$-1\r\n*2\r\n$1\r\na\r\n:1\r\n*0\r\n";
        let mut at = 0;
        let mut got = vec![];
        while let Some((r, used)) = parse(&input[at..]).unwrap() {
            got.push(r);
            at += used;
        }
        assert_eq!(at, input.len());
        assert_eq!(
            got,
            vec![
                Reply::Status("OK".into()),
                Reply::Error("ERR x".into()),
                Reply::Integer(42),
                Reply::Bulk(b"abc".to_vec()),
                Reply::Nil,
                Reply::Array(vec![Reply::Bulk(b"a".to_vec()), Reply::Integer(1)]),
                Reply::Array(vec![]),
            ]
        );
        for cut in 1..input.len() {
            if let Some((_, used)) = parse(&input[..cut]).unwrap() {
                assert!(used <= cut);
            }
        }
        assert_eq!(parse(b"$10\r\nabc").unwrap(), None);
        assert!(parse(b"?x\r\n").is_err());
    }

    #[test]
    fn the_scanner_finds_the_same_reply_ends_as_the_parser_at_every_cut() {
        let input: &[u8] =
            b"+OK\r\n*3\r\n$3\r\nabc\r\n*2\r\n:1\r\n%1\r\n+k\r\n$-1\r\n*0\r\n$-1\r\n!5\r\nERR x\r\n*-1\r\n";
        let mut ends = vec![];
        let mut at = 0;
        while let Some((_, used)) = parse(&input[at..]).unwrap() {
            at += used;
            ends.push(at);
        }
        assert_eq!(at, input.len());
        assert_eq!(ends.len(), 5);
        // fed in pieces of every size, the scanner reports exactly the parser's ends
        for piece in 1..=input.len() {
            let (mut sc, mut start, mut have, mut found) = (FrameScanner::default(), 0, 0, vec![]);
            while have < input.len() {
                have = (have + piece).min(input.len());
                while let Some(n) = sc.scan(&input[start..have]).unwrap() {
                    start += n;
                    found.push(start);
                }
            }
            assert_eq!(found, ends, "pieces of {piece} bytes");
        }
        assert_eq!(parse(b"!5\r\nERR x\r\n").unwrap(), Some((Reply::Error("ERR x".into()), 11)));
        assert!(FrameScanner::default().scan(b"?x\r\n").is_err());
        assert!(FrameScanner::default().scan(b"$x\r\n").is_err());
    }

    #[test]
    fn the_scanner_reads_a_big_aggregate_in_linear_time() {
        // 200,000 elements fed 1 KiB at a time: quadratic re-scanning would take minutes
        let mut input = format!("*{}\r\n", 200_000).into_bytes();
        for i in 0..200_000 {
            input.extend_from_slice(format!("${}\r\nelement-{i}\r\n", format!("element-{i}").len()).as_bytes());
        }
        let mut sc = FrameScanner::default();
        let mut got = None;
        for have in (1024..input.len() + 1024).step_by(1024) {
            if let Some(n) = sc.scan(&input[..have.min(input.len())]).unwrap() {
                got = Some(n);
                break;
            }
        }
        assert_eq!(got, Some(input.len()));
        let Some((Reply::Array(items), _)) = parse(&input).unwrap() else { panic!() };
        assert_eq!(items[199_999], Reply::Bulk(b"element-199999".to_vec()));
    }

    #[test]
    fn formats_like_valkey_cli() {
        let mut s = String::new();
        format_cli(&Reply::Array(vec![Reply::Bulk(b"a".to_vec()), Reply::Integer(2), Reply::Nil]), &mut s, 0);
        assert_eq!(s, "1) \"a\"\n2) (integer) 2\n3) (nil)");
    }
}
