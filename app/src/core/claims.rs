//! Claiming a machine account into a human account by an e-mailed six-digit code.
//!
//! One live claim per machine (a new init replaces it); the code is random, stored hashed, lives
//! 15 minutes, and the fifth wrong code voids the claim. The merge moves projects, memories,
//! tasks and keys in one transaction; the machine's `default` project merges into the human's.
//!
//! Guessing is bounded by counts that outlive a claim (`claim_attempts`, shared by every process):
//! wrong codes per machine per day and, through the agents API, per e-mail per day; inits per
//! machine and per e-mail per hour (so the owner of an address is never mailed more codes than
//! that). Each is a setting ([`ClaimLimits`]); over one, 429 with the seconds until the oldest
//! counted attempt leaves its window. Per machine, the machine's user row is locked first, then
//! the e-mail's advisory lock, so concurrent attempts count exactly.
use chrono::{DateTime, Duration, Utc};
use sqlx::{PgConnection, PgPool};

use super::crypto;
use super::error::{AppError, AppResult};
use super::machines;
use super::mail::{self, ClaimMail};
use super::state::{ClaimLimits, Settings};
use super::time::iso;

/// Wrong codes that void a claim.
pub const MAX_WRONG_CODES: i32 = 5;

/// The answer of claim/init.
#[derive(Debug, serde::Serialize, utoipa::ToSchema)]
pub struct ClaimStarted {
    pub expires_at: String,
    /// Only without a mail transport (local development).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub verification_code: Option<String>,
}

pub use crate::types::PendingClaim;

fn code_hash(machine_id: i64, code: &str) -> Vec<u8> {
    crypto::sha256(&format!("{machine_id}:{code}"))
}

const HOUR: i64 = 3600;
const DAY: i64 = 24 * 3600;

/// What a limit counts.
#[derive(Clone, Copy)]
enum Kind {
    Init,
    WrongCode,
}

impl Kind {
    fn as_str(self) -> &'static str {
        match self {
            Kind::Init => "init",
            Kind::WrongCode => "wrong_code",
        }
    }
}

/// Whom a limit counts for.
#[derive(Clone, Copy)]
enum Subject<'a> {
    Machine(i64),
    /// An e-mail, counting only attempts through the agents API.
    Email(&'a str),
}

/// `Some(seconds to wait)` when `limit` attempts of `kind` already fall in the last `window`
/// seconds.
async fn over_limit(
    db: &mut PgConnection,
    subject: Subject<'_>,
    kind: Kind,
    limit: u32,
    window: i64,
) -> AppResult<Option<u64>> {
    let query = match subject {
        Subject::Machine(_) => "select extract(epoch from at + make_interval(secs => $3) - now())::float8 from claim_attempts
             where machine_id = $1 and kind = $2 and at > now() - make_interval(secs => $3)
             order by at desc offset $4 limit 1",
        Subject::Email(_) => "select extract(epoch from at + make_interval(secs => $3) - now())::float8 from claim_attempts
             where email = $1 and kind = $2 and by_agent and at > now() - make_interval(secs => $3)
             order by at desc offset $4 limit 1",
    };
    let q = sqlx::query_scalar::<_, f64>(query);
    let q = match subject {
        Subject::Machine(id) => q.bind(id),
        Subject::Email(email) => q.bind(email),
    };
    let wait: Option<f64> = q
        .bind(kind.as_str())
        .bind(window as f64)
        .bind(i64::from(limit.max(1)) - 1)
        .fetch_optional(db)
        .await?;
    Ok(wait.map(|w| (w.ceil() as u64).max(1)))
}

async fn record(
    db: &mut PgConnection,
    machine_id: i64,
    email: &str,
    kind: Kind,
    by_agent: bool,
) -> AppResult<()> {
    sqlx::query(
        "insert into claim_attempts (machine_id, email, kind, by_agent) values ($1, $2, $3, $4)",
    )
    .bind(machine_id)
    .bind(email)
    .bind(kind.as_str())
    .bind(by_agent)
    .execute(db)
    .await?;
    Ok(())
}

