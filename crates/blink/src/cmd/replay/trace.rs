//! A trace: arrivals in time order, each with its prompt and output lengths; its CSV form
//! (`timestamp_s,prompt_tokens,max_tokens`, header optional, `#` comments and blank lines
//! skipped), read with every bad line named and written back in the same form; and
//! rescaling its time axis to a mean rate.

use std::fmt::Write as _;

/// One request of a trace.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Arrival {
    /// Seconds from the trace's start.
    pub at: f64,
    pub prompt_tokens: usize,
    pub max_tokens: usize,
}

/// The arrivals of a CSV text, sorted by time (stable, so equal times keep their order).
pub fn parse_csv(text: &str) -> Result<Vec<Arrival>, String> {
    let mut out = Vec::new();
    let mut seen_data = false;
    for (i, raw) in text.lines().enumerate() {
        let line = raw.trim();
        if line.is_empty() || line.starts_with('#') {
            continue;
        }
        let fields: Vec<&str> = line.split(',').map(str::trim).collect();
        if !seen_data && fields.first().is_some_and(|f| f.parse::<f64>().is_err()) {
            // A header: the first line that is not a comment, if it is not a number.
            seen_data = true;
            if fields.len() < 3 {
                return Err(format!("line {}: a header needs three columns (timestamp_s, prompt_tokens, max_tokens): {line:?}", i + 1));
            }
            continue;
        }
        seen_data = true;
        out.push(parse_line(&fields).map_err(|e| format!("line {}: {e}: {line:?}", i + 1))?);
    }
    if out.is_empty() {
        return Err("the trace has no requests".into());
    }
    out.sort_by(|a, b| a.at.total_cmp(&b.at));
    Ok(out)
}

fn parse_line(fields: &[&str]) -> Result<Arrival, String> {
    if fields.len() < 3 {
        return Err(format!("{} column(s), want three (timestamp_s, prompt_tokens, max_tokens)", fields.len()));
    }
    let at: f64 = fields[0].parse().map_err(|_| format!("timestamp {:?} is not a number", fields[0]))?;
    if !at.is_finite() || at < 0.0 {
        return Err(format!("timestamp {at} must be a finite number of seconds, at least 0"));
    }
    let count = |what: &str, s: &str| match s.parse::<usize>() {
        Ok(0) | Err(_) => Err(format!("{what} {s:?} is not a positive whole number")),
        Ok(n) => Ok(n),
    };
    Ok(Arrival { at, prompt_tokens: count("prompt_tokens", fields[1])?, max_tokens: count("max_tokens", fields[2])? })
}

/// The CSV form of `trace`, with a header.
pub fn to_csv(trace: &[Arrival]) -> String {
    let mut out = String::from("timestamp_s,prompt_tokens,max_tokens\n");
    for a in trace {
        let _ = writeln!(out, "{:.6},{},{}", a.at, a.prompt_tokens, a.max_tokens);
    }
    out
}

/// Requests per second over the trace: `n` arrivals span `n - 1` gaps. `None` when the
/// trace has one request or all arrive at once.
pub fn mean_rate(trace: &[Arrival]) -> Option<f64> {
    let span = trace.last()?.at - trace.first()?.at;
    (trace.len() > 1 && span > 0.0).then(|| (trace.len() - 1) as f64 / span)
}

/// `trace` with its times scaled (from its first arrival) so that its mean rate is `rate`.
pub fn rescale(trace: &mut [Arrival], rate: f64) -> Result<(), String> {
    let Some(now) = mean_rate(trace) else {
        return Err("the trace's rate cannot be changed: its requests all arrive at once".into());
    };
    let t0 = trace[0].at;
    for a in trace.iter_mut() {
        a.at = t0 + (a.at - t0) * now / rate;
    }
    Ok(())
}

/// Mean prompt and output lengths.
pub fn mean_shape(trace: &[Arrival]) -> (f64, f64) {
    let n = trace.len().max(1) as f64;
    (trace.iter().map(|a| a.prompt_tokens as f64).sum::<f64>() / n, trace.iter().map(|a| a.max_tokens as f64).sum::<f64>() / n)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn csv_with_and_without_header_round_trips() {
        let with = parse_csv("timestamp_s, prompt_tokens, max_tokens\n0.5,10,4\n# a comment\n\n0.25, 7, 3\n").unwrap();
        let without = parse_csv("0.5,10,4\n0.25,7,3").unwrap();
        assert_eq!(with, without);
        assert_eq!(with[0], Arrival { at: 0.25, prompt_tokens: 7, max_tokens: 3 }, "sorted by time");
        assert_eq!(parse_csv(&to_csv(&with)).unwrap(), with);
        // Extra columns (DeltaServe's `second`, `index_in_second`) are ignored.
        assert_eq!(parse_csv("timestamp_s,prompt_length,max_new_tokens,second,index_in_second\n5.0,50,50,5,0\n").unwrap().len(), 1);
    }

    #[test]
    fn bad_lines_are_named() {
        let err = |text: &str| parse_csv(text).unwrap_err();
        assert!(err("t,p,m\n0,1,1\n1,2\n").starts_with("line 3: 2 column(s)"), "{}", err("t,p,m\n0,1,1\n1,2\n"));
        assert!(err("0,1,1\nx,1,1\n").starts_with("line 2: timestamp \"x\" is not a number"));
        assert!(err("0,1,1\n-1,1,1\n").starts_with("line 2: timestamp -1 must be"));
        assert!(err("0,1,1\n1,0,1\n").starts_with("line 2: prompt_tokens \"0\""));
        assert!(err("0,1,1\n1,1,2.5\n").starts_with("line 2: max_tokens \"2.5\""));
        assert!(err("0,1,1\n1,1,1\nNaN,1,1").starts_with("line 3: timestamp NaN"));
        assert_eq!(err("timestamp_s,prompt_tokens,max_tokens\n"), "the trace has no requests");
        assert_eq!(err(""), "the trace has no requests");
        assert!(err("time\n0,1,1").starts_with("line 1: a header needs three columns"));
    }

    #[test]
    fn rescaling_sets_the_mean_rate() {
        let mut t = parse_csv("2,1,1\n3,1,1\n6,1,1\n").unwrap();
        assert_eq!(mean_rate(&t), Some(0.5));
        rescale(&mut t, 2.0).unwrap();
        assert_eq!(t.iter().map(|a| a.at).collect::<Vec<_>>(), vec![2.0, 2.25, 3.0]);
        assert!(rescale(&mut parse_csv("1,1,1\n1,2,2").unwrap(), 1.0).is_err());
    }
}
