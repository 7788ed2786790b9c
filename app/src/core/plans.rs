//! Plans and their quotas.
//!
//! A plan is a row of `plans` (each quota a number, or null for unlimited); an account is on one
//! (`users.plan`, until `users.plan_until`, then back on the default plan). The operator defines
//! and assigns them (`engram plan …`), or a billing webhook moves an account ([`apply_event`]).
//!
//! # Enforcement without a round trip per request
//!
//! Each process keeps, per account it serves, the plan and each quota's use as read from the
//! roll-ups ([`Quotas`]), plus what it has let through since. A request is checked against that
//! in memory. The figures are read again:
//! - every 2 seconds for the accounts in use (one statement for all of them), right after this
//!   process's own counts are written;
//! - when an entry is 30 seconds old, or from another UTC day;
//! - when a plan changes (`NOTIFY engram_plans`, which every process listens for);
//! - before a refusal: a request the cached figures would refuse is checked against fresh ones
//!   first, so memories deleted, a plan raised, or a task failed are seen at once.
//!
//! Tolerance: one process never lets a quota be exceeded, however many requests race: each
//! request's work counts from the moment it is let through (in flight) until its write is in the
//! figures read, and a write finishing while they are read counts twice until the next read
//! (refusing early, never late). Several processes serving one account at once each keep to
//! the limit on their own, so together they can overshoot by what the others let through since
//! this one last read the figures: at most (processes − 1) × the limit, in practice about 2
//! seconds of that account's traffic (`server/tests/stats_and_plans.rs` measures both).
use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use chrono::{DateTime, Datelike, NaiveDate, TimeZone, Utc};
use sqlx::postgres::PgListener;
use sqlx::{PgExecutor, PgPool};

use super::error::{AppError, AppResult};
use super::stats::{month_start, today, DailyRecorder};
use super::time::{iso, iso_opt};
use crate::types::{Billing, PlanLimits, PlanView, QuotaUse, SubscriptionStatus};

/// The notification channel of plan changes.
pub const CHANGES_CHANNEL: &str = "engram_plans";

/// The quotas a plan sets.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Quota {
    Memories = 0,
    ApiCallsPerMonth = 1,
    SearchesPerDay = 2,
    ProxyTokensPerMonth = 3,
    Projects = 4,
    Machines = 5,
}

pub const QUOTAS: [Quota; 6] = [
    Quota::Memories,
    Quota::ApiCallsPerMonth,
    Quota::SearchesPerDay,
    Quota::ProxyTokensPerMonth,
    Quota::Projects,
    Quota::Machines,
];

impl Quota {
    /// The quota's key (API field, CLI option).
    pub fn key(self) -> &'static str {
        match self {
            Quota::Memories => "memories",
            Quota::ApiCallsPerMonth => "api_calls_per_month",
            Quota::SearchesPerDay => "searches_per_day",
            Quota::ProxyTokensPerMonth => "proxy_tokens_per_month",
            Quota::Projects => "projects",
            Quota::Machines => "machines",
        }
    }
    /// The quota in words.
    pub fn label(self) -> &'static str {
        match self {
            Quota::Memories => "memories stored",
            Quota::ApiCallsPerMonth => "API calls this month",
            Quota::SearchesPerDay => "searches today",
            Quota::ProxyTokensPerMonth => "proxy tokens this month",
            Quota::Projects => "projects",
            Quota::Machines => "machines claimed",
        }
    }
}

/// A plan as stored.
#[derive(Clone, Debug, PartialEq)]
pub struct Plan {
    pub name: String,
    pub display_name: String,
    pub price_label: String,
    pub limits: [Option<i64>; 6],
    pub is_default: bool,
}

impl Plan {
    pub fn view(&self) -> PlanView {
        let l = &self.limits;
        PlanView {
            name: self.name.clone(),
            display_name: self.display_name.clone(),
            price_label: self.price_label.clone(),
            limits: PlanLimits {
                memories: l[0],
                api_calls_per_month: l[1],
                searches_per_day: l[2],
                proxy_tokens_per_month: l[3],
                projects: l[4],
                machines: l[5],
            },
            is_default: self.is_default,
        }
    }
}

type PlanRow = (
    String,
    String,
    String,
    Option<i64>,
    Option<i64>,
    Option<i64>,
    Option<i64>,
    Option<i64>,
    Option<i64>,
    bool,
);

