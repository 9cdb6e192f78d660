//! Configuration: the module arguments (`bind= port= rx-size= comp-vector=`, the form
//! the Valkey RDMA manual documents) and the core configs `rdma-bind`, `rdma-port`,
//! `rdma-rx-size`, `rdma-completion-vector`. Pure: the server glue reads the core
//! values with CONFIG GET and applies the result.

#![forbid(unsafe_code)]

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

use crate::protocol::{DEFAULT_RX_SIZE, MAX_RX_SIZE, MIN_RX_SIZE};

/// What `loadmodule librdma.so ARGS…` asked for.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct ModuleArgs {
    pub bind: Vec<String>,
    pub port: Option<u16>,
    pub rx_size: Option<u32>,
    pub comp_vector: Option<i32>,
    /// `max-pinned=BYTES`: the module's pinned-memory ceiling (default: derived from
    /// `maxclients`, `rdma-rx-size`, the memory and `ulimit -l`).
    pub max_pinned: Option<u64>,
}

/// The core configs as the server holds them after reading its configuration.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CoreConfig {
    pub bind: Vec<String>,
    pub port: u16,
    pub rx_size: u32,
    pub comp_vector: i32,
}

impl Default for CoreConfig {
    fn default() -> Self {
        CoreConfig { bind: vec![], port: 0, rx_size: DEFAULT_RX_SIZE, comp_vector: -1 }
    }
}

/// What the module runs with.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Settings {
    pub rx_size: u32,
    /// `None`: a random vector per connection (`-1`).
    pub comp_vector: Option<u32>,
    /// Module arguments to apply through CONFIG SET (the core configs then show them).
    pub set_bind: Option<String>,
    pub set_port: Option<u16>,
    pub max_pinned: Option<u64>,
}

const KEYS: &str = "bind=ADDR, port=N, rx-size=BYTES, comp-vector=N, max-pinned=BYTES";

/// A configuration the module refuses, with what to fix (its `Display` is the log line).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ConfigError {
    /// A module argument without `=` (and not an address after `bind=`).
    NotKeyValue(String),
    UnknownKey(String),
    NotANumber {
        key: String,
        value: String,
    },
    OutOfRange {
        key: String,
        value: String,
        min: i64,
        max: i64,
    },
    /// More bind addresses than the server's listener holds.
    TooManyBinds(usize),
    /// Not an IP literal, `*` or `::*`.
    BadBindAddress(String),
    /// An IPv6 link-local address (`fe80::/10`), with or without a `%scope`.
    LinkLocalBind(String),
    /// A module argument and the core config it duplicates disagree.
    Conflict {
        arg: String,
        config: &'static str,
        config_value: String,
    },
}

impl std::fmt::Display for ConfigError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            ConfigError::NotKeyValue(a) => write!(f, "module argument '{a}' is not KEY=VALUE; known: {KEYS}"),
            ConfigError::UnknownKey(k) => write!(f, "unknown module argument '{k}'; known: {KEYS}"),
            ConfigError::NotANumber { key, value } => write!(f, "{key}={value} is not a number"),
            ConfigError::OutOfRange { key, value, min, max } => {
                write!(f, "{key}={value} is out of range ({min}..={max})")
            }
            ConfigError::TooManyBinds(n) => write!(f, "bind= names {n} addresses; at most 16 are allowed"),
            ConfigError::BadBindAddress(a) => write!(
                f,
                "bind address '{a}' is not an IP address (RDMA binds to IP literals, '*' or '::*', optionally prefixed with '-')"
            ),
            ConfigError::LinkLocalBind(a) => write!(
                f,
                "bind address '{a}' is IPv6 link-local (fe80::/10), which RDMA does not serve (RoCE v2 does not route it, and it needs a scope per interface): bind to a global or unique-local IPv6 address, or an IPv4 address, of the RDMA netdev"
            ),
            ConfigError::Conflict { arg, config, config_value } => write!(
                f,
                "module argument {arg} conflicts with {config} {config_value}: set only one of them"
            ),
        }
    }
}

