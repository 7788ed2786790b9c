//! `/api/auth/*`: register, login (OAuth2 password form), me.
use std::time::Duration;

use axum::extract::State;
use axum::response::{IntoResponse, Response};
use axum::Json;
use serde::{Deserialize, Serialize};
use serde_json::json;
use utoipa::ToSchema;

use super::doc::ErrorBody;
use super::extract::{bearer_unauthorized, BearerAuth, Body, ClientIp, FormFields};
use app::core::accounts::{self, UserRecord};
use app::core::error::{AppError, AppResult};
use app::core::state::AppState;
use app::core::validate::{Fields, FromFields};

/// A sign-up.
#[derive(Debug, Deserialize, ToSchema)]
#[schema(example = json!({"email": "ana@example.com", "password": "correct horse battery"}))]
pub struct RegisterRequest {
    /// A valid address, at most 254 characters; stored lower-case.
    #[schema(format = "email", max_length = 254)]
    pub email: String,
    #[schema(min_length = 8, max_length = 256)]
    pub password: String,
}

impl FromFields for RegisterRequest {
    fn from_fields(f: &mut Fields) -> Self {
        let (email, password) = accounts::read_credentials(f, "email");
        RegisterRequest { email, password }
    }
}

/// The new account.
#[derive(Serialize, ToSchema)]
pub struct Registered {
    pub id: i64,
    pub email: String,
    pub message: String,
}

#[utoipa::path(post, path = "/api/auth/register", tag = "accounts",
    request_body = RegisterRequest,
    responses(
        (status = 200, description = "Registered", body = Registered),
        (status = 409, description = "The e-mail is already registered", body = ErrorBody),
        (status = 429, description = "Too many sign-ups from this address; see `Retry-After`", body = ErrorBody),
    ))]
/// Create a human account.
pub async fn register(
    State(state): State<AppState>,
    ClientIp(client): ClientIp,
    Body(req): Body<RegisterRequest>,
) -> AppResult<Json<Registered>> {
    state
        .limiter
        .hit(
            &format!("register:{client}"),
            state.settings.limits.register_per_hour,
            Duration::from_secs(3600),
        )
        .await?;
    let user = accounts::register(&state.pool, &req.email, &req.password).await?;
    Ok(Json(Registered {
        id: user.id,
        email: user.email.unwrap_or_default(),
        message: "User registered successfully".into(),
    }))
}

/// The OAuth2 password form (`application/x-www-form-urlencoded` only).
#[derive(Debug, Deserialize, ToSchema)]
pub struct LoginForm {
    /// The e-mail address.
    #[schema(min_length = 1, max_length = 254)]
    pub username: String,
    #[schema(min_length = 1, max_length = 256)]
    pub password: String,
    // A form has no null: the optional fields are strings that may be left out.
    /// `password` when given.
    #[schema(pattern = "^(password)?$", value_type = String, required = false)]
    pub grant_type: Option<String>,
    #[schema(value_type = String, required = false)]
    pub scope: Option<String>,
    #[schema(value_type = String, required = false)]
    pub client_id: Option<String>,
    #[schema(value_type = String, required = false)]
    pub client_secret: Option<String>,
}

impl FromFields for LoginForm {
    fn from_fields(f: &mut Fields) -> Self {
        let username = f.required_str("username", 1, 254).to_lowercase();
        let password = f.required_raw_str("password", 1, 256);
        let mut optional = |name: &str| f.optional_str(name, 1024);
        let (grant_type, scope, client_id, client_secret) = (
            optional("grant_type"),
            optional("scope"),
            optional("client_id"),
            optional("client_secret"),
        );
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
        LoginForm {
            username,
            password,
            grant_type,
            scope,
            client_id,
            client_secret,
        }
    }
}

/// A bearer token.
#[derive(Serialize, ToSchema)]
#[schema(example = json!({"access_token": "eyJhbGciOiJIUzI1NiJ9…", "token_type": "bearer", "expires_in": 86400}))]
pub struct Token {
    pub access_token: String,
    /// Always `bearer`.
    pub token_type: String,
    /// Seconds until it expires.
    pub expires_in: i64,
}

#[utoipa::path(post, path = "/api/auth/login", tag = "accounts",
    request_body(content = LoginForm, content_type = "application/x-www-form-urlencoded"),
    responses(
        (status = 200, description = "A JWT for the bearer routes", body = Token),
        (status = 401, description = "Wrong e-mail or password", body = ErrorBody),
        (status = 429, description = "Too many attempts for this e-mail; see `Retry-After`", body = ErrorBody),
    ))]
/// Log in with the e-mail as `username`: answers a JWT.
pub async fn login(State(state): State<AppState>, FormFields(f): FormFields) -> Response {
    let form = match LoginForm::read(f) {
        Ok(form) => form,
        Err(e) => return e.into_response(),
    };
    if let Err(e) = state
        .limiter
        .hit(
            &format!("login:{}", form.username),
            state.settings.limits.login_per_minute,
            Duration::from_secs(60),
        )
        .await
    {
        return e.into_response();
    }
    match accounts::authenticate(&state.pool, &form.username, &form.password).await {
        Ok(user_id) => match app::core::crypto::issue_token(
            &state.settings.jwt_secret,
            user_id,
            state.settings.jwt_ttl_secs,
        ) {
            Ok(token) => Json(Token {
                access_token: token,
                token_type: "bearer".into(),
                expires_in: state.settings.jwt_ttl_secs,
            })
            .into_response(),
            Err(e) => AppError::Internal(e).into_response(),
        },
        Err(AppError::Unauthorized(msg)) => bearer_unauthorized(&msg),
        Err(e) => e.into_response(),
    }
}

#[utoipa::path(get, path = "/api/auth/me", tag = "accounts",
    security(("bearer" = [])),
    responses((status = 200, description = "The user record", body = UserRecord)))]
/// The logged-in user.
pub async fn me(
    State(state): State<AppState>,
    BearerAuth(user_id): BearerAuth,
) -> AppResult<Json<UserRecord>> {
    let user = accounts::find(&state.pool, user_id)
        .await?
        .ok_or_else(|| AppError::Unauthorized("Could not validate credentials".into()))?;
    Ok(Json(user))
}