const PLAN_COLUMNS: &str = "p.name, p.display_name, p.price_label, p.memories, p.api_calls_per_month, p.searches_per_day, p.proxy_tokens_per_month, p.projects, p.machines, p.is_default";

fn plan_of(r: PlanRow) -> Plan {
    Plan {
        name: r.0,
        display_name: r.1,
        price_label: r.2,
        limits: [r.3, r.4, r.5, r.6, r.7, r.8],
        is_default: r.9,
    }
}

/// Every plan, the default first, then by name.
pub async fn list(db: impl PgExecutor<'_>) -> AppResult<Vec<Plan>> {
    let rows: Vec<PlanRow> = sqlx::query_as(sqlx::AssertSqlSafe(format!(
        "select {PLAN_COLUMNS} from plans p order by p.is_default desc, p.name"
    )))
    .fetch_all(db)
    .await?;
    Ok(rows.into_iter().map(plan_of).collect())
}

/// Whether `name` can name a plan: 1 to 64 of `a-z 0-9 _ -`, starting with a letter or digit.
pub fn valid_name(name: &str) -> bool {
    let mut chars = name.chars();
    matches!(chars.next(), Some(c) if c.is_ascii_lowercase() || c.is_ascii_digit())
        && name.len() <= 64
        && name
            .chars()
            .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '_' || c == '-')
}

/// Creates or replaces a plan (quotas omitted are unlimited); every process sees it at once.
pub async fn define(
    pool: &PgPool,
    name: &str,
    display_name: Option<&str>,
    price_label: Option<&str>,
    limits: [Option<i64>; 6],
) -> AppResult<Plan> {
    if !valid_name(name) {
        return Err(AppError::BadRequest(format!(
            "Invalid plan name {name:?}: 1 to 64 of a-z, 0-9, '_' and '-'"
        )));
    }
    if limits.iter().flatten().any(|&n| n < 0) {
        return Err(AppError::BadRequest("A quota cannot be negative".into()));
    }
    let display = display_name.map(str::to_string).unwrap_or_else(|| {
        let mut c = name.chars();
        c.next()
            .map(|f| f.to_uppercase().chain(c).collect())
            .unwrap_or_default()
    });
    let mut tx = pool.begin().await?;
    let row: PlanRow = sqlx::query_as(sqlx::AssertSqlSafe(format!(
        "insert into plans as p (name, display_name, price_label, memories, api_calls_per_month,
             searches_per_day, proxy_tokens_per_month, projects, machines)
         values ($1, $2, coalesce($3, ''), $4, $5, $6, $7, $8, $9)
         on conflict (name) do update set display_name = excluded.display_name,
             price_label = coalesce($3, p.price_label), memories = excluded.memories,
             api_calls_per_month = excluded.api_calls_per_month,
             searches_per_day = excluded.searches_per_day,
             proxy_tokens_per_month = excluded.proxy_tokens_per_month,
             projects = excluded.projects, machines = excluded.machines, updated_at = now()
         returning {PLAN_COLUMNS}"
    )))
    .bind(name)
    .bind(&display)
    .bind(price_label)
    .bind(limits[0])
    .bind(limits[1])
    .bind(limits[2])
    .bind(limits[3])
    .bind(limits[4])
    .bind(limits[5])
    .fetch_one(&mut *tx)
    .await?;
    notify(&mut *tx).await?;
    tx.commit().await?;
    Ok(plan_of(row))
}

/// Puts the account of `email` on `plan`, until `until` (then back on the default plan).
pub async fn assign(
    pool: &PgPool,
    email: &str,
    plan: &str,
    until: Option<DateTime<Utc>>,
) -> AppResult<i64> {
    let mut tx = pool.begin().await?;
    let exists: bool = sqlx::query_scalar("select exists (select 1 from plans where name = $1)")
        .bind(plan)
        .fetch_one(&mut *tx)
        .await?;
    if !exists {
        return Err(AppError::NotFound(format!("No plan named {plan:?}")));
    }
    let id: Option<i64> = sqlx::query_scalar(
        "update users set plan = $2, plan_until = $3 where email = lower($1) returning id",
    )
    .bind(email.trim())
    .bind(plan)
    .bind(until)
    .fetch_optional(&mut *tx)
    .await?;
    let id = id.ok_or_else(|| AppError::NotFound(format!("No account with e-mail {email:?}")))?;
    notify(&mut *tx).await?;
    tx.commit().await?;
    Ok(id)
}

