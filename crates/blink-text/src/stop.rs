//! Stop strings over streamed text.
//!
//! Text arrives in pieces; a stop string may span pieces. `StopMatcher` releases only text
//! that can no longer become part of a stop string, and on a match releases the text
//! before it and reports the stop.

/// What `StopMatcher::push` found.
#[derive(Debug, PartialEq, Eq)]
pub enum StopScan<'a> {
    /// Text safe to emit now (possibly empty).
    Continue(&'a str),
    /// A stop string matched; emit this text (everything before the match) and stop.
    Stopped(&'a str),
}

/// Finds the earliest stop string in a stream of text.
#[derive(Default)]
pub struct StopMatcher {
    stops: Vec<String>,
    /// Text received but not yet released.
    held: String,
    /// Scratch for the released text.
    out: String,
}

impl StopMatcher {
    /// Empty stop strings are ignored.
    pub fn new(stops: &[String]) -> StopMatcher {
        StopMatcher { stops: stops.iter().filter(|s| !s.is_empty()).cloned().collect(), held: String::new(), out: String::new() }
    }

    /// Add `piece` and return what may be emitted.
    pub fn push(&mut self, piece: &str) -> StopScan<'_> {
        self.held.push_str(piece);
        self.out.clear();
        if self.stops.is_empty() {
            std::mem::swap(&mut self.out, &mut self.held);
            return StopScan::Continue(&self.out);
        }
        if let Some(at) = self.stops.iter().filter_map(|s| self.held.find(s.as_str())).min() {
            self.out.push_str(&self.held[..at]);
            self.held.clear();
            return StopScan::Stopped(&self.out);
        }
        // Hold back the longest suffix that is a prefix of some stop string.
        let keep = self
            .stops
            .iter()
            .map(|s| longest_suffix_prefix(&self.held, s))
            .max()
            .unwrap_or(0);
        let cut = self.held.len() - keep;
        self.out.push_str(&self.held[..cut]);
        self.held.drain(..cut);
        StopScan::Continue(&self.out)
    }

    /// Release whatever is held (the stream ended without a stop).
    pub fn finish(&mut self) -> String {
        std::mem::take(&mut self.held)
    }
}

/// Length of the longest suffix of `text` that is a proper prefix of `stop`, on a char boundary.
fn longest_suffix_prefix(text: &str, stop: &str) -> usize {
    let max = (stop.len() - 1).min(text.len());
    (1..=max)
        .rev()
        .find(|&n| text.is_char_boundary(text.len() - n) && stop.as_bytes().starts_with(&text.as_bytes()[text.len() - n..]))
        .unwrap_or(0)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn run(stops: &[&str], pieces: &[&str]) -> (String, bool) {
        let stops: Vec<String> = stops.iter().map(|s| s.to_string()).collect();
        let mut m = StopMatcher::new(&stops);
        let mut out = String::new();
        for p in pieces {
            match m.push(p) {
                StopScan::Continue(t) => out.push_str(t),
                StopScan::Stopped(t) => {
                    out.push_str(t);
                    return (out, true);
                }
            }
        }
        out.push_str(&m.finish());
        (out, false)
    }

    #[test]
    fn stop_spanning_pieces_is_found_and_cut() {
        assert_eq!(run(&["\n\n"], &["Hello", "\n", "\nWorld"]), ("Hello".into(), true));
        assert_eq!(run(&["END"], &["abc E", "N", "D more"]), ("abc ".into(), true));
    }

    #[test]
    fn partial_match_that_fails_is_released() {
        assert_eq!(run(&["END"], &["abc E", "N", "x"]), ("abc ENx".into(), false));
    }

    #[test]
    fn earliest_of_several_stops_wins() {
        assert_eq!(run(&["b", "a"], &["xxab"]), ("xx".into(), true));
    }

    #[test]
    fn multibyte_text_never_splits() {
        assert_eq!(run(&["é!"], &["caf", "é", "?"]), ("café?".into(), false));
    }

    #[test]
    fn no_stops_passes_through() {
        assert_eq!(run(&[], &["a", "b"]), ("ab".into(), false));
    }
}