impl std::error::Error for ConfigError {}

/// Parses module arguments. `bind=` takes one or more addresses: `bind="a b"` as one
/// argument, or `bind=a b` where the following arguments without `=` belong to it.
pub fn parse_module_args<S: AsRef<str>>(args: &[S]) -> Result<ModuleArgs, ConfigError> {
    let mut out = ModuleArgs::default();
    let mut in_bind = false;
    for arg in args {
        let arg = arg.as_ref().trim();
        let Some((key, value)) = arg.split_once('=') else {
            if in_bind && !arg.is_empty() {
                out.bind.push(validate_bind(arg)?);
                continue;
            }
            return Err(ConfigError::NotKeyValue(arg.to_string()));
        };
        in_bind = false;
        match key.to_ascii_lowercase().as_str() {
            "bind" => {
                for a in value.split_whitespace() {
                    out.bind.push(validate_bind(a)?);
                }
                in_bind = true;
            }
            "port" => out.port = Some(parse_num(key, value, 0, 65535)? as u16),
            "rx-size" | "rx_size" => {
                out.rx_size = Some(parse_num(key, value, MIN_RX_SIZE as i64, MAX_RX_SIZE as i64)? as u32)
            }
            "comp-vector" | "comp_vector" => out.comp_vector = Some(parse_num(key, value, -1, 1024)? as i32),
            // at least what one connection pins at the smallest rdma-rx-size
            "max-pinned" | "max_pinned" => out.max_pinned = Some(parse_num(key, value, 1 << 20, i64::MAX)? as u64),
            _ => return Err(ConfigError::UnknownKey(key.to_string())),
        }
    }
    if out.bind.len() > crate::server::abi::CONFIG_BINDADDR_MAX {
        return Err(ConfigError::TooManyBinds(out.bind.len()));
    }
    Ok(out)
}

fn parse_num(key: &str, value: &str, min: i64, max: i64) -> Result<i64, ConfigError> {
    let v = parse_memory(value)
        .ok_or_else(|| ConfigError::NotANumber { key: key.to_string(), value: value.to_string() })?;
    if v < min || v > max {
        return Err(ConfigError::OutOfRange { key: key.to_string(), value: value.to_string(), min, max });
    }
    Ok(v)
}

/// Numbers as valkey.conf writes them: `65536`, `64k`, `1mb`, `2gb` (1k = 1000,
/// 1kb = 1024, as the server's memtoull).
fn parse_memory(s: &str) -> Option<i64> {
    let s = s.trim().to_ascii_lowercase();
    let split = s.find(|c: char| !(c.is_ascii_digit() || c == '-')).unwrap_or(s.len());
    let (num, unit) = s.split_at(split);
    let n: i64 = num.parse().ok()?;
    let mul = match unit {
        "" | "b" => 1,
        "k" => 1000,
        "kb" => 1024,
        "m" => 1000 * 1000,
        "mb" => 1024 * 1024,
        "g" => 1000 * 1000 * 1000,
        "gb" => 1024 * 1024 * 1024,
        _ => return None,
    };
    n.checked_mul(mul)
}

fn validate_bind(a: &str) -> Result<String, ConfigError> {
    BindAddr::parse(a).map(|_| a.to_string())
}

fn is_link_local(ip: &IpAddr) -> bool {
    matches!(ip, IpAddr::V6(v6) if v6.segments()[0] & 0xffc0 == 0xfe80)
}

/// One bind address as `bind`/`rdma-bind` take it: an IP literal, `*` (every IPv4
/// address), `::*` (every IPv6 address), each optionally prefixed with `-` (skip it
/// silently if it does not exist on this host), as for TCP.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct BindAddr {
    pub ip: IpAddr,
    pub optional: bool,
}