/// Makes `name` the plan new accounts get (`ENGRAM_DEFAULT_PLAN`, at start-up).
pub async fn set_default(pool: &PgPool, name: &str) -> AppResult<()> {
    let mut tx = pool.begin().await?;
    let exists: bool = sqlx::query_scalar("select exists (select 1 from plans where name = $1)")
        .bind(name)
        .fetch_one(&mut *tx)
        .await?;
    if !exists {
        return Err(AppError::NotFound(format!(
            "ENGRAM_DEFAULT_PLAN names no plan: {name:?} (define it with `engram plan define {name} …`)"
        )));
    }
    let changed =
        sqlx::query("update plans set is_default = (name = $1) where is_default <> (name = $1)")
            .bind(name)
            .execute(&mut *tx)
            .await?;
    if changed.rows_affected() > 0 {
        notify(&mut *tx).await?;
    }
    tx.commit().await?;
    Ok(())
}

async fn notify(db: impl PgExecutor<'_>) -> AppResult<()> {
    sqlx::query("select pg_notify($1, '')")
        .bind(CHANGES_CHANNEL)
        .execute(db)
        .await?;
    Ok(())
}

/// One account's plan and use, as last read, and what this process let through since.
struct Entry {
    /// Which entry this is (a new one after the account's figures were forgotten), so a charge
    /// settles on the entry it was made on.
    id: u64,
    plan: Arc<Plan>,
    until: Option<DateTime<Utc>>,
    /// Each quota's use when read.
    base: [i64; 6],
    /// Work let through whose write has not finished (or failed) yet.
    inflight: [i64; 6],
    /// Work let through whose write has finished: a counter that only grows.
    completed: [i64; 6],
    /// `completed` when the figures were last read: what finished before is in `base`.
    completed_at_read: [i64; 6],
    day: NaiveDate,
    loaded: Instant,
    used: Instant,
}

impl Entry {
    /// Use as this process knows it: what was read, what finished since, what is under way.
    /// A write that finishes while the figures are being read counts in both `base` and
    /// `completed` until the next read: the error is always on the side of refusing.
    fn in_use(&self, i: usize) -> i64 {
        self.base[i] + (self.completed[i] - self.completed_at_read[i]) + self.inflight[i]
    }
}

/// What a read of the roll-ups says of one account.
struct Loaded {
    plan: Plan,
    until: Option<DateTime<Utc>>,
    used: [i64; 6],
}

/// An entry older than this is read again before use.
const STALE_AFTER: Duration = Duration::from_secs(30);
/// Entries unused this long are dropped at a refresh.
const IDLE_AFTER: Duration = Duration::from_secs(600);

/// The plans and quota use of the accounts this process serves (see the module's doc).
#[derive(Default)]
pub struct Quotas {
    entries: Mutex<HashMap<i64, Entry>>,
    /// Reads and this process's writes of the counts take turns, so a read never misses a
    /// batch being written.
    io: tokio::sync::Mutex<()>,
    next_id: std::sync::atomic::AtomicU64,
    /// When a read last failed (the database unreachable): reads that were waiting their turn
    /// meanwhile answer 503 at once instead of each waiting for a connection in turn.
    failed: Mutex<Option<Instant>>,
}

/// Work a quota let through: `done` once its write has finished; dropped without it (the
/// work failed, or never happened), it is given back.
#[must_use = "a charge is given back when dropped: call `done` once the work is written"]
pub struct Charge {
    quotas: Arc<Quotas>,
    user_id: i64,
    quota: Quota,
    n: i64,
    entry: u64,
    settled: bool,
}

impl Charge {
    /// The work is written: it counts.
    pub fn done(self) {
        let n = self.n;
        self.done_with(n);
    }

    /// The work is written and came to `actual` (the tokens a proxied reply really used).
    pub fn done_with(mut self, actual: i64) {
        self.settle(Some(actual));
    }

