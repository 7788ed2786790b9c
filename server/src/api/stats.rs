//! Statistics and the subscription: `GET /api/stats`, `GET /api/stats/usage`,
//! `GET /api/subscription/status`, MemoryX's `GET /api/v1/quota`, and the billing webhook
//! `POST /api/subscription/webhook`. The figures come from `app::core::stats` (roll-ups) and
//! `app::core::plans` (plans, quotas).
use axum::body::Body as HttpBody;
use axum::extract::State;
use axum::http::HeaderMap;
use axum::Json;
use serde::{Deserialize, Serialize};
use utoipa::{IntoParams, ToSchema};

use super::doc::ErrorBody;
use super::extract::{AccountAuth, Query};
use app::core::error::{AppError, AppResult};
use app::core::plans::{self, EventOutcome};
use app::core::state::AppState;
use app::core::stats;
use app::core::validate::{Fields, FromFields};
use app::types::{AccountStats, SubscriptionStatus, UsageHistory};

#[utoipa::path(get, path = "/api/stats", tag = "stats",
    security(("api_key" = []), ("bearer" = [])),
    responses((status = 200, description = "The account's totals", body = AccountStats)))]
/// The account's totals: memories (by sector, by project), storage, projects, conversations,
/// keys, machines claimed, API calls today and this month. Also reachable with a bearer token
/// or the portal's session.
pub async fn get_stats(
    State(state): State<AppState>,
    AccountAuth(user_id): AccountAuth,
) -> AppResult<Json<AccountStats>> {
    Ok(Json(
        stats::account(&state.pool, &state.stats, user_id).await?,
    ))
}

/// How many days of history.
#[derive(Debug, Deserialize, IntoParams)]
#[into_params(parameter_in = Query)]
pub struct UsageQuery {
    /// The last N days, today included (UTC).
    #[param(minimum = 1, maximum = 365, default = 30)]
    pub days: i64,
}

impl FromFields for UsageQuery {
    fn from_fields(q: &mut Fields) -> Self {
        UsageQuery {
            days: q.int_in("days", 30, 1, stats::MAX_DAYS),
        }
    }
}

#[utoipa::path(get, path = "/api/stats/usage", tag = "stats",
    security(("api_key" = []), ("bearer" = [])),
    params(UsageQuery),
    responses((status = 200, description = "One entry a day, oldest first; days without work are zeros", body = UsageHistory)))]
/// The account's usage per day: API calls, memories created, searches and their median time,
/// tasks completed and failed with their median POST → completed time, proxy requests and
/// tokens.
pub async fn get_usage(
    State(state): State<AppState>,
    AccountAuth(user_id): AccountAuth,
    Query(q): Query<UsageQuery>,
) -> AppResult<Json<UsageHistory>> {
    Ok(Json(
        stats::history(&state.pool, &state.stats, user_id, q.days).await?,
    ))
}

#[utoipa::path(get, path = "/api/subscription/status", tag = "stats",
    security(("api_key" = []), ("bearer" = [])),
    responses((status = 200, description = "The plan, each quota's use and limit, the period", body = SubscriptionStatus)))]
/// The account's plan: each quota's use and limit (`null`: unlimited), the period's end, the
/// plans there are and how to change.
pub async fn get_subscription(
    State(state): State<AppState>,
    AccountAuth(user_id): AccountAuth,
) -> AppResult<Json<SubscriptionStatus>> {
    Ok(Json(plans::subscription(&state, user_id).await?))
}

/// One quota as MemoryX's clients read it.
#[derive(Serialize, ToSchema)]
pub struct QuotaCounter {
    pub used: i64,
    /// `null`: unlimited.
    pub limit: Option<i64>,
    pub remaining: Option<i64>,
}

/// MemoryX's quota object.
#[derive(Serialize, ToSchema)]
pub struct MemoryxQuotaBody {
    /// The plan's name.
    pub tier: String,
    /// The plan's price label.
    pub price: String,
    /// Searches today.
    pub cloud_search: QuotaCounter,
}

/// MemoryX's `GET /v1/quota`, with the full status beside it.
#[derive(Serialize, ToSchema)]
pub struct MemoryxQuota {
    pub success: bool,
    pub quota: MemoryxQuotaBody,
    pub data: SubscriptionStatus,
}

#[utoipa::path(get, path = "/api/v1/quota", tag = "memoryx",
    security(("api_key" = []), ("bearer" = [])),
    responses((status = 200, description = "The plan and its quotas (MemoryX's shape, the full status in `data`)", body = MemoryxQuota)))]
