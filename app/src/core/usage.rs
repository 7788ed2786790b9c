//! API calls per key, counted in memory and written to `api_key_usage` in batches, so a request
//! never waits for a database write to be counted.
use std::collections::HashMap;
use std::sync::Mutex;

use chrono::{DateTime, DurationRound, TimeDelta, Utc};
use sqlx::PgPool;

#[derive(Default)]
pub struct UsageCounter {
    pending: Mutex<HashMap<(i64, DateTime<Utc>), i64>>,
}

fn this_hour() -> DateTime<Utc> {
    Utc::now()
        .duration_trunc(TimeDelta::hours(1))
        .unwrap_or_else(|_| Utc::now())
}

impl UsageCounter {
    pub fn record(&self, key_id: i64) {
        *self
            .pending
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .entry((key_id, this_hour()))
            .or_default() += 1;
    }

    /// Calls not yet flushed for these keys.
    pub fn unflushed(&self, key_ids: &[i64]) -> i64 {
        let pending = self.pending.lock().unwrap_or_else(|p| p.into_inner());
        pending
            .iter()
            .filter(|((k, _), _)| key_ids.contains(k))
            .map(|(_, n)| *n)
            .sum()
    }

    /// Writes the counts gathered so far in one statement; on failure they are kept for next time.
    pub async fn flush(&self, pool: &PgPool) -> Result<(), sqlx::Error> {
        let batch: Vec<((i64, DateTime<Utc>), i64)> = {
            let mut pending = self.pending.lock().unwrap_or_else(|p| p.into_inner());
            pending.drain().collect()
        };
        if batch.is_empty() {
            return Ok(());
        }
        let (keys, hours, calls): (Vec<i64>, Vec<DateTime<Utc>>, Vec<i64>) = batch.iter().fold(
            (vec![], vec![], vec![]),
            |(mut k, mut h, mut c), ((key, hour), n)| {
                k.push(*key);
                h.push(*hour);
                c.push(*n);
                (k, h, c)
            },
        );
        // The counts and each key's `last_used_at`, in one statement.
        let result = sqlx::query(
            "with counted as (
                 insert into api_key_usage (key_id, hour, calls)
                 select u.key_id, u.hour, u.calls from unnest($1::bigint[], $2::timestamptz[], $3::bigint[]) as u(key_id, hour, calls)
                 where exists (select 1 from api_keys k where k.id = u.key_id)
                 on conflict (key_id, hour) do update set calls = api_key_usage.calls + excluded.calls
                 returning key_id)
             update api_keys set last_used_at = now() where id in (select key_id from counted)",
        )
        .bind(&keys)
        .bind(&hours)
        .bind(&calls)
        .execute(pool)
        .await;
        if let Err(e) = result {
            let mut pending = self.pending.lock().unwrap_or_else(|p| p.into_inner());
            for (k, n) in batch {
                *pending.entry(k).or_default() += n;
            }
            return Err(e);
        }
        Ok(())
    }
}