    fn settle(&mut self, completed: Option<i64>) {
        if self.settled {
            return;
        }
        self.settled = true;
        if self.n == 0 && completed.unwrap_or(0) == 0 {
            return;
        }
        let mut entries = self.quotas.lock();
        if let Some(e) = entries
            .get_mut(&self.user_id)
            .filter(|e| e.id == self.entry)
        {
            let i = self.quota as usize;
            e.inflight[i] -= self.n;
            if let Some(c) = completed {
                e.completed[i] += c;
            }
        }
    }
}

impl Drop for Charge {
    fn drop(&mut self) {
        self.settle(None);
    }
}

/// The 402 of a quota.
fn refusal(plan: &Plan, quota: Quota, used: i64, adding: i64, limit: i64) -> AppError {
    let request = if adding > 1 {
        format!(" (this request adds {adding})")
    } else {
        String::new()
    };
    let hint = match quota {
        Quota::Memories => " Delete memories or move to a larger plan.",
        Quota::SearchesPerDay => {
            " The count starts again at midnight UTC, or move to a larger plan."
        }
        Quota::ApiCallsPerMonth | Quota::ProxyTokensPerMonth => {
            " The count starts again on the 1st of next month, or move to a larger plan."
        }
        Quota::Projects => " Delete a project or move to a larger plan.",
        Quota::Machines => " Move to a larger plan to claim more machines.",
    };
    AppError::PaymentRequired(format!(
        "Quota exceeded: {} {used} of {limit} on the {} plan ({}){request}.{hint}",
        quota.label(),
        plan.display_name,
        plan.name
    ))
}

