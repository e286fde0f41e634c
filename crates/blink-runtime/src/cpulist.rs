//! CPU and node lists as the kernel writes them (`0-3,8,10-11`), read and written.

/// The largest CPU or node id a list may name.
pub(crate) const MAX_LIST_ID: usize = 1 << 16;

/// A CPU or node list such as `0-3,8` did not parse.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("malformed cpu list '{0}'")]
pub struct BadCpuList(pub String);

/// Parse a kernel CPU/node list such as `0-3,8,10-11\n` into ascending, distinct numbers.
/// Whitespace around items is ignored and an empty list is empty.
pub fn parse_cpulist(text: &str) -> Result<Vec<usize>, BadCpuList> {
    let bad = || BadCpuList(text.trim().to_string());
    let number = |s: &str| -> Result<usize, BadCpuList> {
        let s = s.trim();
        if s.is_empty() || !s.bytes().all(|b| b.is_ascii_digit()) {
            return Err(bad());
        }
        s.parse::<usize>().ok().filter(|&v| v <= MAX_LIST_ID).ok_or_else(bad)
    };
    let mut out = Vec::new();
    for item in text.split(',').map(str::trim).filter(|s| !s.is_empty()) {
        match item.split_once('-') {
            Some((lo, hi)) => {
                let (lo, hi) = (number(lo)?, number(hi)?);
                if lo > hi {
                    return Err(bad());
                }
                out.extend(lo..=hi);
            }
            None => out.push(number(item)?),
        }
    }
    out.sort_unstable();
    out.dedup();
    Ok(out)
}

/// Format numbers as a compact list such as `0-3,8,10-11` (the inverse of [`parse_cpulist`]).
pub fn format_cpulist(cpus: &[usize]) -> String {
    let mut cpus = cpus.to_vec();
    cpus.sort_unstable();
    cpus.dedup();
    let mut out = String::new();
    let mut i = 0;
    while i < cpus.len() {
        let mut j = i;
        while j + 1 < cpus.len() && cpus[j + 1] == cpus[j] + 1 {
            j += 1;
        }
        if !out.is_empty() {
            out.push(',');
        }
        if j > i {
            out.push_str(&format!("{}-{}", cpus[i], cpus[j]));
        } else {
            out.push_str(&cpus[i].to_string());
        }
        i = j + 1;
    }
    out
}