/// Serializes the attempts of one machine and one e-mail (in that order, everywhere).
async fn lock(db: &mut PgConnection, machine_id: i64, email: &str) -> AppResult<()> {
    sqlx::query("select 1 from users where id = $1 for update")
        .bind(machine_id)
        .execute(&mut *db)
        .await?;
    sqlx::query("select pg_advisory_xact_lock(hashtextextended('claim:' || $1, 0))")
        .bind(email)
        .execute(&mut *db)
        .await?;
    Ok(())
}

fn refused(message: &str, retry_after_secs: u64) -> AppError {
    AppError::RateLimited {
        message: message.into(),
        retry_after_secs,
    }
}

const WRONG_PER_MACHINE: &str =
    "Too many wrong verification codes for this machine today: try again later";
const WRONG_PER_EMAIL: &str = "Too many wrong verification codes for this account today: the account's owner can still enter the code on the portal's claim page";

/// The wrong-code limits that apply to a machine and an e-mail.
async fn wrong_code_limit(
    db: &mut PgConnection,
    limits: &ClaimLimits,
    machine_id: i64,
    email: &str,
    by_agent: bool,
) -> AppResult<Option<AppError>> {
    if let Some(wait) = over_limit(
        db,
        Subject::Machine(machine_id),
        Kind::WrongCode,
        limits.wrong_per_machine_per_day,
        DAY,
    )
    .await?
    {
        return Ok(Some(refused(WRONG_PER_MACHINE, wait)));
    }
    if by_agent {
        if let Some(wait) = over_limit(
            db,
            Subject::Email(email),
            Kind::WrongCode,
            limits.wrong_per_email_per_day,
            DAY,
        )
        .await?
        {
            return Ok(Some(refused(WRONG_PER_EMAIL, wait)));
        }
    }
    Ok(None)
}

async fn counts(db: &mut PgConnection, machine_id: i64) -> AppResult<(i64, i64)> {
    Ok(sqlx::query_as("select (select count(*) from projects where user_id = $1), (select count(*) from memories where user_id = $1)")
        .bind(machine_id)
        .fetch_one(db)
        .await?)
}

/// Starts (or restarts) the claim of a machine by the account of `email`, and mails the code.
pub async fn init(
    pool: &PgPool,
    settings: &Settings,
    fingerprint: &str,
    email: &str,
) -> AppResult<ClaimStarted> {
    let email = email.to_lowercase();
    let limits = &settings.limits.claims;
    let mut tx = pool.begin().await?;
    let (machine_id, claimed_by, _, hostname, platform) = machines::find(&mut *tx, fingerprint)
        .await?
        .ok_or_else(|| AppError::not_found("Machine"))?;
    if claimed_by.is_some() {
        return Err(AppError::Conflict("Machine already claimed".into()));
    }
    lock(&mut tx, machine_id, &email).await?;
    if let Some(refusal) = wrong_code_limit(&mut tx, limits, machine_id, &email, true).await? {
        return Err(refusal);
    }
    for (subject, limit, message) in [
        (
            Subject::Machine(machine_id),
            limits.init_per_machine_per_hour,
            "Too many claims started for this machine: try again later",
        ),
        (
            Subject::Email(&email),
            limits.init_per_email_per_hour,
            "Too many claims started for this e-mail: try again later",
        ),
    ] {
        if let Some(wait) = over_limit(&mut tx, subject, Kind::Init, limit, HOUR).await? {
            return Err(refused(message, wait));
        }
    }
    // Counted before the address is looked up: probing unknown addresses spends the same budget.
    record(&mut tx, machine_id, &email, Kind::Init, true).await?;
    sqlx::query("delete from claim_attempts where at < now() - interval '1 day'")
        .execute(&mut *tx)
        .await?;
    let human_id: Option<i64> =
        sqlx::query_scalar("select id from users where email = $1 and not is_machine")
            .bind(&email)
            .fetch_optional(&mut *tx)
            .await?;
    let Some(human_id) = human_id else {
        tx.commit().await?;
        return Err(AppError::not_found("User"));
    };
    let code = crypto::new_verification_code();
    let expires_at = Utc::now() + Duration::seconds(settings.claim_ttl_secs);
    sqlx::query(
        "insert into claims (machine_id, human_id, code_hash, expires_at) values ($1, $2, $3, $4)
         on conflict (machine_id) do update set human_id = excluded.human_id, code_hash = excluded.code_hash,
             expires_at = excluded.expires_at, failed_attempts = 0, created_at = now()",
    )
    .bind(machine_id)
    .bind(human_id)
    .bind(code_hash(machine_id, &code))
    .bind(expires_at)
    .execute(&mut *tx)
    .await?;
    let (projects, memories) = counts(&mut tx, machine_id).await?;
    let message = ClaimMail {
        code: code.clone(),
        hostname: hostname.unwrap_or_else(|| "unnamed machine".into()),
        platform: platform.unwrap_or_else(|| "unknown platform".into()),
        projects,
        memories,
        link: format!(
            "{}/claim?machine={machine_id}",
            settings.public_url.trim_end_matches('/')
        ),
        expires_minutes: settings.claim_ttl_secs / 60,
    };
    // The message is written (dev mailbox) or sent before the claim is committed: a claim whose
    // code could not be delivered does not stay live.
    mail::send_claim_code(&mut tx, settings, &email, &message).await?;
    tx.commit().await?;
    Ok(ClaimStarted {
        expires_at: iso(expires_at),
        verification_code: settings.smtp_url.is_none().then_some(code),
    })
}