/// MemoryX's quota path: the plan, today's searches against the plan's limit, and every quota.
/// MemoryX's server SDK also calls it to check a key (any 2xx: valid).
pub async fn get_quota(
    State(state): State<AppState>,
    AccountAuth(user_id): AccountAuth,
) -> AppResult<Json<MemoryxQuota>> {
    let status = plans::subscription(&state, user_id).await?;
    let searches = status
        .quotas
        .iter()
        .find(|q| q.quota == plans::Quota::SearchesPerDay.key())
        .map(|q| QuotaCounter {
            used: q.used,
            limit: q.limit,
            remaining: q.remaining,
        })
        .unwrap_or(QuotaCounter {
            used: 0,
            limit: None,
            remaining: None,
        });
    Ok(Json(MemoryxQuota {
        success: true,
        quota: MemoryxQuotaBody {
            tier: status.plan.name.clone(),
            price: status.plan.price_label.clone(),
            cloud_search: searches,
        },
        data: status,
    }))
}

/// A billing event, as Stripe sends them (fields beyond these are ignored).
#[derive(ToSchema)]
#[schema(example = json!({"id": "evt_1QxAbc", "type": "customer.subscription.updated",
    "data": {"object": {"metadata": {"email": "ana@example.com", "plan": "pro"},
    "current_period_end": 1767225600}}}))]
#[allow(dead_code)]
pub struct BillingEvent {
    /// The event's id: each is applied once.
    id: String,
    /// `checkout.session.completed`, `customer.subscription.created`, `.updated` (move the
    /// account to `data.object.metadata.plan`) or `.deleted` (back to the default plan); other
    /// types are acknowledged and ignored.
    #[schema(rename = "type")]
    kind: String,
    /// `{"object": {"metadata": {"email", "plan"}, "current_period_end"?}}`.
    #[schema(value_type = Object)]
    data: serde_json::Value,
}

/// What the webhook did.
#[derive(Serialize, ToSchema)]
pub struct WebhookResult {
    pub success: bool,
    pub message: String,
    /// The plan the account is now on (events that move one).
    pub plan: Option<String>,
}

#[utoipa::path(post, path = "/api/subscription/webhook", tag = "stats",
    request_body(content = BillingEvent, content_type = "application/json",
        description = "The event, signed in `Stripe-Signature` (`t=<unix time>,v1=<hex HMAC-SHA256 of \"<t>.<body>\">`) with `ENGRAM_BILLING_WEBHOOK_SECRET`"),
    params(("Stripe-Signature" = String, Header, description = "`t=…,v1=…`: HMAC-SHA256 over `\"{t}.{body}\"`; `t` within 5 minutes")),
    responses(
        (status = 200, description = "Applied (or a type that moves nothing, acknowledged)", body = WebhookResult),
        (status = 400, description = "Missing or wrong signature, a stale timestamp, or an event naming no known account or plan", body = ErrorBody),
        (status = 404, description = "Billing is not configured on this server", body = ErrorBody),
        (status = 409, description = "This event was already applied (a replay)", body = ErrorBody),
    ))]
/// Billing webhook: a payment provider's signed event moves an account to the plan it names.
pub async fn billing_webhook(
    State(state): State<AppState>,
    headers: HeaderMap,
    body: HttpBody,
) -> AppResult<Json<WebhookResult>> {
    let Some(secret) = state.settings.billing.webhook_secret.as_deref() else {
        return Err(AppError::NotFound(
            "Billing is not configured on this server (ENGRAM_BILLING_WEBHOOK_SECRET)".into(),
        ));
    };
    let payload = axum::body::to_bytes(body, crate::BODY_LIMIT)
        .await
        .map_err(|_| AppError::PayloadTooLarge)?;
    let signature = headers
        .get("stripe-signature")
        .and_then(|v| v.to_str().ok())
        .ok_or_else(|| AppError::BadRequest("Missing Stripe-Signature header".into()))?;
    plans::verify_signature(
        secret.as_bytes(),
        signature,
        &payload,
        chrono::Utc::now().timestamp(),
    )
    .map_err(|e| AppError::BadRequest(e.into()))?;
    let event: serde_json::Value = serde_json::from_slice(&payload)
        .map_err(|_| AppError::BadRequest("The event is not JSON".into()))?;
    match plans::apply_event(&state.pool, &event).await? {
        EventOutcome::Applied { user_id, plan } => {
            state.quotas.forget(user_id);
            Ok(Json(WebhookResult {
                success: true,
                message: format!("The account is now on the {plan} plan"),
                plan: Some(plan),
            }))
        }
        EventOutcome::Ignored => Ok(Json(WebhookResult {
            success: true,
            message: "Event acknowledged; it moves no plan".into(),
            plan: None,
        })),
    }
}
