//! The cluster file, `cluster.toml`: the shared token's file, one `[[device]]` per
//! process of the ring in ring order, and optionally a fixed plan. At its smallest:
//!
//! ```toml
//! token_file = "ring.token"
//! [[device]]
//! addr = "127.0.0.1:9301"
//! memory = "1.5GiB"   # optional budget
//! threads = 1         # optional
//! ```
//!
//! The head may take windows too: its entry says `head = true` and needs no address. A
//! fixed plan is `windows = [10, 10, 10]` (one per device) and `rounds = 1`; without one,
//! the planner chooses. A device's `profile` is a file from `blink profile` on it, and
//! `latency_ms` and `mbps` describe the link into it (`head_latency_ms` and `head_mbps`,
//! the link back into a head that holds no window), in place of measuring them. Paths
//! are relative to the file's directory. Every mistake is named with the device and the
//! key it is in.

use std::fmt;
use std::path::{Path, PathBuf};

use serde::Deserialize;

use crate::plan::Link;

/// A cluster file, checked.
#[derive(Clone, Debug, PartialEq)]
pub struct ClusterFile {
    pub token_file: PathBuf,
    /// In ring order.
    pub devices: Vec<DeviceEntry>,
    /// The head's entry, when it takes windows.
    pub head: Option<usize>,
    /// A fixed plan: each device's window and the rounds.
    pub fixed: Option<(Vec<usize>, usize)>,
    /// The link back into the head, as given.
    pub head_link: Option<Link>,
}

/// One device of the ring.
#[derive(Clone, Debug, PartialEq)]
pub struct DeviceEntry {
    /// `host:port` of its `blink node` (`None` for the head's own entry).
    pub addr: Option<String>,
    /// Its memory budget in bytes (`None`: what it reports free).
    pub memory: Option<u64>,
    pub threads: Option<usize>,
    /// A profile from `blink profile` to plan with instead of asking the device.
    pub profile: Option<PathBuf>,
    /// A name for messages and plans (default: its address, or "head").
    pub name: String,
    /// The link into it, as given.
    pub link: Option<Link>,
}

#[derive(Debug)]
pub enum ConfigError {
    Read(PathBuf, std::io::Error),
    Parse(String),
    Invalid(String),
}

impl fmt::Display for ConfigError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ConfigError::Read(p, e) => write!(f, "cannot read the cluster file {}: {e}", p.display()),
            ConfigError::Parse(e) => write!(f, "the cluster file is not valid: {e}"),
            ConfigError::Invalid(e) => write!(f, "the cluster file is not valid: {e}"),
        }
    }
}

impl std::error::Error for ConfigError {}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawFile {
    token_file: PathBuf,
    #[serde(default)]
    device: Vec<RawDevice>,
    windows: Option<Vec<usize>>,
    rounds: Option<usize>,
    head_latency_ms: Option<f64>,
    head_mbps: Option<f64>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawDevice {
    addr: Option<String>,
    memory: Option<Size>,
    threads: Option<usize>,
    #[serde(default)]
    head: bool,
    name: Option<String>,
    profile: Option<PathBuf>,
    latency_ms: Option<f64>,
    mbps: Option<f64>,
}

/// A size as a number of bytes or a string with a unit ("1.5GiB", "512 MB").
#[derive(Deserialize)]
#[serde(untagged)]
enum Size {
    Bytes(u64),
    Text(String),
}

impl ClusterFile {
    /// Read and check the file at `path`.
    pub fn load(path: &Path) -> Result<ClusterFile, ConfigError> {
        let text = std::fs::read_to_string(path).map_err(|e| ConfigError::Read(path.to_path_buf(), e))?;
        ClusterFile::parse(&text, path.parent().unwrap_or(Path::new(".")))
    }