/// Which claim a verification names.
pub enum ClaimRef<'a> {
    /// By the machine's fingerprint (the agents API).
    Fingerprint(&'a str),
    /// By machine id, for the logged-in human (the portal): only the account the claim names.
    ForHuman { machine_id: i64, human_id: i64 },
}

/// Checks the code and merges the machine into the human account. Wrong codes count, and the
/// fifth voids the claim (429); past the day's wrong codes for the machine (or, through the
/// agents API, for the e-mail) no code is checked at all (429). The machine's keys act for the
/// human from the answer on: the key cache forgets them once the merge commits.
pub async fn verify(
    state: &super::state::AppState,
    claim: ClaimRef<'_>,
    code: &str,
) -> AppResult<i64> {
    let (pool, limits, keys) = (&state.pool, &state.settings.limits.claims, &state.keys);
    let invalid = || AppError::BadRequest("Invalid or expired verification code".into());
    let mut tx = pool.begin().await?;
    let machine_id = match claim {
        ClaimRef::Fingerprint(fp) => {
            machines::find(&mut *tx, fp)
                .await?
                .ok_or_else(|| AppError::not_found("Machine"))?
                .0
        }
        ClaimRef::ForHuman { machine_id, .. } => machine_id,
    };
    let by_agent = matches!(claim, ClaimRef::Fingerprint(_));
    // Out of guesses for the day: answered before anything else, claim or not.
    if let Some(wait) = over_limit(
        &mut tx,
        Subject::Machine(machine_id),
        Kind::WrongCode,
        limits.wrong_per_machine_per_day,
        DAY,
    )
    .await?
    {
        return Err(refused(WRONG_PER_MACHINE, wait));
    }
    let human: Option<(i64, String)> = sqlx::query_as(
        "select c.human_id, u.email from claims c join users u on u.id = c.human_id where c.machine_id = $1",
    )
    .bind(machine_id)
    .fetch_optional(&mut *tx)
    .await?;
    let Some((human_id, email)) = human else {
        return Err(invalid());
    };
    if let ClaimRef::ForHuman {
        human_id: asking, ..
    } = claim
    {
        if asking != human_id {
            return Err(AppError::not_found("Claim"));
        }
    }
    lock(&mut tx, machine_id, &email).await?;
    let row: Option<(i64, Vec<u8>, DateTime<Utc>, i32)> =
        sqlx::query_as("select human_id, code_hash, expires_at, failed_attempts from claims where machine_id = $1 for update")
            .bind(machine_id)
            .fetch_optional(&mut *tx)
            .await?;
    // A concurrent init may have replaced the claim (for another address) while this waited.
    let Some((human_id, stored, expires_at, failed)) = row.filter(|r| r.0 == human_id) else {
        return Err(invalid());
    };
    if let Some(refusal) = wrong_code_limit(&mut tx, limits, machine_id, &email, by_agent).await? {
        return Err(refusal);
    }
    if expires_at <= Utc::now() {
        return Err(invalid());
    }
    if !crypto::constant_time_eq(&stored, &code_hash(machine_id, code)) {
        record(&mut tx, machine_id, &email, Kind::WrongCode, by_agent).await?;
        let failed = failed + 1;
        if failed >= MAX_WRONG_CODES {
            sqlx::query("delete from claims where machine_id = $1")
                .bind(machine_id)
                .execute(&mut *tx)
                .await?;
            tx.commit().await?;
            return Err(refused(
                "Too many wrong verification codes: the claim is void, start a new one",
                60,
            ));
        }
        sqlx::query("update claims set failed_attempts = $2 where machine_id = $1")
            .bind(machine_id)
            .bind(failed)
            .execute(&mut *tx)
            .await?;
        // The wrong code that reaches a day's limit voids the claim too.
        let over = wrong_code_limit(&mut tx, limits, machine_id, &email, by_agent).await?;
        if over.is_some() {
            sqlx::query("delete from claims where machine_id = $1")
                .bind(machine_id)
                .execute(&mut *tx)
                .await?;
        }
        tx.commit().await?;
        return Err(over.unwrap_or_else(invalid));
    }
    // The human's plan must allow one more machine (402: the claim stays, to be finished once
    // the plan allows it).
    use super::plans::Quota;
    let charge = state
        .quotas
        .charge(pool, &state.stats, human_id, Quota::Machines, 1)
        .await?;
    let merged = async {
        merge(&mut tx, machine_id, human_id).await?;
        sqlx::query("delete from claims where machine_id = $1")
            .bind(machine_id)
            .execute(&mut *tx)
            .await?;
        Ok::<_, AppError>(())
    }
    .await;
    let committed = match merged {
        Ok(()) => tx.commit().await.map_err(AppError::from),
        Err(e) => Err(e),
    };
    keys.forget_all();
    // The human's figures now include the machine's memories and calls: read them again.
    state.quotas.forget(human_id);
    state.quotas.forget(machine_id);
    committed?;
    charge.done();
    // This process's unwritten counts of the machine go to the human now (any process's do
    // when written: see `stats::DailyRecorder::flush`).
    if let Err(e) = state.stats.flush(pool).await {
        tracing::warn!(error = %e, "writing usage counts after a claim failed, kept for the next try");
    }
    Ok(human_id)
}

