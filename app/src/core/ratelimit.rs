//! Rate limits shared by every process on one database, keyed by a purpose and a subject (an
//! e-mail, a client address, an API key id).
//!
//! Each subject has one window in `rate_limits` (it starts at the first hit, as PostgreSQL's
//! clock tells, and lasts the limit's period). A process does not ask the database for every
//! hit: it takes a *lease* of `chunk = limit / 50` hits (at least 1) in one statement, admits
//! requests from it in memory, and takes another lease when it is spent. So:
//!
//! - the processes together **never admit more than the limit** in a window: a lease is only
//!   granted out of what is left;
//! - they may refuse a little early: hits leased by one process and not yet used are not
//!   available to another, so once the limit is reached at most `processes × (chunk − 1)` of it
//!   went unused (2 of 100 for two processes and a limit of 100; 0 for limits under 100, such as
//!   log-ins, which take one hit per statement);
//! - a busy API key at the default 600 a minute costs one statement per 12 requests, and a
//!   subject over its limit costs nothing more until its window ends: the refusal is known in
//!   memory.
//!
//! Requests of one subject wait for one lease together (a lock per subject), not one each.
use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use sqlx::PgPool;

use super::error::AppError;

pub struct RateLimiter {
    pool: PgPool,
    leases: Mutex<HashMap<String, Arc<tokio::sync::Mutex<Lease>>>>,
}

#[derive(Default)]
struct Lease {
    /// When the window the lease belongs to ends (None: no lease yet).
    ends: Option<Instant>,
    /// Hits leased and not yet used.
    left: u64,
    /// The window's limit is reached: refuse until it ends.
    spent: bool,
    /// When a lease could last not be taken (the database unreachable): requests that were
    /// already waiting for it answer at once rather than each waiting for a connection in turn.
    failed: Option<Instant>,
}

/// How many hits one statement leases for a limit.
pub fn chunk(limit: u32) -> u64 {
    (u64::from(limit) / 50).clamp(1, 10_000)
}

impl RateLimiter {
    pub fn new(pool: PgPool) -> Self {
        Self {
            pool,
            leases: Default::default(),
        }
    }

    /// Counts one hit; over `limit` hits within `window` (across every process) answers 429 with
    /// the seconds to wait.
    pub async fn hit(&self, key: &str, limit: u32, window: Duration) -> Result<(), AppError> {
        let lease = {
            let mut leases = self.leases.lock().unwrap_or_else(|p| p.into_inner());
            if leases.len() > 100_000 {
                let now = Instant::now();
                leases.retain(|_, l| match l.try_lock() {
                    Ok(l) => l.ends.is_some_and(|e| e > now),
                    Err(_) => true,
                });
            }
            leases.entry(key.to_string()).or_default().clone()
        };
        let arrived = Instant::now();
        let mut lease = lease.lock().await;
        let now = Instant::now();
        if lease.ends.is_some_and(|e| e <= now) {
            *lease = Lease::default();
        }
        if lease.left > 0 {
            lease.left -= 1;
            return Ok(());
        }
        if !lease.spent {
            if lease.failed.is_some_and(|f| f >= arrived) {
                return Err(AppError::Unavailable);
            }
            let want = chunk(limit);
            let (granted, remaining) = match self.take(key, limit, window, want).await {
                Ok(taken) => taken,
                Err(e) => {
                    lease.failed = Some(Instant::now());
                    return Err(e);
                }
            };
            lease.ends = Some(Instant::now() + remaining);
            if granted > 0 {
                lease.left = granted - 1;
                return Ok(());
            }
            lease.spent = true;
        }
        let kind = key.split(':').next().unwrap_or("other").to_string();
        metrics::counter!("engram_rate_limited_total", "limit" => kind).increment(1);
        let wait = lease
            .ends
            .map(|e| e.saturating_duration_since(now))
            .unwrap_or(window);
        Err(AppError::RateLimited {
            message: "Too many requests, try again later".into(),
            retry_after_secs: wait.as_secs_f64().ceil().max(1.0) as u64,
        })
    }

    /// Leases up to `want` hits of `key`'s window (starting a new one if it ended): the hits
    /// granted and how long the window has left. Every hit asked for is recorded, granted or
    /// not, so the remainder is computed from the total before this statement.
    async fn take(
        &self,
        key: &str,
        limit: u32,
        window: Duration,
        want: u64,
    ) -> Result<(u64, Duration), AppError> {
        let secs = window.as_secs().clamp(1, i32::MAX as u64) as i32;
        // In `do update`, `rate_limits.*` is the row before the statement in every expression.
        let (taken, left_ms): (i64, f64) = sqlx::query_as(
            "insert into rate_limits as r (key, started, window_secs, taken)
             values ($1, now(), $2, $3)
             on conflict (key) do update set
                 started = case when r.started + make_interval(secs => r.window_secs) <= now()
                                then now() else r.started end,
                 window_secs = case when r.started + make_interval(secs => r.window_secs) <= now()
                                then excluded.window_secs else r.window_secs end,
                 taken = case when r.started + make_interval(secs => r.window_secs) <= now()
                                then excluded.taken else r.taken + excluded.taken end
             returning taken,
                 (extract(epoch from started + make_interval(secs => window_secs) - now()) * 1000)::float8",
        )
        .bind(key)
        .bind(secs)
        .bind(want as i64)
        .fetch_one(&self.pool)
        .await?;
        let before = (taken as u64).saturating_sub(want);
        let granted = u64::from(limit).saturating_sub(before).min(want);
        Ok((granted, Duration::from_millis(left_ms.max(0.0) as u64)))
    }

    /// Removes windows that ended over a minute ago (housekeeping).
    pub async fn prune(pool: &PgPool) -> Result<u64, sqlx::Error> {
        Ok(sqlx::query(
            "delete from rate_limits
             where started + make_interval(secs => window_secs) < now() - interval '1 minute'",
        )
        .execute(pool)
        .await?
        .rows_affected())
    }
}

#[cfg(test)]
mod tests {
    use super::chunk;

    #[test]
    fn leases_are_a_fiftieth_of_the_limit_and_at_least_one_hit() {
        assert_eq!(chunk(10), 1);
        assert_eq!(chunk(99), 1);
        assert_eq!(chunk(100), 2);
        assert_eq!(chunk(600), 12);
        assert_eq!(chunk(u32::MAX), 10_000);
    }
}
