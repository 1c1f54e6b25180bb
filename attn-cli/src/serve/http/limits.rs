//! API keys and request limits: the `--api-keys FILE` table (LibreTranslate keeps the same
//! columns in its sqlite `api_keys` table: key, requests per minute, character limit) and a
//! moving one-minute window per client and route (flask-limiter's "moving-window" strategy,
//! which app.py 282-291 uses).

use std::collections::{HashMap, VecDeque};
use std::path::Path;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Mutex;
use std::time::{Duration, Instant};

/// One key's limits; `None` takes the server's default.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct KeyLimits {
    /// Requests per minute (`Some(None)`: unlimited, from `-1`).
    pub req_limit: Option<Option<u64>>,
    /// Characters per text (`Some(None)`: unlimited, from `-1`).
    pub char_limit: Option<Option<usize>>,
}

/// The API keys a server accepts, with their limits.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ApiKeys {
    keys: HashMap<String, KeyLimits>,
}

fn parse_limit(field: &str, what: &str, line: usize) -> Result<Option<u64>, String> {
    if field == "-1" {
        return Ok(None);
    }
    field.parse::<u64>().map(Some).map_err(|_| {
        format!("line {line}: {what} {field:?} is not a whole number (or -1: no limit)")
    })
}

impl ApiKeys {
    /// Parses the file's text: one key a line, optionally followed by its requests per minute
    /// and its character limit (`KEY [REQ_PER_MIN [CHAR_LIMIT]]`, whitespace between, `-1` for
    /// no limit); blank lines and lines starting with `#` are skipped.
    pub fn parse(text: &str) -> Result<Self, String> {
        let mut keys = HashMap::new();
        for (i, raw) in text.lines().enumerate() {
            let line = raw.trim();
            if line.is_empty() || line.starts_with('#') {
                continue;
            }
            let fields: Vec<&str> = line.split_whitespace().collect();
            if fields.len() > 3 {
                return Err(format!(
                    "line {}: expected KEY [REQ_PER_MIN [CHAR_LIMIT]], found {} fields",
                    i + 1,
                    fields.len()
                ));
            }
            let mut limits = KeyLimits::default();
            if let Some(f) = fields.get(1) {
                limits.req_limit = Some(parse_limit(f, "REQ_PER_MIN", i + 1)?);
            }
            if let Some(f) = fields.get(2) {
                limits.char_limit = Some(parse_limit(f, "CHAR_LIMIT", i + 1)?.map(|n| n as usize));
            }
            if keys.insert(fields[0].to_string(), limits).is_some() {
                return Err(format!("line {}: key {:?} appears twice", i + 1, fields[0]));
            }
        }
        Ok(Self { keys })
    }

    /// Reads and parses a keys file.
    pub fn load(path: &Path) -> Result<Self, String> {
        let text = std::fs::read_to_string(path)
            .map_err(|e| format!("cannot read the API keys file {}: {e}", path.display()))?;
        Self::parse(&text).map_err(|e| format!("{}: {e}", path.display()))
    }

    /// A key's limits, `None` if the key is unknown.
    pub fn lookup(&self, key: &str) -> Option<KeyLimits> {
        self.keys.get(key).copied()
    }

    /// How many keys there are.
    pub fn len(&self) -> usize {
        self.keys.len()
    }

    /// Whether there are none.
    pub fn is_empty(&self) -> bool {
        self.keys.is_empty()
    }
}

const WINDOW: Duration = Duration::from_secs(60);

/// Requests per minute per client and route, over a moving one-minute window.
#[derive(Debug, Default)]
pub struct RateLimiter {
    windows: Mutex<HashMap<String, VecDeque<(Instant, u64)>>>,
    calls: AtomicU64,
}

fn prune(window: &mut VecDeque<(Instant, u64)>, now: Instant) {
    while let Some(&(t, _)) = window.front() {
        if now.saturating_duration_since(t) >= WINDOW {
            window.pop_front();
        } else {
            break;
        }
    }
}

impl RateLimiter {
    /// Takes one request for `key` if fewer than `limit` were taken in the last minute; if
    /// not, returns the seconds until one leaves the window.
    pub fn take(&self, key: &str, limit: u64, now: Instant) -> Result<(), u64> {
        let mut windows = self.windows.lock().unwrap_or_else(|e| e.into_inner());
        if self.calls.fetch_add(1, Ordering::Relaxed) % 4096 == 4095 {
            windows.retain(|_, w| {
                prune(w, now);
                !w.is_empty()
            });
        }
        let window = windows.entry(key.to_string()).or_default();
        prune(window, now);
        let used: u64 = window.iter().map(|&(_, c)| c).sum();
        if used >= limit {
            let oldest = window.front().map(|&(t, _)| t).unwrap_or(now);
            let wait = WINDOW.saturating_sub(now.saturating_duration_since(oldest));
            return Err(wait.as_secs().max(1));
        }
        window.push_back((now, 1));
        Ok(())
    }

    /// Adds `extra` to what `key` used now (a batch of N texts costs N: app.py 790).
    pub fn charge(&self, key: &str, extra: u64, now: Instant) {
        if extra == 0 {
            return;
        }
        let mut windows = self.windows.lock().unwrap_or_else(|e| e.into_inner());
        windows
            .entry(key.to_string())
            .or_default()
            .push_back((now, extra));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys_file() {
        let k = ApiKeys::parse("# keys\nabc\n\n  def 10\nghi 5 200\nunl -1 -1\n").unwrap();
        assert_eq!(k.len(), 4);
        assert_eq!(k.lookup("abc"), Some(KeyLimits::default()));
        assert_eq!(k.lookup("def").unwrap().req_limit, Some(Some(10)));
        assert_eq!(k.lookup("ghi").unwrap().char_limit, Some(Some(200)));
        assert_eq!(k.lookup("unl").unwrap().req_limit, Some(None));
        assert_eq!(k.lookup("zzz"), None);
        assert!(ApiKeys::parse("a b").unwrap_err().contains("line 1"));
        assert!(ApiKeys::parse("a 1 2 3").is_err());
        assert!(ApiKeys::parse("a\na").is_err());
    }

    #[test]
    fn moving_window() {
        let r = RateLimiter::default();
        let t0 = Instant::now();
        assert!(r.take("a", 2, t0).is_ok());
        assert!(r.take("a", 2, t0).is_ok());
        assert_eq!(r.take("a", 2, t0), Err(60));
        assert!(r.take("b", 2, t0).is_ok());
        assert!(r.take("a", 2, t0 + Duration::from_secs(61)).is_ok());
        r.charge("c", 4, t0);
        assert!(r.take("c", 4, t0).is_err());
    }
}
