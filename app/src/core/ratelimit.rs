//! Fixed-window rate limits kept in memory, keyed by a purpose and a subject (an e-mail, a client
//! address, an API key id). One process enforces its own counts; several processes each enforce
//! theirs, which stays within a small multiple of the limit.
use std::collections::HashMap;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use super::error::AppError;

#[derive(Default)]
pub struct RateLimiter {
    windows: Mutex<HashMap<String, (Instant, u32)>>,
}

impl RateLimiter {
    /// Counts one hit; over `limit` hits within `window` answers 429 with the seconds to wait.
    pub fn hit(&self, key: &str, limit: u32, window: Duration) -> Result<(), AppError> {
        let now = Instant::now();
        let mut windows = self.windows.lock().unwrap_or_else(|p| p.into_inner());
        if windows.len() > 100_000 {
            windows.retain(|_, (start, _)| now.duration_since(*start) < Duration::from_secs(3600));
        }
        let entry = windows.entry(key.to_string()).or_insert((now, 0));
        if now.duration_since(entry.0) >= window {
            *entry = (now, 0);
        }
        entry.1 += 1;
        if entry.1 > limit {
            let kind = key.split(':').next().unwrap_or("other").to_string();
            metrics::counter!("engram_rate_limited_total", "limit" => kind).increment(1);
            let retry = window
                .saturating_sub(now.duration_since(entry.0))
                .as_secs()
                .max(1);
            return Err(AppError::RateLimited {
                message: "Too many requests, try again later".into(),
                retry_after_secs: retry,
            });
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_hit_after_the_limit_is_refused_with_a_wait() {
        let l = RateLimiter::default();
        for _ in 0..3 {
            l.hit("k", 3, Duration::from_secs(60)).unwrap();
        }
        match l.hit("k", 3, Duration::from_secs(60)) {
            Err(AppError::RateLimited {
                retry_after_secs, ..
            }) => assert!(retry_after_secs >= 1 && retry_after_secs <= 60),
            other => panic!("{other:?}"),
        }
        l.hit("other", 3, Duration::from_secs(60)).unwrap();
    }
}
