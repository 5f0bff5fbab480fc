//! Duration flags, one convention for every command: a number with a unit as humantime reads it
//! (`500ms`, `30s`, `5m`, `1h30m`), or a bare whole number of seconds, the form the flags took
//! before (`--interval=300`). Flags that were in milliseconds kept their old name as a hidden
//! alias with the old unit (`--request-timeout-ms`).

use std::time::Duration;

/// Any duration, zero included.
pub fn duration(s: &str) -> Result<Duration, String> {
    let t = s.trim();
    if !t.is_empty() && t.bytes().all(|b| b.is_ascii_digit()) {
        return t.parse::<u64>().map(Duration::from_secs).map_err(|_| format!("{s:?} is too many seconds"));
    }
    humantime::parse_duration(t).map_err(|e| {
        format!("{s:?} is not a duration ({e}): give a number with a unit (500ms, 30s, 5m, 1h) or whole seconds")
    })
}

/// A duration of at least one millisecond.
pub fn positive(s: &str) -> Result<Duration, String> {
    let d = duration(s)?;
    if d < Duration::from_millis(1) {
        return Err(format!("{s:?}: must be at least 1ms"));
    }
    Ok(d)
}

/// A duration of at least one second.
pub fn at_least_1s(s: &str) -> Result<Duration, String> {
    let d = duration(s)?;
    if d < Duration::from_secs(1) {
        return Err(format!("{s:?}: must be at least 1s"));
    }
    Ok(d)
}

/// A whole number of seconds, at least one (for values that travel as seconds: TTLs of DNS
/// records and etcd leases).
pub fn whole_seconds(s: &str) -> Result<Duration, String> {
    let d = at_least_1s(s)?;
    if d.subsec_nanos() != 0 {
        return Err(format!("{s:?}: must be whole seconds"));
    }
    Ok(d)
}

/// `d` as humantime writes it (`5m`, `1h 30m`, `500ms`), for messages.
pub fn show(d: Duration) -> String {
    humantime::format_duration(d).to_string()
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    #[test]
    fn units_and_bare_seconds_are_read() {
        assert_eq!(duration("300").unwrap(), Duration::from_secs(300));
        assert_eq!(duration("30s").unwrap(), Duration::from_secs(30));
        assert_eq!(duration("5m").unwrap(), Duration::from_secs(300));
        assert_eq!(duration("1h30m").unwrap(), Duration::from_secs(5400));
        assert_eq!(duration("500ms").unwrap(), Duration::from_millis(500));
        assert_eq!(duration("0").unwrap(), Duration::ZERO);
    }

    #[test]
    fn bad_values_say_what_a_duration_looks_like() {
        for bad in ["", "5 parsecs", "-3", "1.5", "s"] {
            let e = duration(bad).unwrap_err();
            assert!(e.contains("30s") && e.contains(&format!("{bad:?}")), "{bad}: {e}");
        }
        assert!(positive("0s").unwrap_err().contains("at least 1ms"));
        assert!(at_least_1s("500ms").unwrap_err().contains("at least 1s"));
        assert!(whole_seconds("1500ms").unwrap_err().contains("whole seconds"));
        assert_eq!(whole_seconds("2m").unwrap(), Duration::from_secs(120));
    }
}