    /// Check `text`; relative paths are taken from `dir`.
    pub fn parse(text: &str, dir: &Path) -> Result<ClusterFile, ConfigError> {
        let raw: RawFile = toml::from_str(text).map_err(|e| ConfigError::Parse(e.to_string()))?;
        let bad = |msg: String| Err(ConfigError::Invalid(msg));
        if raw.device.is_empty() {
            return bad("it has no [[device]] entries".into());
        }
        let mut head = None;
        let mut devices = Vec::with_capacity(raw.device.len());
        for (i, d) in raw.device.into_iter().enumerate() {
            let which = format!("device {} ({})", i + 1, d.name.as_deref().or(d.addr.as_deref()).unwrap_or("head"));
            if d.head {
                if head.is_some() {
                    return bad(format!("{which}: only one device can be the head"));
                }
                if d.addr.is_some() {
                    return bad(format!("{which}: the head's entry takes no addr (it is this process)"));
                }
                head = Some(i);
            } else {
                match d.addr.as_deref() {
                    None => return bad(format!("{which}: addr is missing (host:port of its `blink node`)")),
                    Some(a) => check_addr(a).map_err(|e| ConfigError::Invalid(format!("{which}: addr {a:?}: {e}")))?,
                }
            }
            let memory = match d.memory {
                None => None,
                Some(Size::Bytes(b)) => Some(b),
                Some(Size::Text(t)) => Some(parse_size(&t).map_err(|e| ConfigError::Invalid(format!("{which}: memory {t:?}: {e}")))?),
            };
            if memory == Some(0) || d.threads == Some(0) {
                return bad(format!("{which}: memory and threads must be above zero"));
            }
            let link = link_of(d.latency_ms, d.mbps).map_err(|e| ConfigError::Invalid(format!("{which}: {e}")))?;
            let name = d.name.or(d.addr.clone()).unwrap_or_else(|| "head".into());
            devices.push(DeviceEntry { addr: d.addr, memory, threads: d.threads, profile: d.profile.map(|p| dir.join(p)), name, link });
        }
        let fixed = match (raw.windows, raw.rounds) {
            (None, None) => None,
            (Some(w), rounds) => {
                let rounds = rounds.unwrap_or(1);
                if w.len() != devices.len() {
                    return bad(format!("windows has {} entries for {} devices", w.len(), devices.len()));
                }
                if rounds == 0 || w.iter().all(|&x| x == 0) {
                    return bad("a fixed plan needs at least one round and one window of at least one layer".into());
                }
                Some((w, rounds))
            }
            (None, Some(_)) => return bad("rounds is given without windows".into()),
        };
        let head_link = link_of(raw.head_latency_ms, raw.head_mbps).map_err(|e| ConfigError::Invalid(format!("the head's link: {e}")))?;
        Ok(ClusterFile { token_file: dir.join(raw.token_file), devices, head, fixed, head_link })
    }
}

/// A link from `latency_ms` and `mbps` (megabits per second), given both or neither.
fn link_of(latency_ms: Option<f64>, mbps: Option<f64>) -> Result<Option<Link>, String> {
    match (latency_ms, mbps) {
        (None, None) => Ok(None),
        (Some(ms), Some(mbps)) if ms.is_finite() && ms >= 0.0 && mbps.is_finite() && mbps > 0.0 => {
            Ok(Some(Link { latency_s: ms / 1e3, bytes_per_s: mbps * 1e6 / 8.0 }))
        }
        (Some(_), Some(_)) => Err("latency_ms must be at least 0 and mbps above 0".into()),
        _ => Err("latency_ms and mbps go together".into()),
    }
}

/// `host:port` with a port number.
fn check_addr(a: &str) -> Result<(), String> {
    let (host, port) = a.rsplit_once(':').ok_or("not host:port")?;
    if host.is_empty() {
        return Err("the host is empty".into());
    }
    port.parse::<u16>().map_err(|_| format!("{port:?} is not a port number"))?;
    Ok(())
}

/// A size: a number with an optional unit, B, KB/KiB, MB/MiB, GB/GiB or TB/TiB (any
/// case; KB and friends are powers of 1000, KiB and friends of 1024).
pub fn parse_size(s: &str) -> Result<u64, String> {
    let s = s.trim();
    let split = s.find(|c: char| !(c.is_ascii_digit() || c == '.')).unwrap_or(s.len());
    let (number, unit) = (&s[..split], s[split..].trim());
    let value: f64 = number.parse().map_err(|_| format!("{number:?} is not a number"))?;
    let scale = match unit.to_ascii_lowercase().as_str() {
        "" | "b" => 1.0,
        "kb" | "k" => 1e3,
        "mb" | "m" => 1e6,
        "gb" | "g" => 1e9,
        "tb" | "t" => 1e12,
        "kib" => 1024.0,
        "mib" => 1024f64.powi(2),
        "gib" => 1024f64.powi(3),
        "tib" => 1024f64.powi(4),
        other => return Err(format!("unknown unit {other:?} (B, KB, MB, GB, TB, KiB, MiB, GiB or TiB)")),
    };
    let bytes = value * scale;
    if !bytes.is_finite() || bytes >= u64::MAX as f64 {
        return Err("too large".into());
    }
    Ok(bytes.round() as u64)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(text: &str) -> Result<ClusterFile, ConfigError> {
        ClusterFile::parse(text, Path::new("/etc/blink"))
    }

    #[test]
    fn the_smallest_file_and_a_full_one() {
        let c = parse("token_file = \"ring.token\"\n[[device]]\naddr = \"127.0.0.1:9301\"\n").unwrap();
        assert_eq!(c.token_file, PathBuf::from("/etc/blink/ring.token"));
        assert_eq!((c.devices.len(), c.head, c.fixed.clone()), (1, None, None));
        assert_eq!(c.devices[0].name, "127.0.0.1:9301");

        let c = parse(
            "token_file = \"/k/ring.token\"\nwindows = [2, 10, 0]\nrounds = 2\n\
             [[device]]\nhead = true\nmemory = \"1.5GiB\"\n\
             [[device]]\naddr = \"laptop.local:9301\"\nmemory = 2000000000\nthreads = 4\nprofile = \"laptop.json\"\n\
             [[device]]\naddr = \"[::1]:9302\"\nname = \"phone\"\nmemory = \"512 MB\"\nlatency_ms = 2.5\nmbps = 80\n",
        )
        .unwrap();
        assert_eq!(c.token_file, PathBuf::from("/k/ring.token"));
        assert_eq!(c.head, Some(0));
        assert_eq!(c.fixed, Some((vec![2, 10, 0], 2)));
        let d = &c.devices;
        assert_eq!((d[0].memory, d[1].memory, d[2].memory), (Some(1610612736), Some(2_000_000_000), Some(512_000_000)));
        assert_eq!((d[1].threads, d[1].profile.clone()), (Some(4), Some(PathBuf::from("/etc/blink/laptop.json"))));
        assert_eq!((d[0].name.as_str(), d[2].name.as_str()), ("head", "phone"));
        assert_eq!((d[1].link, d[2].link), (None, Some(Link { latency_s: 0.0025, bytes_per_s: 10e6 })));
    }

    #[test]
    fn mistakes_are_named() {
        let err = |text: &str| parse(text).unwrap_err().to_string();
        let dev = "token_file = \"t\"\n[[device]]\n";
        assert!(err("[[device]]\naddr = \"a:1\"\n").contains("token_file"));
        assert!(err("token_file = \"t\"\n").contains("no [[device]]"));
        assert!(err(dev).contains("device 1 (head): addr is missing"));
        assert!(err(&format!("{dev}addr = \"nohost\"\n")).contains("not host:port"));
        assert!(err(&format!("{dev}addr = \"h:99999\"\n")).contains("not a port number"));
        assert!(err(&format!("{dev}addr = \"h:1\"\nmemory = \"3 parsecs\"\n")).contains("memory \"3 parsecs\""));
        assert!(err(&format!("{dev}addr = \"h:1\"\ncolour = \"red\"\n")).contains("colour"));
        assert!(err(&format!("{dev}head = true\n[[device]]\nhead = true\n")).contains("only one device can be the head"));
        assert!(err(&format!("{dev}head = true\naddr = \"h:1\"\n")).contains("takes no addr"));
        assert!(err(&format!("windows = [1, 2]\n{dev}addr = \"h:1\"\n")).contains("2 entries for 1 devices"));
        assert!(err(&format!("rounds = 2\n{dev}addr = \"h:1\"\n")).contains("without windows"));
        assert!(err(&format!("windows = [0]\n{dev}addr = \"h:1\"\n")).contains("at least one round"));
        assert!(err("token_file = \"t\"\n[[device]\n").contains("not valid"));
        assert!(err(&format!("{dev}addr = \"h:1\"\nmbps = 10\n")).contains("go together"));
        assert!(err(&format!("head_latency_ms = 1\nhead_mbps = 0\n{dev}addr = \"h:1\"\n")).contains("the head's link"));
    }

    #[test]
    fn sizes() {
        assert_eq!(parse_size("1.5GiB"), Ok(1610612736));
        assert_eq!(parse_size("2 gb"), Ok(2_000_000_000));
        assert_eq!(parse_size("4096"), Ok(4096));
        assert_eq!(parse_size("64KiB"), Ok(65536));
        assert!(parse_size("GiB").is_err() && parse_size("1e99").is_err() && parse_size("-1GiB").is_err());
    }
}
