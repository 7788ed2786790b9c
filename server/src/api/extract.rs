//! Request extractors: JSON bodies and query strings with the contract's 422s, and the two
//! credentials. A bad credential never passes as anonymous.
use axum::extract::{FromRequest, FromRequestParts, Request};
use axum::http::{header, request::Parts, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use bytes::Bytes;

use app::core::error::{AppError, FieldError};
use app::core::keys::KeyOwner;
use app::core::plans::Quota;
use app::core::state::AppState;
use app::core::validate::{Fields, FromFields};

/// A JSON object body; anything else is 422 (413 over the body limit).
pub struct JsonFields(pub Fields);

async fn read_body(req: Request, state: &AppState) -> Result<Bytes, AppError> {
    Bytes::from_request(req, state).await.map_err(|e| {
        if e.status() == StatusCode::PAYLOAD_TOO_LARGE {
            AppError::PayloadTooLarge
        } else {
            AppError::BadRequest("Could not read the request body".into())
        }
    })
}

fn content_type(req: &Request) -> String {
    req.headers()
        .get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .unwrap_or_default()
        .to_ascii_lowercase()
}

impl FromRequest<AppState> for JsonFields {
    type Rejection = AppError;
    async fn from_request(req: Request, state: &AppState) -> Result<Self, AppError> {
        let ct = content_type(&req);
        let is_json = ct.starts_with("application/json")
            || (ct.starts_with("application/") && ct.contains("+json"));
        let body = read_body(req, state).await?;
        if !is_json {
            return Err(AppError::validation(
                FieldError::new(&["body"], "model_attributes_type", "Input should be a valid dictionary or object to extract fields from (send Content-Type: application/json)")
                    .input(serde_json::Value::String(String::from_utf8_lossy(&body).chars().take(200).collect())),
            ));
        }
        Fields::from_json_body(&body).map(JsonFields)
    }
}

/// An `application/x-www-form-urlencoded` body; any other content type is 422.
pub struct FormFields(pub Fields);

impl FromRequest<AppState> for FormFields {
    type Rejection = AppError;
    async fn from_request(req: Request, state: &AppState) -> Result<Self, AppError> {
        let ct = content_type(&req);
        let body = read_body(req, state).await?;
        if !ct.starts_with("application/x-www-form-urlencoded") {
            return Err(AppError::validation(FieldError::new(
                &["body"],
                "model_attributes_type",
                "Send the login form as application/x-www-form-urlencoded",
            )));
        }
        Ok(FormFields(Fields::from_form(&body)))
    }
}

/// A typed JSON body: read by its [`FromFields`] rules, every problem a 422 in FastAPI's shape.
pub struct Body<T>(pub T);

impl<T: FromFields> FromRequest<AppState> for Body<T> {
    type Rejection = AppError;
    async fn from_request(req: Request, state: &AppState) -> Result<Self, AppError> {
        let JsonFields(fields) = JsonFields::from_request(req, state).await?;
        T::read(fields).map(Body)
    }
}

/// A typed query string, read by its [`FromFields`] rules.
pub struct Query<T>(pub T);

impl<S: Send + Sync, T: FromFields> FromRequestParts<S> for Query<T> {
    type Rejection = AppError;
    async fn from_request_parts(parts: &mut Parts, _: &S) -> Result<Self, AppError> {
        T::read(Fields::from_query(parts.uri.query())).map(Query)
    }
}

/// The query string, read field by field.
pub struct QueryFields(pub Fields);

impl<S: Send + Sync> FromRequestParts<S> for QueryFields {
    type Rejection = AppError;
    async fn from_request_parts(parts: &mut Parts, _: &S) -> Result<Self, AppError> {
        Ok(QueryFields(Fields::from_query(parts.uri.query())))
    }
}

/// A valid `X-API-Key`: the account (and machine) it acts for. Rate-limited and counted.
pub struct ApiKeyAuth(pub KeyOwner);

impl FromRequestParts<AppState> for ApiKeyAuth {
    type Rejection = AppError;
    async fn from_request_parts(parts: &mut Parts, state: &AppState) -> Result<Self, AppError> {
        let Some(value) = parts.headers.get("x-api-key") else {
            return Err(AppError::Unauthorized(
                "Missing API key: send it in the X-API-Key header".into(),
            ));
        };
        let secret = value
            .to_str()
            .map_err(|_| AppError::Unauthorized("Invalid API key".into()))?;
        authenticate_key(state, secret.trim()).await.map(ApiKeyAuth)
    }
}

/// The owner of a presented API key (401 when it is unknown or revoked), rate-limited, held to
/// the plan's monthly API calls (402) and counted: the API's `X-API-Key` routes and the MCP
/// endpoint check keys here.
pub async fn authenticate_key(state: &AppState, secret: &str) -> Result<KeyOwner, AppError> {
    let owner = known_key(state, secret).await?;
    let charge = state
        .quotas
        .charge(
            &state.pool,
            &state.stats,
            owner.user_id,
            Quota::ApiCallsPerMonth,
            1,
        )
        .await?;
    count_call(state, owner);
    charge.done();
    Ok(owner)
}

/// A known key, within its rate limit (not yet counted).
async fn known_key(state: &AppState, secret: &str) -> Result<KeyOwner, AppError> {
    let owner = state
        .keys
        .authenticate(&state.pool, secret)
        .await?
        .ok_or_else(|| AppError::Unauthorized("Invalid API key".into()))?;
    state
        .limiter
        .hit(
            &format!("api:{}", owner.key_id),
            state.settings.limits.api_per_minute,
            std::time::Duration::from_secs(60),
        )
        .await?;
    Ok(owner)
}

fn count_call(state: &AppState, owner: KeyOwner) {
    state.usage.record(owner.key_id);
    state.stats.api_call(owner.user_id);
}

/// The account asking for its own statistics or plan: an API key (`X-API-Key`, or `Bearer
/// engram_…`), a bearer token of `POST /api/auth/login`, or the portal's session cookie. A key
/// is rate-limited and counted but not held to the monthly API calls: an account over its quota
/// can still see where it stands.
pub struct AccountAuth(pub i64);

impl FromRequestParts<AppState> for AccountAuth {
    type Rejection = Response;
    async fn from_request_parts(parts: &mut Parts, state: &AppState) -> Result<Self, Response> {
        if let Some(secret) = presented_key(&parts.headers) {
            if parts.headers.contains_key("x-api-key")
                || secret.starts_with(app::core::crypto::KEY_PREFIX)
            {
                let owner = known_key(state, secret)
                    .await
                    .map_err(IntoResponse::into_response)?;
                count_call(state, owner);
                return Ok(AccountAuth(owner.user_id));
            }
            return BearerAuth::from_request_parts(parts, state)
                .await
                .map(|BearerAuth(id)| AccountAuth(id));
        }
        if let Some(id) = session_user(state, &parts.headers)
            .await
            .map_err(IntoResponse::into_response)?
        {
            return Ok(AccountAuth(id));
        }
        Err(AppError::Unauthorized(
            "Not authenticated: send an API key in X-API-Key, a bearer token, or log in to the portal"
                .into(),
        )
        .into_response())
    }
}

/// The user of the portal's session cookie (`engram_session`), if it names a live session.
async fn session_user(
    state: &AppState,
    headers: &axum::http::HeaderMap,
) -> Result<Option<i64>, AppError> {
    let Some(id) = headers
        .get_all(header::COOKIE)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(';'))
        .find_map(|c| c.trim().strip_prefix("engram_session="))
    else {
        return Ok(None);
    };
    let data: Option<Vec<u8>> =
        sqlx::query_scalar("select data from sessions where id = $1 and expiry_date > now()")
            .bind(id)
            .fetch_optional(&state.pool)
            .await?;
    Ok(data
        .and_then(|d| serde_json::from_slice::<serde_json::Value>(&d).ok())
        .and_then(|v| v["data"]["user_id"].as_i64()))
}

