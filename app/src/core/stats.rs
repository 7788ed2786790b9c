//! An account's statistics, read from roll-ups kept as the work happens (see the migration
//! `20261125000001_stats_and_plans`): nothing here counts an account's memories or requests row
//! by row, so a page costs the same at a hundred memories and at a million.
//!
//! What each figure comes from:
//! - memories, storage, by sector, by project: `memory_counts`, kept by triggers on `memories`;
//! - memories created, tasks completed/failed and their POST → completed times, proxy requests
//!   and tokens: `usage_daily`, kept by triggers on `memories`, `tasks` and `proxy_requests`;
//! - API calls and searches (with their latency): counted in memory by each server process
//!   ([`DailyRecorder`]) and added to `usage_daily` in one statement a second. A figure read
//!   in the process that served the calls includes what it has not written yet; another
//!   process's calls appear once written (within about a second).
//!
//! Latencies are kept as 80-bucket histograms (see [`bucket`]): a median read from one is the
//! bucket's middle, within 9 % of the true median.
use std::collections::HashMap;
use std::sync::Mutex;

use chrono::{DateTime, Datelike, NaiveDate, Utc};
use sqlx::PgPool;

use super::error::AppResult;
use super::machines::human_size;
use super::time::iso;
use crate::types::{AccountStats, DailyUsage, ProjectSize, SectorCount, UsageHistory};

/// Buckets of a latency histogram.
pub const BUCKETS: usize = 80;

/// The bucket of a time in milliseconds: 0 under 1 ms, k ≥ 1 for [2^((k-1)/4), 2^(k/4)) ms, the
/// last one open-ended. The SQL function `hist_bucket` is the same rule.
pub fn bucket(ms: f64) -> usize {
    if ms.is_nan() || ms < 1.0 {
        0
    } else {
        ((4.0 * ms.log2()).floor() as usize + 1).min(BUCKETS - 1)
    }
}

/// The time a bucket stands for: its geometric middle.
fn bucket_ms(k: usize) -> f64 {
    if k == 0 {
        0.5
    } else {
        2f64.powf((k as f64 - 0.5) / 4.0)
    }
}

/// The `q` quantile (0 < q < 1) of a histogram, in milliseconds; `None` when it is empty.
pub fn quantile(hist: &[i32], q: f64) -> Option<f64> {
    let total: i64 = hist.iter().map(|&n| n.max(0) as i64).sum();
    if total == 0 {
        return None;
    }
    let rank = ((total as f64) * q).ceil().max(1.0) as i64;
    let mut seen = 0i64;
    for (k, &n) in hist.iter().enumerate() {
        seen += n.max(0) as i64;
        if seen >= rank {
            return Some((bucket_ms(k) * 100.0).round() / 100.0);
        }
    }
    None
}

/// Today, UTC.
pub fn today() -> NaiveDate {
    Utc::now().date_naive()
}

/// The first day of this month, UTC.
pub fn month_start(day: NaiveDate) -> NaiveDate {
    day.with_day(1).expect("day 1 exists")
}

/// One account's counts of one day, not yet written.
#[derive(Default, Clone)]
struct DayCounts {
    api_calls: i64,
    searches: i64,
    search_hist: Vec<i32>,
}

/// API calls and searches counted in memory and written to `usage_daily` in one statement (by
/// the server's flush loop), so a request never waits for a write to be counted.
#[derive(Default)]
pub struct DailyRecorder {
    pending: Mutex<HashMap<(i64, NaiveDate), DayCounts>>,
}

impl DailyRecorder {
    fn with<R>(&self, f: impl FnOnce(&mut HashMap<(i64, NaiveDate), DayCounts>) -> R) -> R {
        f(&mut self.pending.lock().unwrap_or_else(|p| p.into_inner()))
    }

    /// One call with an API key of `user_id`'s account.
    pub fn api_call(&self, user_id: i64) {
        self.with(|p| p.entry((user_id, today())).or_default().api_calls += 1);
    }

    /// One search that took `ms`.
    pub fn search(&self, user_id: i64, ms: f64) {
        self.with(|p| {
            let c = p.entry((user_id, today())).or_default();
            c.searches += 1;
            if c.search_hist.is_empty() {
                c.search_hist = vec![0; BUCKETS];
            }
            c.search_hist[bucket(ms)] += 1;
        });
    }

    /// Counts of `user_id` not yet written: API calls since `since`, and searches of `day`.
    pub fn unflushed(&self, user_id: i64, since: NaiveDate, day: NaiveDate) -> (i64, i64) {
        self.with(|p| {
            p.iter()
                .filter(|((u, d), _)| *u == user_id && *d >= since)
                .fold((0, 0), |(calls, searches), ((_, d), c)| {
                    (
                        calls + c.api_calls,
                        searches + if *d == day { c.searches } else { 0 },
                    )
                })
        })
    }

    /// The unwritten counts of `user_id` by day.
    fn unflushed_days(&self, user_id: i64) -> Vec<(NaiveDate, DayCounts)> {
        self.with(|p| {
            p.iter()
                .filter(|((u, _), _)| *u == user_id)
                .map(|((_, d), c)| (*d, c.clone()))
                .collect()
        })
    }