/// Moves everything of the machine account into the human account (inside the caller's
/// transaction).
async fn merge(tx: &mut PgConnection, machine: i64, human: i64) -> AppResult<()> {
    // A conversation id of the client's own that both accounts use stays the human's.
    sqlx::query(
        "update conversations m set external_id = null where m.user_id = $1 and m.external_id is not null
           and exists (select 1 from conversations h where h.user_id = $2 and h.external_id = m.external_id)",
    )
    .bind(machine)
    .bind(human)
    .execute(&mut *tx)
    .await?;
    // The machine's default project merges into the human's default.
    for table in ["memories", "tasks", "conversations"] {
        sqlx::query(sqlx::AssertSqlSafe(format!("update {table} set user_id = $2, project_id = 'default' where user_id = $1 and project_id = 'default'")))
            .bind(machine)
            .bind(human)
            .execute(&mut *tx)
            .await?;
    }
    sqlx::query("delete from projects where user_id = $1 and id = 'default'")
        .bind(machine)
        .execute(&mut *tx)
        .await?;
    // Clashing names (and, improbably, ids) get a short suffix.
    let clashing: Vec<(String, String, bool, bool)> = sqlx::query_as(
        "select p.id, p.name,
                exists (select 1 from projects h where h.user_id = $2 and h.name = p.name),
                exists (select 1 from projects h where h.user_id = $2 and h.id = p.id)
         from projects p where p.user_id = $1",
    )
    .bind(machine)
    .bind(human)
    .fetch_all(&mut *tx)
    .await?;
    for (id, name, name_clash, id_clash) in clashing {
        if !name_clash && !id_clash {
            continue;
        }
        let suffix = crypto::random_token(4).to_lowercase();
        let new_name = if name_clash {
            format!("{}-{suffix}", name.chars().take(59).collect::<String>())
        } else {
            name
        };
        let new_id = if id_clash {
            format!("{id}-{suffix}")
        } else {
            id.clone()
        };
        // Memories and tasks follow the id change (on update cascade).
        sqlx::query("update projects set name = $3, id = $4 where user_id = $1 and id = $2")
            .bind(machine)
            .bind(&id)
            .bind(new_name)
            .bind(new_id)
            .execute(&mut *tx)
            .await?;
    }
    // Projects move with their memories, tasks and conversations (on update cascade), then
    // the keys.
    sqlx::query("update projects set user_id = $2 where user_id = $1")
        .bind(machine)
        .bind(human)
        .execute(&mut *tx)
        .await?;
    // The machine's proxied requests count as the human's from now on.
    sqlx::query("update proxy_requests set user_id = $2 where user_id = $1")
        .bind(machine)
        .bind(human)
        .execute(&mut *tx)
        .await?;
    sqlx::query("update task_batches set user_id = $2 where user_id = $1")
        .bind(machine)
        .bind(human)
        .execute(&mut *tx)
        .await?;
    sqlx::query("update api_keys set user_id = $2 where user_id = $1")
        .bind(machine)
        .bind(human)
        .execute(&mut *tx)
        .await?;
    // The machine's daily counts (calls, memories created, searches, tasks, proxy use) are the
    // human's from now on, so its use this month counts toward the human's plan.
    sqlx::query(
        "insert into usage_daily as h (user_id, day, api_calls, memories_created, searches, search_ms,
             tasks_completed, tasks_failed, task_ms, proxy_requests, proxy_tokens_in, proxy_tokens_out)
         select $2, day, api_calls, memories_created, searches, search_ms, tasks_completed,
             tasks_failed, task_ms, proxy_requests, proxy_tokens_in, proxy_tokens_out
         from usage_daily where user_id = $1 order by day
         on conflict (user_id, day) do update set api_calls = h.api_calls + excluded.api_calls,
             memories_created = h.memories_created + excluded.memories_created,
             searches = h.searches + excluded.searches,
             search_ms = hist_add(h.search_ms, excluded.search_ms),
             tasks_completed = h.tasks_completed + excluded.tasks_completed,
             tasks_failed = h.tasks_failed + excluded.tasks_failed,
             task_ms = hist_add(h.task_ms, excluded.task_ms),
             proxy_requests = h.proxy_requests + excluded.proxy_requests,
             proxy_tokens_in = h.proxy_tokens_in + excluded.proxy_tokens_in,
             proxy_tokens_out = h.proxy_tokens_out + excluded.proxy_tokens_out",
    )
    .bind(machine)
    .bind(human)
    .execute(&mut *tx)
    .await?;
    sqlx::query("delete from usage_daily where user_id = $1")
        .bind(machine)
        .execute(&mut *tx)
        .await?;
    sqlx::query("update users set claimed_by = $2, claimed_at = now() where id = $1")
        .bind(machine)
        .bind(human)
        .execute(&mut *tx)
        .await?;
    Ok(())
}

/// The live claims naming a human account, for the portal.
pub async fn pending_for(pool: &PgPool, human_id: i64) -> AppResult<Vec<PendingClaim>> {
    type Row = (i64, Option<String>, Option<String>, i64, i64, DateTime<Utc>);
    let rows: Vec<Row> = sqlx::query_as(
        "select c.machine_id, u.hostname, u.platform,
                (select count(*) from projects p where p.user_id = c.machine_id),
                (select count(*) from memories m where m.user_id = c.machine_id),
                c.expires_at
         from claims c join users u on u.id = c.machine_id
         where c.human_id = $1 and c.expires_at > now() and u.claimed_by is null order by c.created_at desc",
    )
    .bind(human_id)
    .fetch_all(pool)
    .await?;
    Ok(rows
        .into_iter()
        .map(
            |(machine_id, hostname, platform, projects, memories, expires_at)| PendingClaim {
                machine_id,
                hostname,
                platform,
                projects,
                memories,
                expires_at: iso(expires_at),
            },
        )
        .collect())
}