/// The key in `X-API-Key`, or a bearer token (`Authorization: Bearer engram_…`, as OpenAI's
/// and MCP's clients send it).
pub fn presented_key(headers: &axum::http::HeaderMap) -> Option<&str> {
    if let Some(v) = headers.get("x-api-key") {
        return v.to_str().ok().map(str::trim);
    }
    let auth = headers.get(header::AUTHORIZATION)?.to_str().ok()?.trim();
    auth.strip_prefix("Bearer ")
        .or_else(|| auth.strip_prefix("bearer "))
        .map(str::trim)
}

/// A valid bearer token of an existing user.
pub struct BearerAuth(pub i64);

/// A 401 with `WWW-Authenticate: Bearer`, as OAuth2 bearer routes answer.
pub fn bearer_unauthorized(message: &str) -> Response {
    let mut response = AppError::Unauthorized(message.into()).into_response();
    response
        .headers_mut()
        .insert(header::WWW_AUTHENTICATE, HeaderValue::from_static("Bearer"));
    response
}

impl FromRequestParts<AppState> for BearerAuth {
    type Rejection = Response;
    async fn from_request_parts(parts: &mut Parts, state: &AppState) -> Result<Self, Response> {
        let token = parts
            .headers
            .get(header::AUTHORIZATION)
            .and_then(|v| v.to_str().ok())
            .and_then(|v| {
                v.strip_prefix("Bearer ")
                    .or_else(|| v.strip_prefix("bearer "))
            })
            .ok_or_else(|| bearer_unauthorized("Not authenticated"))?;
        let user_id = app::core::crypto::verify_token(&state.settings.jwt_secret, token.trim())
            .ok_or_else(|| bearer_unauthorized("Could not validate credentials"))?;
        match app::core::accounts::find(&state.pool, user_id).await {
            Ok(Some(_)) => Ok(BearerAuth(user_id)),
            Ok(None) => Err(bearer_unauthorized("Could not validate credentials")),
            Err(e) => Err(e.into_response()),
        }
    }
}

/// The client's address, for per-address limits: the socket's peer, or behind a trusted proxy
/// the hop it names (see `app::core::clientaddr`).
pub struct ClientIp(pub String);

impl FromRequestParts<AppState> for ClientIp {
    type Rejection = AppError;
    async fn from_request_parts(parts: &mut Parts, state: &AppState) -> Result<Self, AppError> {
        let peer = parts
            .extensions
            .get::<axum::extract::ConnectInfo<std::net::SocketAddr>>()
            .map(|c| c.0);
        Ok(ClientIp(app::core::clientaddr::client_key(
            &state.settings.trusted_proxies,
            peer,
            &parts.headers,
        )))
    }
}
