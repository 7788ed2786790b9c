//! `/api/auth/*`: register, login (OAuth2 password form), me.
use std::time::Duration;

use axum::extract::{ConnectInfo, State};
use axum::response::{IntoResponse, Response};
use axum::Json;
use serde_json::json;

use super::extract::{bearer_unauthorized, client_ip, BearerAuth, FormFields, JsonFields};
use app::core::accounts;
use app::core::error::{AppError, AppResult};
use app::core::state::AppState;

pub async fn register(
    State(state): State<AppState>,
    ConnectInfo(addr): ConnectInfo<std::net::SocketAddr>,
    JsonFields(mut f): JsonFields,
) -> AppResult<Json<serde_json::Value>> {
    let (email, password) = accounts::read_credentials(&mut f, "email");
    f.finish()?;
    state.limiter.hit(
        &format!("register:{}", client_ip(Some(addr))),
        state.settings.limits.register_per_hour,
        Duration::from_secs(3600),
    )?;
    let user = accounts::register(&state.pool, &email, &password).await?;
    Ok(Json(
        json!({"id": user.id, "email": user.email, "message": "User registered successfully"}),
    ))
}

pub async fn login(State(state): State<AppState>, FormFields(mut f): FormFields) -> Response {
    let email = f.required_str("username", 1, 254).to_lowercase();
    let password = f.required_raw_str("password", 1, 256);
    for optional in ["grant_type", "scope", "client_id", "client_secret"] {
        f.optional_str(optional, 1024);
    }
    if let Some(grant) = f.raw("grant_type").and_then(|v| v.as_str()) {
        if !grant.is_empty() && grant != "password" {
            f.error(
                "grant_type",
                "string_pattern_mismatch",
                "String should match pattern '^password$'",
                Some(json!({"pattern": "^password$"})),
            );
        }
    }
    if let Err(e) = f.finish() {
        return e.into_response();
    }
    if let Err(e) = state.limiter.hit(
        &format!("login:{email}"),
        state.settings.limits.login_per_minute,
        Duration::from_secs(60),
    ) {
        return e.into_response();
    }
    match accounts::authenticate(&state.pool, &email, &password).await {
        Ok(user_id) => match app::core::crypto::issue_token(&state.settings.jwt_secret, user_id, state.settings.jwt_ttl_secs) {
            Ok(token) => Json(json!({"access_token": token, "token_type": "bearer", "expires_in": state.settings.jwt_ttl_secs})).into_response(),
            Err(e) => AppError::Internal(e).into_response(),
        },
        Err(AppError::Unauthorized(msg)) => bearer_unauthorized(&msg),
        Err(e) => e.into_response(),
    }
}

pub async fn me(
    State(state): State<AppState>,
    BearerAuth(user_id): BearerAuth,
) -> AppResult<Json<accounts::UserRecord>> {
    let user = accounts::find(&state.pool, user_id)
        .await?
        .ok_or_else(|| AppError::Unauthorized("Could not validate credentials".into()))?;
    Ok(Json(user))
}