    /// Writes what was counted, in one statement; on failure it is kept for the next try.
    pub async fn flush(&self, pool: &PgPool) -> Result<(), sqlx::Error> {
        let mut batch: Vec<((i64, NaiveDate), DayCounts)> = self.with(|p| p.drain().collect());
        if batch.is_empty() {
            return Ok(());
        }
        batch.sort_by_key(|(k, _)| *k);
        let users: Vec<i64> = batch.iter().map(|((u, _), _)| *u).collect();
        let days: Vec<NaiveDate> = batch.iter().map(|((_, d), _)| *d).collect();
        let calls: Vec<i64> = batch.iter().map(|(_, c)| c.api_calls).collect();
        let searches: Vec<i64> = batch.iter().map(|(_, c)| c.searches).collect();
        let hists: Vec<String> = batch
            .iter()
            .map(|(_, c)| {
                let cells: Vec<String> = c.search_hist.iter().map(i32::to_string).collect();
                format!("{{{}}}", cells.join(","))
            })
            .collect();
        // Counts of a machine claimed meanwhile (by any process) go to its human, as the claim
        // moved the rest of its counts. Ordered by (account, day) like every other writer of
        // these rows: no deadlock.
        let result = sqlx::query(
            "insert into usage_daily (user_id, day, api_calls, searches, search_ms)
             select coalesce(m.claimed_by, m.id), u.day, sum(u.calls)::bigint,
                 sum(u.searches)::bigint, hist_sum(u.hist::int[])
             from unnest($1::bigint[], $2::date[], $3::bigint[], $4::bigint[], $5::text[])
                 as u(user_id, day, calls, searches, hist)
             join users m on m.id = u.user_id
             group by 1, 2 order by 1, 2
             on conflict (user_id, day) do update
                 set api_calls = usage_daily.api_calls + excluded.api_calls,
                     searches = usage_daily.searches + excluded.searches,
                     search_ms = hist_add(usage_daily.search_ms, excluded.search_ms)",
        )
        .bind(&users)
        .bind(&days)
        .bind(&calls)
        .bind(&searches)
        .bind(&hists)
        .execute(pool)
        .await;
        if let Err(e) = result {
            self.with(|p| {
                for (k, c) in batch {
                    let e = p.entry(k).or_default();
                    e.api_calls += c.api_calls;
                    e.searches += c.searches;
                    if !c.search_hist.is_empty() {
                        if e.search_hist.is_empty() {
                            e.search_hist = vec![0; BUCKETS];
                        }
                        for (a, b) in e.search_hist.iter_mut().zip(&c.search_hist) {
                            *a += b;
                        }
                    }
                }
            });
            return Err(e);
        }
        Ok(())
    }
}

/// The account's totals, by sector and by project (the ten largest).
pub async fn account(
    pool: &PgPool,
    recorder: &DailyRecorder,
    user_id: i64,
) -> AppResult<AccountStats> {
    let day = today();
    let month = month_start(day);
    type Totals = (
        DateTime<Utc>,
        String,
        i64,
        i64,
        i64,
        i64,
        i64,
        i64,
        i64,
        i64,
        i64,
    );
    let totals = sqlx::query_as::<_, Totals>(
        "select u.created_at, u.plan,
             (select coalesce(sum(memories), 0)::bigint from memory_counts where user_id = u.id),
             (select coalesce(sum(bytes), 0)::bigint from memory_counts where user_id = u.id),
             (select count(*) from projects where user_id = u.id),
             (select count(*) from conversations where user_id = u.id),
             (select count(*) from api_keys where user_id = u.id),
             (select count(*) from users m where m.claimed_by = u.id),
             (select coalesce(sum(api_calls), 0)::bigint from usage_daily where user_id = u.id and day = $2),
             (select coalesce(sum(api_calls), 0)::bigint from usage_daily where user_id = u.id and day >= $3),
             (select count(*) from tasks where user_id = u.id and status in ('pending', 'processing'))
         from users u where u.id = $1",
    )
    .bind(user_id)
    .bind(day)
    .bind(month)
    .fetch_optional(pool);
    let sectors = sqlx::query_as::<_, (String, i64)>(
        "select sector, sum(memories)::bigint from memory_counts where user_id = $1
         group by sector having sum(memories) > 0",
    )
    .bind(user_id)
    .fetch_all(pool);
    let projects = sqlx::query_as::<_, (String, String, i64, i64)>(
        "select p.id, p.name, coalesce(sum(c.memories), 0)::bigint, coalesce(sum(c.bytes), 0)::bigint
         from projects p left join memory_counts c on c.user_id = p.user_id and c.project_id = p.id
         where p.user_id = $1 group by p.id, p.name order by 3 desc, 2 limit 10",
    )
    .bind(user_id)
    .fetch_all(pool);
    let (totals, sectors, projects) = tokio::try_join!(totals, sectors, projects)?;
    let Some((
        created,
        plan,
        memories,
        bytes,
        projects_n,
        conversations,
        keys,
        machines,
        calls_today,
        calls_month,
        open_tasks,
    )) = totals
    else {
        return Err(super::error::AppError::not_found("Account"));
    };
    let (unflushed_month, _) = recorder.unflushed(user_id, month, day);
    let (unflushed_today, _) = recorder.unflushed(user_id, day, day);
    let by_sector: HashMap<String, i64> = sectors.into_iter().collect();
    let sectors = super::classify::SECTORS
        .iter()
        .map(|s| SectorCount {
            sector: s.to_string(),
            memories: by_sector.get(*s).copied().unwrap_or(0),
        })
        .collect();
    Ok(AccountStats {
        success: true,
        total_memories: memories,
        total_projects: projects_n,
        total_conversations: conversations,
        total_api_keys: keys,
        machines_claimed: machines,
        tasks_pending: open_tasks,
        storage_bytes: bytes,
        storage_used: human_size(bytes),
        api_calls_today: calls_today + unflushed_today,
        api_calls_this_month: calls_month + unflushed_month,
        account_created: iso(created),
        plan,
        sectors,
        top_projects: projects
            .into_iter()
            .map(|(id, name, memories, bytes)| ProjectSize {
                project_id: id,
                name,
                memories,
                storage_bytes: bytes,
            })
            .collect(),
    })
}