impl Quotas {
    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<i64, Entry>> {
        self.entries.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Checks the cached figures: `None` when there are none fit to use; else the entry the
    /// charge was made on, or the refusal.
    fn try_charge(&self, user_id: i64, quota: Quota, n: i64) -> Option<AppResult<u64>> {
        let mut entries = self.lock();
        let e = entries.get_mut(&user_id)?;
        if e.loaded.elapsed() > STALE_AFTER || e.day != today() {
            return None;
        }
        e.used = Instant::now();
        let i = quota as usize;
        if let Some(limit) = e.plan.limits[i] {
            let used = e.in_use(i);
            if n > 0 && used + n > limit {
                return Some(Err(refusal(&e.plan, quota, used, n, limit)));
            }
        }
        e.inflight[i] += n;
        Some(Ok(e.id))
    }

    /// Lets `n` of `quota` through for the account, or answers 402 when that would exceed its
    /// plan (nothing counted then). A database round trip only when the account's figures are
    /// not in memory, or before a refusal (see the module's doc). The answer is a [`Charge`]:
    /// call `done` once the work is written.
    pub async fn charge(
        self: &Arc<Self>,
        pool: &PgPool,
        recorder: &DailyRecorder,
        user_id: i64,
        quota: Quota,
        n: i64,
    ) -> AppResult<Charge> {
        let charge = |entry| Charge {
            quotas: self.clone(),
            user_id,
            quota,
            n,
            entry,
            settled: false,
        };
        // Refused by the cached figures, or none: read them fresh and decide on those.
        if let Some(Ok(entry)) = self.try_charge(user_id, quota, n) {
            return Ok(charge(entry));
        }
        self.load(pool, recorder, &[user_id]).await?;
        match self.try_charge(user_id, quota, n) {
            Some(Ok(entry)) => Ok(charge(entry)),
            Some(Err(e)) => Err(e),
            // The account vanished meanwhile: nothing to hold it to.
            None => Ok(charge(u64::MAX)),
        }
    }

    /// Forgets every account's figures (a plan changed).
    pub fn forget_all(&self) {
        self.lock().clear();
    }

    /// Forgets one account's figures.
    pub fn forget(&self, user_id: i64) {
        self.lock().remove(&user_id);
    }

    /// Reads the figures of these accounts (one statement) and keeps them. Requests that find
    /// an account's figures missing at once (a new account's first burst) wait for one read:
    /// figures read while this call waited for its turn are not read again.
    async fn load(&self, pool: &PgPool, recorder: &DailyRecorder, ids: &[i64]) -> AppResult<()> {
        let asked = Instant::now();
        let _turn = self.io.lock().await;
        if self
            .failed
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .is_some_and(|f| f >= asked)
        {
            return Err(AppError::Unavailable);
        }
        let ids: Vec<i64> = {
            let entries = self.lock();
            ids.iter()
                .copied()
                .filter(|id| entries.get(id).is_none_or(|e| e.loaded < asked))
                .collect()
        };
        if ids.is_empty() {
            return Ok(());
        }
        let ids = &ids[..];
        // What had finished before the read is in it (or, finishing during it, counted twice
        // until the next read: never too little).
        let before: HashMap<i64, (u64, [i64; 6])> = {
            let entries = self.lock();
            ids.iter()
                .filter_map(|id| entries.get(id).map(|e| (*id, (e.id, e.completed))))
                .collect()
        };
        let loaded = match read(pool, recorder, ids).await {
            Ok(loaded) => loaded,
            Err(e) => {
                *self.failed.lock().unwrap_or_else(|p| p.into_inner()) = Some(Instant::now());
                return Err(e);
            }
        };
        let now = Instant::now();
        let day = today();
        let mut entries = self.lock();
        for (id, l) in loaded {
            // Entries are made only here, under `io`: one present now is the one seen before
            // the read, unless it was forgotten meanwhile (then a new one starts from zero).
            match entries
                .get_mut(&id)
                .filter(|e| before.get(&id).map(|b| b.0) == Some(e.id))
            {
                Some(e) => {
                    e.plan = Arc::new(l.plan);
                    e.until = l.until;
                    e.base = l.used;
                    e.completed_at_read = before[&id].1;
                    e.day = day;
                    e.loaded = now;
                }
                None => {
                    let fresh = self
                        .next_id
                        .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                    entries.insert(
                        id,
                        Entry {
                            id: fresh,
                            plan: Arc::new(l.plan),
                            until: l.until,
                            base: l.used,
                            inflight: [0; 6],
                            completed: [0; 6],
                            completed_at_read: [0; 6],
                            day,
                            loaded: now,
                            used: now,
                        },
                    );
                }
            }
        }
        Ok(())
    }

    /// Writes this process's counts, then reads again the figures of the accounts in use (and
    /// drops those unused for 10 minutes). The server calls it every 2 seconds.
    pub async fn refresh(&self, pool: &PgPool, recorder: &DailyRecorder) -> AppResult<()> {
        {
            let _turn = self.io.lock().await;
            if let Err(e) = recorder.flush(pool).await {
                tracing::warn!(error = %e, "writing usage counts failed, kept for the next try");
            }
        }
        let ids: Vec<i64> = {
            let mut entries = self.lock();
            entries.retain(|_, e| e.used.elapsed() < IDLE_AFTER);
            entries.keys().copied().collect()
        };
        if ids.is_empty() {
            return Ok(());
        }
        self.load(pool, recorder, &ids).await
    }

    /// The account's plan and every quota's use, read fresh.
    pub async fn status(
        &self,
        pool: &PgPool,
        recorder: &DailyRecorder,
        billing: &Billing,
        user_id: i64,
    ) -> AppResult<SubscriptionStatus> {
        self.load(pool, recorder, &[user_id]).await?;
        let (plan, until, used) = {
            let entries = self.lock();
            let e = entries
                .get(&user_id)
                .ok_or_else(|| AppError::not_found("Account"))?;
            let used: [i64; 6] = std::array::from_fn(|i| e.in_use(i));
            (e.plan.clone(), e.until, used)
        };
        let day = today();
        let (period_start, period_end) = month_bounds(day);
        let midnight = Utc.from_utc_datetime(
            &(day + chrono::Duration::days(1))
                .and_hms_opt(0, 0, 0)
                .expect("midnight"),
        );
        let quotas = QUOTAS
            .iter()
            .map(|&q| {
                let limit = plan.limits[q as usize];
                let used = used[q as usize];
                QuotaUse {
                    quota: q.key().into(),
                    label: q.label().into(),
                    used,
                    limit,
                    remaining: limit.map(|l| (l - used).max(0)),
                    resets_at: match q {
                        Quota::ApiCallsPerMonth | Quota::ProxyTokensPerMonth => {
                            Some(iso(period_end))
                        }
                        Quota::SearchesPerDay => Some(iso(midnight)),
                        _ => None,
                    },
                }
            })
            .collect();
        Ok(SubscriptionStatus {
            success: true,
            plan: plan.view(),
            plan_until: iso_opt(until),
            period_start: iso(period_start),
            period_end: iso(period_end),
            quotas,
            plans: list(pool).await?.iter().map(Plan::view).collect(),
            billing: billing.clone(),
        })
    }

    /// Listens for plan changes until the pool closes (a task of its own).
    pub fn listen(self: &Arc<Self>, pool: PgPool) {
        let quotas = Arc::downgrade(self);
        tokio::spawn(async move {
            while !pool.is_closed() {
                match subscribe(&pool).await {
                    Ok(mut listener) => loop {
                        let got = listener.try_recv().await;
                        let Some(this) = quotas.upgrade() else { return };
                        // A change, or a connection re-established (a change may be missed).
                        this.forget_all();
                        if got.is_err() {
                            break;
                        }
                    },
                    Err(e) => {
                        if !pool.is_closed() {
                            tracing::warn!(error = %e, "cannot listen for plan changes; retrying");
                        }
                    }
                }
                if quotas.strong_count() == 0 {
                    return;
                }
                tokio::time::sleep(Duration::from_secs(1)).await;
            }
        });
    }
}

/// The account's plan and quotas as the API and the portal show them, read fresh.
pub async fn subscription(
    state: &super::state::AppState,
    user_id: i64,
) -> AppResult<SubscriptionStatus> {
    state
        .quotas
        .status(
            &state.pool,
            &state.stats,
            &state.settings.billing.view(),
            user_id,
        )
        .await
}

async fn subscribe(pool: &PgPool) -> Result<PgListener, sqlx::Error> {
    let mut listener = PgListener::connect_with(pool).await?;
    listener.listen(CHANGES_CHANNEL).await?;
    Ok(listener)
}

/// The 1st of this month and of the next, midnight UTC.
fn month_bounds(day: NaiveDate) -> (DateTime<Utc>, DateTime<Utc>) {
    let start = month_start(day);
    let next = if start.month() == 12 {
        NaiveDate::from_ymd_opt(start.year() + 1, 1, 1)
    } else {
        NaiveDate::from_ymd_opt(start.year(), start.month() + 1, 1)
    }
    .expect("a month's first day");
    let at = |d: NaiveDate| Utc.from_utc_datetime(&d.and_hms_opt(0, 0, 0).expect("midnight"));
    (at(start), at(next))
}

/// The plan and each quota's use of these accounts, in one statement. A claimed machine's work
/// is its human's: its memories, tasks and keys moved there, and so did its daily counts.
async fn read(
    pool: &PgPool,
    recorder: &DailyRecorder,
    ids: &[i64],
) -> AppResult<Vec<(i64, Loaded)>> {
    let day = today();
    let month = month_start(day);
    #[derive(sqlx::FromRow)]
    struct Row {
        id: i64,
        until: Option<DateTime<Utc>>,
        name: String,
        display_name: String,
        price_label: String,
        memories: Option<i64>,
        api_calls_per_month: Option<i64>,
        searches_per_day: Option<i64>,
        proxy_tokens_per_month: Option<i64>,
        projects: Option<i64>,
        machines: Option<i64>,
        is_default: bool,
        used_memories: i64,
        used_calls: i64,
        used_searches: i64,
        used_tokens: i64,
        used_projects: i64,
        used_machines: i64,
    }
    let rows: Vec<Row> = sqlx::query_as(sqlx::AssertSqlSafe(format!(
        "with a as (
             select u.id, u.plan_until,
                 case when u.plan_until is not null and u.plan_until <= now() then default_plan()
                      else u.plan end as plan
             from users u where u.id = any($1))
         select a.id, case when a.plan_until > now() then a.plan_until end as until, {PLAN_COLUMNS},
             (select coalesce(sum(c.memories), 0) from memory_counts c where c.user_id = a.id)::bigint
                 + (select count(*) from tasks t where t.user_id = a.id and t.status in ('pending', 'processing')) as used_memories,
             (select coalesce(sum(d.api_calls), 0) from usage_daily d where d.user_id = a.id and d.day >= $2)::bigint as used_calls,
             (select coalesce(sum(d.searches), 0) from usage_daily d where d.user_id = a.id and d.day = $3)::bigint as used_searches,
             (select coalesce(sum(d.proxy_tokens_in + d.proxy_tokens_out), 0) from usage_daily d
                 where d.user_id = a.id and d.day >= $2)::bigint as used_tokens,
             (select count(*) from projects pr where pr.user_id = a.id) as used_projects,
             (select count(*) from users m where m.claimed_by = a.id) as used_machines
         from a join plans p on p.name = a.plan"
    )))
    .bind(ids)
    .bind(month)
    .bind(day)
    .fetch_all(pool)
    .await?;
    Ok(rows
        .into_iter()
        .map(|r| {
            let (calls, searches) = recorder.unflushed(r.id, month, day);
            (
                r.id,
                Loaded {
                    plan: Plan {
                        name: r.name,
                        display_name: r.display_name,
                        price_label: r.price_label,
                        limits: [
                            r.memories,
                            r.api_calls_per_month,
                            r.searches_per_day,
                            r.proxy_tokens_per_month,
                            r.projects,
                            r.machines,
                        ],
                        is_default: r.is_default,
                    },
                    until: r.until,
                    used: [
                        r.used_memories,
                        r.used_calls + calls,
                        r.used_searches + searches,
                        r.used_tokens,
                        r.used_projects,
                        r.used_machines,
                    ],
                },
            )
        })
        .collect())
}