impl BindAddr {
    pub fn parse(s: &str) -> Result<BindAddr, ConfigError> {
        let (optional, a) = match s.strip_prefix('-') {
            Some(rest) => (true, rest),
            None => (false, s),
        };
        let ip = match a {
            "*" => IpAddr::V4(Ipv4Addr::UNSPECIFIED),
            "::*" => IpAddr::V6(Ipv6Addr::UNSPECIFIED),
            _ => {
                // "fe80::1%eth0": the scope is a link-local address's only use
                let unscoped = a.split_once('%').map_or(a, |(ip, _)| ip);
                let ip = unscoped.parse::<IpAddr>().map_err(|_| ConfigError::BadBindAddress(s.to_string()))?;
                if unscoped.len() != a.len() && !is_link_local(&ip) {
                    return Err(ConfigError::BadBindAddress(s.to_string()));
                }
                ip
            }
        };
        if is_link_local(&ip) {
            return Err(ConfigError::LinkLocalBind(s.to_string()));
        }
        Ok(BindAddr { ip, optional })
    }

    /// The listener's addresses; none configured means every address, as for TCP.
    pub fn parse_list<S: AsRef<str>>(list: &[S]) -> Result<Vec<BindAddr>, ConfigError> {
        if list.is_empty() {
            return Ok(vec![BindAddr::parse("*")?, BindAddr::parse("-::*")?]);
        }
        list.iter().map(|s| BindAddr::parse(s.as_ref())).collect()
    }
}