/// Most days a usage history covers.
pub const MAX_DAYS: i64 = 365;

/// Per day over the last `days` days (today included), oldest first; days without work are
/// zeros.
pub async fn history(
    pool: &PgPool,
    recorder: &DailyRecorder,
    user_id: i64,
    days: i64,
) -> AppResult<UsageHistory> {
    let days = days.clamp(1, MAX_DAYS);
    let last = today();
    let first = last - chrono::Duration::days(days - 1);
    type Row = (
        NaiveDate,
        i64,
        i64,
        i64,
        Vec<i32>,
        i64,
        i64,
        Vec<i32>,
        i64,
        i64,
        i64,
    );
    let rows: Vec<Row> = sqlx::query_as(
        "select d.day, coalesce(u.api_calls, 0), coalesce(u.memories_created, 0),
             coalesce(u.searches, 0), coalesce(u.search_ms, '{}'), coalesce(u.tasks_completed, 0),
             coalesce(u.tasks_failed, 0), coalesce(u.task_ms, '{}'), coalesce(u.proxy_requests, 0),
             coalesce(u.proxy_tokens_in, 0), coalesce(u.proxy_tokens_out, 0)
         from (select g::date as day from generate_series($2::date, $3::date, interval '1 day') g) d
         left join usage_daily u on u.user_id = $1 and u.day = d.day
         order by d.day",
    )
    .bind(user_id)
    .bind(first)
    .bind(last)
    .fetch_all(pool)
    .await?;
    let unflushed: HashMap<NaiveDate, DayCounts> =
        recorder.unflushed_days(user_id).into_iter().collect();
    let daily = rows
        .into_iter()
        .map(
            |(
                day,
                calls,
                created,
                searches,
                mut search_ms,
                done,
                failed,
                task_ms,
                proxied,
                tin,
                tout,
            )| {
                let local = unflushed.get(&day);
                let (calls, searches) = match local {
                    Some(c) => {
                        if !c.search_hist.is_empty() {
                            search_ms.resize(BUCKETS, 0);
                            for (a, b) in search_ms.iter_mut().zip(&c.search_hist) {
                                *a += b;
                            }
                        }
                        (calls + c.api_calls, searches + c.searches)
                    }
                    None => (calls, searches),
                };
                DailyUsage {
                    date: day.to_string(),
                    calls,
                    memories_created: created,
                    searches,
                    search_p50_ms: quantile(&search_ms, 0.5),
                    tasks_completed: done,
                    tasks_failed: failed,
                    task_p50_ms: quantile(&task_ms, 0.5),
                    proxy_requests: proxied,
                    tokens_in: tin,
                    tokens_out: tout,
                }
            },
        )
        .collect();
    Ok(UsageHistory {
        success: true,
        days,
        daily,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn buckets_follow_the_sql_rule() {
        assert_eq!(bucket(0.4), 0);
        assert_eq!(bucket(1.0), 1);
        assert_eq!(bucket(1.18), 1);
        assert_eq!(bucket(1.19), 2);
        assert_eq!(bucket(15.0), 16);
        assert_eq!(bucket(1e12), BUCKETS - 1);
    }

    #[test]
    fn the_median_is_within_a_bucket_of_the_truth() {
        for truth in [0.7, 3.0, 14.5, 120.0, 2500.0] {
            let mut h = vec![0; BUCKETS];
            h[bucket(truth)] += 5;
            h[bucket(truth / 10.0)] += 2;
            h[bucket(truth * 10.0)] += 2;
            let m = quantile(&h, 0.5).unwrap();
            assert!(
                (m - truth).abs() / truth < 0.1 || truth < 1.0,
                "{m} vs {truth}"
            );
        }
        assert_eq!(quantile(&[], 0.5), None);
        assert_eq!(quantile(&vec![0; BUCKETS], 0.5), None);
    }
}