// ---------------------------------------------------------------------------------------------
// The billing webhook: Stripe's signature scheme, events that move an account between plans.

/// How far a signature's timestamp may be from now.
pub const SIGNATURE_TOLERANCE_SECS: i64 = 300;

/// Checks a `Stripe-Signature` header (`t=…,v1=…[,v1=…]`): HMAC-SHA256 with `secret` over
/// `"{t}.{payload}"`, hex, compared in constant time; the timestamp within 5 minutes of `now`.
pub fn verify_signature(
    secret: &[u8],
    header: &str,
    payload: &[u8],
    now: i64,
) -> Result<(), &'static str> {
    use hmac::{Hmac, Mac};
    let mut timestamp = None;
    let mut signatures = vec![];
    for part in header.split(',') {
        match part.trim().split_once('=') {
            Some(("t", t)) => timestamp = t.parse::<i64>().ok(),
            Some(("v1", s)) => signatures.extend(hex::decode(s).ok()),
            _ => {}
        }
    }
    let t = timestamp.ok_or("Stripe-Signature has no timestamp")?;
    if signatures.is_empty() {
        return Err("Stripe-Signature has no v1 signature");
    }
    if (i128::from(now) - i128::from(t)).abs() > i128::from(SIGNATURE_TOLERANCE_SECS) {
        return Err("Stripe-Signature's timestamp is outside the 5-minute tolerance");
    }
    for signature in signatures {
        let mut mac = Hmac::<sha2::Sha256>::new_from_slice(secret).map_err(|_| "bad secret")?;
        mac.update(t.to_string().as_bytes());
        mac.update(b".");
        mac.update(payload);
        if mac.verify_slice(&signature).is_ok() {
            return Ok(());
        }
    }
    Err("Stripe-Signature does not match the payload")
}

