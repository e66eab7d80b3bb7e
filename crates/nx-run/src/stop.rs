//! Stop strings over streamed text: find the first match, and hold back any tail that
//! could still grow into one.

/// What one push released.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum Released {
    /// Text that can no longer be part of a stop string.
    Text(String),
    /// A stop string was found; this is the text before it (the rest is dropped).
    Stopped(String),
}

/// Watches the output for stop strings. Everything pushed is either released or held:
/// the held tail is the longest suffix of the output that is a proper prefix of some
/// stop string, so no match can start in text already released.
#[derive(Debug, Default)]
pub(crate) struct StopMatcher {
    stops: Vec<String>,
    held: String,
}

impl StopMatcher {
    /// A matcher for `stops` (empty strings are ignored).
    pub(crate) fn new(stops: &[String]) -> StopMatcher {
        StopMatcher {
            stops: stops.iter().filter(|s| !s.is_empty()).cloned().collect(),
            held: String::new(),
        }
    }

    /// Adds newly decoded text.
    pub(crate) fn push(&mut self, text: &str) -> Released {
        if self.stops.is_empty() {
            return Released::Text(text.to_string());
        }
        self.held.push_str(text);
        // The earliest match of any stop string wins; a match cannot start in text
        // released earlier, so searching the held text is enough.
        let first = self
            .stops
            .iter()
            .filter_map(|s| self.held.find(s.as_str()))
            .min();
        if let Some(at) = first {
            let before = self.held[..at].to_string();
            self.held.clear();
            return Released::Stopped(before);
        }
        let keep = self.partial_match_len();
        let cut = self.held.len() - keep;
        let out = self.held[..cut].to_string();
        self.held.drain(..cut);
        Released::Text(out)
    }

    /// Releases whatever is held (the output ended without a match).
    pub(crate) fn flush(&mut self) -> String {
        std::mem::take(&mut self.held)
    }

    /// Length of the longest suffix of the held text that is a proper prefix of a stop
    /// string. Such a suffix starts with a stop string's first byte, never a UTF-8
    /// continuation byte, so cutting there keeps both halves valid strings.
    fn partial_match_len(&self) -> usize {
        let held = self.held.as_bytes();
        let mut best = 0;
        for stop in &self.stops {
            let stop = stop.as_bytes();
            let longest = (stop.len() - 1).min(held.len());
            for k in (best + 1..=longest).rev() {
                if held.ends_with(&stop[..k]) && self.held.is_char_boundary(held.len() - k) {
                    best = k;
                    break;
                }
            }
        }
        best
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn matcher(stops: &[&str]) -> StopMatcher {
        StopMatcher::new(&stops.iter().map(|s| s.to_string()).collect::<Vec<_>>())
    }

    #[test]
    fn no_stops_passes_text_through() {
        let mut m = matcher(&[]);
        assert_eq!(m.push("abc"), Released::Text("abc".into()));
        assert_eq!(m.flush(), "");
    }

    #[test]
    fn match_across_pushes_is_found_and_cut() {
        let mut m = matcher(&["END"]);
        assert_eq!(m.push("hello E"), Released::Text("hello ".into()));
        assert_eq!(m.push("N"), Released::Text("".into()));
        assert_eq!(m.push("D and more"), Released::Stopped("".into()));
    }

    #[test]
    fn false_alarm_is_released_later() {
        let mut m = matcher(&["END"]);
        assert_eq!(m.push("xE"), Released::Text("x".into()));
        assert_eq!(m.push("Nx"), Released::Text("ENx".into()));
        assert_eq!(m.push("EN"), Released::Text("".into()));
        assert_eq!(m.flush(), "EN");
    }

    #[test]
    fn earliest_of_several_stops_wins() {
        let mut m = matcher(&["world", "lo w"]);
        assert_eq!(m.push("hello world"), Released::Stopped("hel".into()));
    }

    #[test]
    fn multibyte_prefixes_cut_on_char_boundaries() {
        let mut m = matcher(&["éa"]);
        assert_eq!(m.push("café"), Released::Text("caf".into()));
        assert_eq!(m.push("b"), Released::Text("éb".into()));
        assert_eq!(m.push("éa!"), Released::Stopped("".into()));
    }

    #[test]
    fn reassembled_output_equals_input_before_the_stop() {
        // Any split of a text into pushes releases exactly the text before the first
        // stop match (or all of it).
        let text = "one two three stop four";
        for split in 1..text.len() {
            if !text.is_char_boundary(split) {
                continue;
            }
            let mut m = matcher(&["stop", "tw0"]);
            let mut out = String::new();
            let mut stopped = false;
            for part in [&text[..split], &text[split..]] {
                match m.push(part) {
                    Released::Text(t) => out.push_str(&t),
                    Released::Stopped(t) => {
                        out.push_str(&t);
                        stopped = true;
                        break;
                    }
                }
            }
            assert!(stopped);
            assert_eq!(out, "one two three ");
        }
    }

    proptest::proptest! {
        /// Whatever the split into pushes, the released text is the text before the
        /// earliest match of any stop string (found here with `str::find` on the whole
        /// text), or the whole text after a flush when nothing matches.
        #[test]
        fn streaming_equals_whole_text_search(
            text in "[ab\u{e9}\u{20ac} ]{0,40}",
            stops in proptest::collection::vec("[ab\u{e9}\u{20ac} ]{1,4}", 0..3),
            cuts in proptest::collection::vec(0usize..64, 0..8),
        ) {
            let first = stops.iter().filter_map(|s| text.find(s.as_str())).min();
            let expected = match first {
                Some(at) => &text[..at],
                None => &text[..],
            };
            let mut bounds: Vec<usize> = cuts
                .iter()
                .map(|&c| c.min(text.len()))
                .filter(|&c| text.is_char_boundary(c))
                .collect();
            bounds.push(0);
            bounds.push(text.len());
            bounds.sort_unstable();
            bounds.dedup();
            let mut m = StopMatcher::new(&stops);
            let mut out = String::new();
            let mut stopped = false;
            for w in bounds.windows(2) {
                match m.push(&text[w[0]..w[1]]) {
                    Released::Text(t) => out.push_str(&t),
                    Released::Stopped(t) => {
                        out.push_str(&t);
                        stopped = true;
                        break;
                    }
                }
            }
            if !stopped {
                out.push_str(&m.flush());
            }
            proptest::prop_assert_eq!(stopped, first.is_some());
            proptest::prop_assert_eq!(out, expected);
        }
    }
}
