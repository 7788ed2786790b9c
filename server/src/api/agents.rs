//! `/api/v1/agents/*`: machine accounts and claims.
use std::time::Duration;

use axum::extract::{ConnectInfo, State};
use axum::Json;
use serde_json::{json, Value};

use super::extract::{client_ip, ApiKeyAuth, JsonFields, QueryFields};
use app::core::error::AppResult;
use app::core::state::AppState;
use app::core::validate::email_problem;
use app::core::{claims, machines};

pub async fn auto_register(
    State(state): State<AppState>,
    ConnectInfo(addr): ConnectInfo<std::net::SocketAddr>,
    JsonFields(mut f): JsonFields,
) -> AppResult<Json<Value>> {
    let fingerprint = machines::read_fingerprint(&mut f);
    let platform = f.optional_enum("platform", &machines::PLATFORMS);
    let hostname = f.optional_str("hostname", 255).filter(|h| !h.is_empty());
    f.finish()?;
    state.limiter.hit(
        &format!("auto-register:{}", client_ip(Some(addr))),
        state.settings.limits.auto_register_per_hour,
        Duration::from_secs(3600),
    )?;
    let account = machines::auto_register(
        &state.pool,
        &fingerprint,
        platform.as_deref(),
        hostname.as_deref(),
    )
    .await?;
    Ok(Json(json!({"success": true, "data": account})))
}

pub async fn machine_stats(
    State(state): State<AppState>,
    ApiKeyAuth(owner): ApiKeyAuth,
    QueryFields(mut q): QueryFields,
) -> AppResult<Json<Value>> {
    let fingerprint = machines::read_fingerprint(&mut q);
    q.finish()?;
    Ok(Json(
        json!({"success": true, "data": machines::stats(&state.pool, &state.usage, owner, &fingerprint).await?}),
    ))
}

pub async fn claim_init(
    State(state): State<AppState>,
    JsonFields(mut f): JsonFields,
) -> AppResult<Json<Value>> {
    let fingerprint = machines::read_fingerprint(&mut f);
    let email = f.required_str("email", 1, 254).to_lowercase();
    if !email.is_empty() {
        if let Some(problem) = email_problem(&email) {
            f.error("email", "value_error", problem, None);
        }
    }
    f.finish()?;
    let started = claims::init(&state.pool, &state.settings, &fingerprint, &email).await?;
    Ok(Json(
        json!({"success": true, "data": started, "message": "Verification code sent by e-mail"}),
    ))
}

pub async fn claim_verify(
    State(state): State<AppState>,
    JsonFields(mut f): JsonFields,
) -> AppResult<Json<Value>> {
    let fingerprint = machines::read_fingerprint(&mut f);
    let code = f.required_str("verification_code", 6, 6);
    if code.len() == 6 && !code.chars().all(|c| c.is_ascii_digit()) {
        f.error(
            "verification_code",
            "string_pattern_mismatch",
            "String should match pattern '^[0-9]{6}$'",
            Some(json!({"pattern": "^[0-9]{6}$"})),
        );
    }
    f.finish()?;
    let human = claims::verify(
        &state.pool,
        &state.keys,
        claims::ClaimRef::Fingerprint(&fingerprint),
        &code,
    )
    .await?;
    Ok(Json(
        json!({"success": true, "data": {"message": "Machine account merged into your account", "merged_to_user_id": human.to_string()}}),
    ))
}