/// `Stripe-Signature` for `payload` at `t` (for tests and for operators trying the webhook).
pub fn sign(secret: &[u8], payload: &[u8], t: i64) -> String {
    use hmac::{Hmac, Mac};
    let mut mac = Hmac::<sha2::Sha256>::new_from_slice(secret).expect("any key length");
    mac.update(t.to_string().as_bytes());
    mac.update(b".");
    mac.update(payload);
    format!("t={t},v1={}", hex::encode(mac.finalize().into_bytes()))
}

/// What a webhook event did.
#[derive(Debug, Clone, PartialEq)]
pub enum EventOutcome {
    /// The account was moved to the plan.
    Applied { user_id: i64, plan: String },
    /// An event type that moves nothing (recorded, so a replay is refused too).
    Ignored,
}

/// Applies a verified event: `checkout.session.completed`, `customer.subscription.created` and
/// `.updated` put the account named by `data.object.metadata.email` (or `customer_email`, or
/// `customer_details.email`) on the plan named by `data.object.metadata.plan`, until
/// `data.object.current_period_end` when given; `customer.subscription.deleted` puts it back on
/// the default plan. An event id seen before is refused (409), whatever its type.
pub async fn apply_event(pool: &PgPool, event: &serde_json::Value) -> AppResult<EventOutcome> {
    let id = event["id"]
        .as_str()
        .filter(|s| !s.is_empty() && s.len() <= 255)
        .ok_or_else(|| AppError::BadRequest("The event has no id".into()))?;
    let kind = event["type"].as_str().unwrap_or_default();
    let object = &event["data"]["object"];
    let moves = matches!(
        kind,
        "checkout.session.completed"
            | "customer.subscription.created"
            | "customer.subscription.updated"
            | "customer.subscription.deleted"
    );
    let mut tx = pool.begin().await?;
    let fresh: Option<String> = sqlx::query_scalar(
        "insert into billing_events (id, type) values ($1, $2) on conflict (id) do nothing returning id",
    )
    .bind(id)
    .bind(kind)
    .fetch_optional(&mut *tx)
    .await?;
    if fresh.is_none() {
        return Err(AppError::Conflict(format!(
            "Event {id} was already processed"
        )));
    }
    if !moves {
        tx.commit().await?;
        return Ok(EventOutcome::Ignored);
    }
    let email = [
        &object["metadata"]["email"],
        &object["customer_email"],
        &object["customer_details"]["email"],
    ]
    .into_iter()
    .find_map(|v| v.as_str().filter(|s| !s.is_empty()))
    .ok_or_else(|| {
        AppError::BadRequest("The event names no account (data.object.metadata.email)".into())
    })?;
    let (plan, until) = if kind == "customer.subscription.deleted" {
        let default: String = sqlx::query_scalar("select default_plan()")
            .fetch_one(&mut *tx)
            .await?;
        (default, None)
    } else {
        let plan = object["metadata"]["plan"]
            .as_str()
            .filter(|s| !s.is_empty())
            .ok_or_else(|| {
                AppError::BadRequest("The event names no plan (data.object.metadata.plan)".into())
            })?
            .to_string();
        let until = object["current_period_end"]
            .as_i64()
            .and_then(|s| Utc.timestamp_opt(s, 0).single());
        (plan, until)
    };
    let known: bool = sqlx::query_scalar("select exists (select 1 from plans where name = $1)")
        .bind(&plan)
        .fetch_one(&mut *tx)
        .await?;
    if !known {
        return Err(AppError::BadRequest(format!("No plan named {plan:?}")));
    }
    let user_id: Option<i64> = sqlx::query_scalar(
        "update users set plan = $2, plan_until = $3 where email = lower($1) returning id",
    )
    .bind(email.trim())
    .bind(&plan)
    .bind(until)
    .fetch_optional(&mut *tx)
    .await?;
    let user_id =
        user_id.ok_or_else(|| AppError::BadRequest(format!("No account with e-mail {email:?}")))?;
    sqlx::query("update billing_events set user_id = $2, plan = $3 where id = $1")
        .bind(id)
        .bind(user_id)
        .bind(&plan)
        .execute(&mut *tx)
        .await?;
    notify(&mut *tx).await?;
    tx.commit().await?;
    Ok(EventOutcome::Applied { user_id, plan })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_signature_is_checked_against_payload_secret_and_time() {
        let secret = b"whsec_test";
        let payload = br#"{"id":"evt_1"}"#;
        let header = sign(secret, payload, 1_000_000);
        assert_eq!(
            verify_signature(secret, &header, payload, 1_000_100),
            Ok(())
        );
        assert!(verify_signature(secret, &header, payload, 1_000_301).is_err());
        assert!(verify_signature(b"other", &header, payload, 1_000_000).is_err());
        assert!(verify_signature(secret, &header, br#"{"id":"evt_2"}"#, 1_000_000).is_err());
        assert!(verify_signature(secret, "v1=00", payload, 1_000_000).is_err());
        assert!(verify_signature(secret, "t=1000000", payload, 1_000_000).is_err());
        let extreme = format!("t={},v1=00", i64::MIN);
        assert!(verify_signature(secret, &extreme, payload, 1_000_000).is_err());
    }

    #[test]
    fn plan_names() {
        assert!(valid_name("free"));
        assert!(valid_name("team-10"));
        assert!(!valid_name("Free"));
        assert!(!valid_name("-x"));
        assert!(!valid_name(""));
    }

    #[test]
    fn months_end_on_the_next_first() {
        let (s, e) = month_bounds(NaiveDate::from_ymd_opt(2026, 12, 14).unwrap());
        assert_eq!(iso(s), "2026-12-01T00:00:00.000Z");
        assert_eq!(iso(e), "2027-01-01T00:00:00.000Z");
    }
}