/// Combines module arguments with the core configs. A value given both ways must agree.
pub fn merge(args: &ModuleArgs, core: &CoreConfig) -> Result<Settings, ConfigError> {
    let conflict =
        |arg: String, config: &'static str, config_value: String| ConfigError::Conflict { arg, config, config_value };
    if let Some(p) = args.port {
        if core.port != 0 && core.port != p {
            return Err(conflict(format!("port={p}"), "rdma-port", core.port.to_string()));
        }
    }
    if !args.bind.is_empty() && !core.bind.is_empty() && args.bind != core.bind {
        return Err(conflict(format!("bind={}", args.bind.join(" ")), "rdma-bind", core.bind.join(" ")));
    }
    let rx_size = match args.rx_size {
        Some(v) if core.rx_size != DEFAULT_RX_SIZE && core.rx_size != v => {
            return Err(conflict(format!("rx-size={v}"), "rdma-rx-size", core.rx_size.to_string()))
        }
        Some(v) => v,
        None => core.rx_size,
    };
    let comp_vector = match args.comp_vector {
        Some(v) if core.comp_vector != -1 && core.comp_vector != v => {
            return Err(conflict(format!("comp-vector={v}"), "rdma-completion-vector", core.comp_vector.to_string()))
        }
        Some(v) => v,
        None => core.comp_vector,
    };
    Ok(Settings {
        rx_size,
        comp_vector: (comp_vector >= 0).then_some(comp_vector as u32),
        set_bind: (!args.bind.is_empty() && args.bind != core.bind).then(|| args.bind.join(" ")),
        set_port: args.port.filter(|&p| p != core.port),
        max_pinned: args.max_pinned,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn module_arguments_in_every_documented_form() {
        let a = parse_module_args(&["bind=10.0.0.1", "10.0.0.2", "port=6379", "rx-size=1mb", "comp-vector=3"]).unwrap();
        assert_eq!(a.bind, vec!["10.0.0.1", "10.0.0.2"]);
        assert_eq!((a.port, a.rx_size, a.comp_vector), (Some(6379), Some(1 << 20), Some(3)));
        let a = parse_module_args(&["bind=10.0.0.1 -::*", "bind=*"]).unwrap();
        assert_eq!(a.bind, vec!["10.0.0.1", "-::*", "*"]);
        assert_eq!(parse_module_args::<&str>(&[]).unwrap(), ModuleArgs::default());
        assert_eq!(parse_module_args(&["rx-size=65536"]).unwrap().rx_size, Some(65536));
        assert_eq!(parse_module_args(&["max-pinned=2gb"]).unwrap().max_pinned, Some(2 << 30));
    }

    #[test]
    fn bad_module_arguments_say_what_to_fix() {
        for (args, needle) in [
            (vec!["port=70000"], "out of range"),
            (vec!["port=abc"], "not a number"),
            (vec!["rx-size=1k"], "out of range"),
            (vec!["rx-size=32mb"], "out of range"),
            (vec!["comp-vector=-2"], "out of range"),
            (vec!["max-pinned=64kb"], "out of range"),
            (vec!["speed=fast"], "unknown module argument"),
            (vec!["6379"], "not KEY=VALUE"),
            (vec!["bind=rdma-host.example"], "not an IP address"),
        ] {
            let e = parse_module_args(&args).unwrap_err().to_string();
            assert!(e.contains(needle), "{args:?}: {e}");
        }
        let many: Vec<String> = (0..17).map(|i| format!("bind=10.0.0.{i}")).collect();
        assert_eq!(parse_module_args(&many).unwrap_err(), ConfigError::TooManyBinds(17));
    }

    #[test]
    fn bind_addresses_follow_the_tcp_conventions() {
        assert_eq!(BindAddr::parse("*").unwrap(), BindAddr { ip: Ipv4Addr::UNSPECIFIED.into(), optional: false });
        assert_eq!(BindAddr::parse("-::*").unwrap(), BindAddr { ip: Ipv6Addr::UNSPECIFIED.into(), optional: true });
        assert!(BindAddr::parse("-10.1.2.3").unwrap().optional);
        assert_eq!(BindAddr::parse_list::<&str>(&[]).unwrap().len(), 2);
        assert!(BindAddr::parse("").is_err());
    }

    #[test]
    fn ipv6_link_local_binds_are_refused_with_what_to_use_instead() {
        for a in ["fe80::1", "fe80::5054:ff:fe12:3456%eth0", "-febf::1", "FE80::1%2"] {
            let e = BindAddr::parse(a).unwrap_err();
            assert_eq!(e, ConfigError::LinkLocalBind(a.to_string()));
            assert!(e.to_string().contains("global or unique-local"), "{e}");
        }
        assert_eq!(BindAddr::parse("fd00:78::1").unwrap().ip, "fd00:78::1".parse::<IpAddr>().unwrap());
        assert!(BindAddr::parse("fec0::1").is_ok(), "just past fe80::/10");
        assert_eq!(BindAddr::parse("fd00::1%eth0").unwrap_err(), ConfigError::BadBindAddress("fd00::1%eth0".into()));
        assert_eq!(parse_module_args(&["bind=fe80::1"]).unwrap_err(), ConfigError::LinkLocalBind("fe80::1".into()));
    }

    #[test]
    fn module_arguments_and_core_configs_merge_or_conflict() {
        let core = CoreConfig::default();
        let s = merge(&parse_module_args(&["port=7000", "bind=10.0.0.1"]).unwrap(), &core).unwrap();
        assert_eq!(
            (s.set_port, s.set_bind.as_deref(), s.rx_size, s.comp_vector),
            (Some(7000), Some("10.0.0.1"), DEFAULT_RX_SIZE, None)
        );
        let core = CoreConfig { port: 6379, bind: vec!["10.0.0.1".into()], rx_size: 65536, comp_vector: 2 };
        let s = merge(&ModuleArgs::default(), &core).unwrap();
        assert_eq!((s.set_port, s.set_bind, s.rx_size, s.comp_vector), (None, None, 65536, Some(2)));
        let same = merge(&parse_module_args(&["port=6379", "rx-size=65536"]).unwrap(), &core).unwrap();
        assert_eq!(same.set_port, None, "agreeing values need no CONFIG SET");
        for args in [vec!["port=7000"], vec!["bind=10.0.0.2"], vec!["rx-size=131072"], vec!["comp-vector=1"]] {
            let e = merge(&parse_module_args(&args).unwrap(), &core).unwrap_err();
            assert!(matches!(e, ConfigError::Conflict { .. }), "{e}");
            let e = e.to_string();
            assert!(e.contains("conflicts") && e.contains("set only one"), "{e}");
        }
    }
}
