//! The OpenAI-compatible LLM proxy: `POST /api/v1/chat/completions` answers with the account's
//! upstream model, the user's relevant memories injected, and remembers the exchange afterwards;
//! `GET /api/v1/models` lists the upstream provider's models from the catalogue;
//! `/api/v1/proxy/settings` sets the account's upstream.
//!
//! Point the official OpenAI SDKs at `base_url = http://HOST:3000/api/v1` with an Engram key as
//! their API key. Errors on the two OpenAI routes are in OpenAI's shape
//! (`{"error": {"message", "type", "param", "code"}}`); a body OpenAI would refuse is 400, as
//! OpenAI answers it (not our 422). The Engram key is never sent upstream: the upstream gets
//! its own key.
//!
//! Streaming passes the upstream's server-sent events through chunk by chunk as they arrive;
//! the reply is assembled on the way for remembering. A client that goes away drops the body
//! stream, which drops the upstream response and so closes its connection: the upstream stops.
use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::body::Body as HttpBody;
use axum::extract::State;
use axum::http::{header, HeaderMap, HeaderName, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::Json;
use bytes::Bytes;
use serde::Serialize;
use serde_json::{json, Map, Value};
use utoipa::ToSchema;

use super::doc::{ErrorBody, Message};
use super::extract::{authenticate_key, presented_key, ApiKeyAuth, Body};
use app::core::error::AppError;
use app::core::keys::KeyOwner;
use app::core::proxy::{self, Controls, Prepared, Refused, UpstreamUpdate, UpstreamView};
use app::core::state::AppState;

/// Largest chat request body.
pub const CHAT_BODY_LIMIT: usize = 16 * 1024 * 1024;

// ---------------------------------------------------------------------------------------------
// Errors in OpenAI's shape.

/// An error as OpenAI's API answers it (and its SDKs read it).
#[derive(Serialize, ToSchema)]
#[schema(example = json!({"error": {"message": "Invalid API key", "type": "authentication_error",
    "param": null, "code": "invalid_api_key"}}))]
pub struct OpenAiErrorBody {
    pub error: OpenAiErrorDetail,
}

#[derive(Serialize, ToSchema)]
pub struct OpenAiErrorDetail {
    pub message: String,
    /// `invalid_request_error`, `authentication_error`, `not_found_error`, `rate_limit_error`,
    /// `upstream_error`, `timeout_error` or `api_error`.
    #[serde(rename = "type")]
    pub kind: String,
    pub param: Option<String>,
    pub code: Option<String>,
}

/// An error answered on the OpenAI routes.
pub struct OpenAiError {
    status: StatusCode,
    kind: &'static str,
    code: Option<&'static str>,
    message: String,
    retry_after: Option<u64>,
}

impl OpenAiError {
    fn new(
        status: StatusCode,
        kind: &'static str,
        code: &'static str,
        message: impl Into<String>,
    ) -> Self {
        Self {
            status,
            kind,
            code: Some(code),
            message: message.into(),
            retry_after: None,
        }
    }
    fn bad_request(code: &'static str, message: impl Into<String>) -> Self {
        Self::new(
            StatusCode::BAD_REQUEST,
            "invalid_request_error",
            code,
            message,
        )
    }
}

impl From<AppError> for OpenAiError {
    fn from(e: AppError) -> Self {
        let message = e.user_message();
        match e {
            AppError::Validation(errors) => {
                let message = errors
                    .first()
                    .map(|f| {
                        let at: Vec<String> = f
                            .loc
                            .iter()
                            .skip(1)
                            .map(|l| l.to_string().trim_matches('"').to_string())
                            .collect();
                        format!("{}: {}", at.join("."), f.msg)
                    })
                    .unwrap_or(message);
                Self::bad_request("invalid_value", message)
            }
            AppError::BadRequest(_) => Self::bad_request("invalid_request", message),
            AppError::PayloadTooLarge => Self::new(
                StatusCode::PAYLOAD_TOO_LARGE,
                "invalid_request_error",
                "request_too_large",
                message,
            ),
            AppError::PaymentRequired(_) => Self::new(
                StatusCode::PAYMENT_REQUIRED,
                "insufficient_quota",
                "quota_exceeded",
                message,
            ),
            AppError::Unauthorized(_) => Self::new(
                StatusCode::UNAUTHORIZED,
                "authentication_error",
                "invalid_api_key",
                message,
            ),
            AppError::NotFound(_) => Self::new(
                StatusCode::NOT_FOUND,
                "not_found_error",
                "not_found",
                message,
            ),
            AppError::Conflict(_) => Self::new(
                StatusCode::CONFLICT,
                "invalid_request_error",
                "conflict",
                message,
            ),
            AppError::RateLimited {
                retry_after_secs, ..
            } => Self {
                retry_after: Some(retry_after_secs),
                ..Self::new(
                    StatusCode::TOO_MANY_REQUESTS,
                    "rate_limit_error",
                    "rate_limit_exceeded",
                    message,
                )
            },
            AppError::Unavailable => Self {
                retry_after: Some(5),
                ..Self::new(
                    StatusCode::SERVICE_UNAVAILABLE,
                    "api_error",
                    "unavailable",
                    message,
                )
            },
            AppError::Internal(cause) => {
                tracing::error!(error = ?cause, "internal error in the proxy");
                Self::new(
                    StatusCode::INTERNAL_SERVER_ERROR,
                    "api_error",
                    "internal_error",
                    "Internal server error",
                )
            }
        }
    }
}

impl IntoResponse for OpenAiError {
    fn into_response(self) -> Response {
        let body = OpenAiErrorBody {
            error: OpenAiErrorDetail {
                message: self.message,
                kind: self.kind.into(),
                param: None,
                code: self.code.map(Into::into),
            },
        };
        let mut response = (self.status, Json(body)).into_response();
        if let Some(secs) = self.retry_after {
            response
                .headers_mut()
                .insert(header::RETRY_AFTER, HeaderValue::from(secs));
        }
        response
    }
}

/// The Engram key of an OpenAI-style request (`Authorization: Bearer engram_…` or `X-API-Key`).
async fn owner(state: &AppState, headers: &HeaderMap) -> Result<KeyOwner, OpenAiError> {
    let secret = presented_key(headers).ok_or_else(|| {
        OpenAiError::new(
            StatusCode::UNAUTHORIZED,
            "authentication_error",
            "missing_api_key",
            "Missing API key: send your Engram key as Authorization: Bearer engram_… (the OpenAI SDKs' api_key) or X-API-Key",
        )
    })?;
    Ok(authenticate_key(state, secret).await?)
}

// ---------------------------------------------------------------------------------------------
// The request.

/// An OpenAI Chat Completions request. Every field besides these is passed to the upstream as
/// sent (`temperature`, `tools`, `response_format`, …).
#[derive(ToSchema)]
#[schema(example = json!({"model": "gpt-4o-mini", "messages": [
    {"role": "system", "content": "You are a helpful travel assistant."},
    {"role": "user", "content": "Where should I eat tonight?"}], "stream": false}))]
#[allow(dead_code)]
pub struct ChatRequest {
    /// The upstream's model; the account's default model when omitted.
    #[schema(max_length = 256)]
    model: Option<String>,
    /// The conversation so far, as OpenAI's API takes it: objects with a `role` and a
    /// `content`.
    #[schema(min_items = 1, value_type = Vec<Object>)]
    messages: Vec<Value>,
    /// Answer as server-sent events, chunk by chunk.
    stream: Option<bool>,
}

fn header_str<'a>(headers: &'a HeaderMap, name: &str) -> Result<Option<&'a str>, OpenAiError> {
    match headers.get(name) {
        None => Ok(None),
        Some(v) => v
            .to_str()
            .map(|s| Some(s.trim()).filter(|s| !s.is_empty()))
            .map_err(|_| {
                OpenAiError::bad_request("invalid_header", format!("{name} is not valid text"))
            }),
    }
}

fn switch(headers: &HeaderMap, name: &str) -> Result<bool, OpenAiError> {
    match header_str(headers, name)?
        .map(str::to_ascii_lowercase)
        .as_deref()
    {
        None | Some("on") | Some("true") | Some("1") => Ok(true),
        Some("off") | Some("false") | Some("0") => Ok(false),
        Some(other) => Err(OpenAiError::bad_request(
            "invalid_header",
            format!("{name} must be `on` or `off`, not {other:?}"),
        )),
    }
}

fn number(
    headers: &HeaderMap,
    name: &str,
    default: usize,
    max: usize,
) -> Result<usize, OpenAiError> {
    match header_str(headers, name)? {
        None => Ok(default),
        Some(v) => v
            .parse::<usize>()
            .ok()
            .filter(|n| (1..=max).contains(n))
            .ok_or_else(|| {
                OpenAiError::bad_request(
                    "invalid_header",
                    format!("{name} must be a whole number from 1 to {max}, not {v:?}"),
                )
            }),
    }
}

/// The proxy's controls, from the request's `X-Engram-*` headers.
fn read_controls(headers: &HeaderMap) -> Result<Controls, OpenAiError> {
    let text = |name: &str, max: usize| -> Result<Option<String>, OpenAiError> {
        match header_str(headers, name)? {
            Some(v) if v.chars().count() > max => Err(OpenAiError::bad_request(
                "invalid_header",
                format!("{name} is longer than {max} characters"),
            )),
            v => Ok(v.map(str::to_string)),
        }
    };
    Ok(Controls {
        inject: switch(headers, "x-engram-inject")?,
        remember: switch(headers, "x-engram-remember")?,
        project: text("x-engram-project", 256)?,
        conversation: text("x-engram-conversation", 256)?,
        limit: number(
            headers,
            "x-engram-limit",
            proxy::DEFAULT_LIMIT,
            proxy::MAX_LIMIT,
        )?,
        budget: number(
            headers,
            "x-engram-budget",
            proxy::DEFAULT_BUDGET,
            proxy::MAX_BUDGET,
        )?,
    })
}

/// The body as OpenAI's API would accept it: an object with a non-empty `messages` list of
/// objects, each with a string `role`.
fn read_body(bytes: &[u8]) -> Result<Map<String, Value>, OpenAiError> {
    let value: Value = serde_json::from_slice(bytes).map_err(|e| {
        OpenAiError::bad_request("invalid_json", format!("The body is not valid JSON: {e}"))
    })?;
    let Value::Object(body) = value else {
        return Err(OpenAiError::bad_request(
            "invalid_request",
            "The body must be a JSON object",
        ));
    };
    match body.get("messages") {
        Some(Value::Array(m)) if !m.is_empty() => {
            for (i, message) in m.iter().enumerate() {
                if !message.is_object() || !message["role"].is_string() {
                    return Err(OpenAiError::bad_request(
                        "invalid_value",
                        format!("messages[{i}] must be an object with a string `role`"),
                    ));
                }
            }
        }
        Some(Value::Array(_)) => {
            return Err(OpenAiError::bad_request(
                "invalid_value",
                "messages must not be empty",
            ))
        }
        _ => {
            return Err(OpenAiError::bad_request(
                "missing_required_parameter",
                "messages is required: a list of {role, content} objects",
            ))
        }
    }
    match body.get("model") {
        None | Some(Value::Null) | Some(Value::String(_)) => {}
        Some(_) => {
            return Err(OpenAiError::bad_request(
                "invalid_value",
                "model must be a string",
            ))
        }
    }
    match body.get("stream") {
        None | Some(Value::Null) | Some(Value::Bool(_)) => {}
        Some(_) => {
            return Err(OpenAiError::bad_request(
                "invalid_value",
                "stream must be a boolean",
            ))
        }
    }
    Ok(body)
}

// ---------------------------------------------------------------------------------------------
// The route.

#[utoipa::path(post, path = "/api/v1/chat/completions", tag = "openai",
    security(("api_key" = []), ("bearer_key" = [])),
    request_body = ChatRequest,
    params(
        ("X-Engram-Inject" = Option<String>, Header, description = "`off` forwards the messages untouched"),
        ("X-Engram-Remember" = Option<String>, Header, description = "`off` does not store the exchange"),
        ("X-Engram-Project" = Option<String>, Header, description = "The project searched and remembered into (id or name); all projects are searched and `default` remembered into when omitted"),
        ("X-Engram-Conversation" = Option<String>, Header, description = "The conversation to append the exchange to: its id, or your own id for it (created on first use); a new conversation when omitted"),
        ("X-Engram-Limit" = Option<String>, Header, description = "Most memories injected, 1 to 50 (default 5)"),
        ("X-Engram-Budget" = Option<String>, Header, description = "Most tokens of injected memories, 1 to 32000 (default 1000)"),
    ),
    responses(
        (status = 200, description = "The upstream's answer, as it sent it (JSON, or server-sent events with `stream: true`); headers `X-Engram-Memories` (injected memory ids, comma-separated) and `X-Engram-Conversation`",
            content_type = "application/json", body = serde_json::Value),
        (status = 400, description = "A body OpenAI would refuse, a bad control header, or no upstream configured", body = OpenAiErrorBody),
        (status = 401, description = "Missing or invalid Engram key", body = OpenAiErrorBody),
        (status = 404, description = "Unknown project", body = OpenAiErrorBody),
        (status = 413, description = "Request body over 16 MiB", body = OpenAiErrorBody),
        (status = 502, description = "The upstream cannot be reached", body = OpenAiErrorBody),
        (status = 504, description = "The upstream did not answer in time", body = OpenAiErrorBody),
    ))]
/// OpenAI-compatible chat completions, with the user's memories injected and the exchange
/// remembered. The upstream's own errors are passed through with their status.
pub async fn chat_completions(
    State(state): State<AppState>,
    headers: HeaderMap,
    body: HttpBody,
) -> Response {
    // A chat carries its whole history (and images, base64): a limit of its own, not the API's.
    let body = match axum::body::to_bytes(body, CHAT_BODY_LIMIT).await {
        Ok(b) => b,
        Err(_) => {
            return OpenAiError::new(
                StatusCode::PAYLOAD_TOO_LARGE,
                "invalid_request_error",
                "request_too_large",
                format!(
                    "Request body too large (limit {} MiB)",
                    CHAT_BODY_LIMIT >> 20
                ),
            )
            .into_response()
        }
    };
    match complete(state, headers, body).await {
        Ok(response) => response,
        Err(e) => e.into_response(),
    }
}

async fn complete(
    state: AppState,
    headers: HeaderMap,
    bytes: Bytes,
) -> Result<Response, OpenAiError> {
    let owner = owner(&state, &headers).await?;
    let controls = read_controls(&headers)?;
    let body = read_body(&bytes)?;
    let stream = body.get("stream").and_then(Value::as_bool).unwrap_or(false);
    let prepared = match proxy::prepare(&state, owner.user_id, &controls, body).await {
        Ok(p) => p,
        Err(Refused::App(e)) => return Err(e.into()),
        Err(r @ Refused::NoUpstream) => {
            return Err(OpenAiError::bad_request(
                "upstream_not_configured",
                r.message(),
            ))
        }
        Err(r @ Refused::NoModel) => {
            return Err(OpenAiError::bad_request(
                "missing_required_parameter",
                r.message(),
            ))
        }
    };
    let Prepared {
        upstream,
        body,
        injected,
        conversation_id,
        warning,
        exchange,
    } = prepared;
    let started = exchange.started;

    let timeout = state.settings.proxy.timeout;
    let url = format!(
        "{}/chat/completions",
        upstream.base_url.trim_end_matches('/')
    );
    let mut request = proxy::upstream_client()
        .post(&url)
        .json(&Value::Object(body));
    if let Some(key) = &upstream.api_key {
        request = request.bearer_auth(key);
    }
    if stream {
        request = request.header(header::ACCEPT, "text/event-stream");
    }
    let sent = tokio::time::timeout(timeout, request.send()).await;
    let response = match sent {
        Err(_) => {
            tokio::spawn(exchange.finish(504, false, None, None, None));
            return Err(upstream_timeout(timeout));
        }
        Ok(Err(e)) => {
            tracing::warn!(error = %e, url, "upstream unreachable");
            tokio::spawn(exchange.finish(502, false, None, None, None));
            return Err(OpenAiError::new(
                StatusCode::BAD_GATEWAY,
                "upstream_error",
                "upstream_unreachable",
                format!(
                    "The upstream LLM at {} cannot be reached",
                    upstream.base_url
                ),
            ));
        }
        Ok(Ok(r)) => r,
    };
    let status = response.status();
    let first_byte = started.elapsed();
    let mut out = HeaderMap::new();
    let ids: Vec<&str> = injected.iter().map(|i| i.id.as_str()).collect();
    out.insert(
        HeaderName::from_static("x-engram-memories"),
        HeaderValue::from_str(&ids.join(",")).expect("uuids are header-safe"),
    );
    if let Some(id) = conversation_id {
        out.insert(
            HeaderName::from_static("x-engram-conversation"),
            HeaderValue::from_str(&id.to_string()).expect("a uuid is header-safe"),
        );
    }
    if let Some(warning) = warning {
        let safe = warning.replace(|c: char| !c.is_ascii() || c.is_ascii_control(), "?");
        if let Ok(v) = HeaderValue::from_str(&safe) {
            out.insert(HeaderName::from_static("x-engram-warning"), v);
        }
    }
    if let Some(ct) = response.headers().get(header::CONTENT_TYPE) {
        out.insert(header::CONTENT_TYPE, ct.clone());
    }

    if !status.is_success() || !stream {
        // The whole answer, then passed through with the upstream's status.
        let read = tokio::time::timeout(timeout, response.bytes()).await;
        let body = match read {
            Err(_) => {
                tokio::spawn(exchange.finish(504, false, None, None, Some(first_byte)));
                return Err(upstream_timeout(timeout));
            }
            Ok(Err(e)) => {
                tracing::warn!(error = %e, "reading the upstream's answer");
                tokio::spawn(exchange.finish(502, false, None, None, Some(first_byte)));
                return Err(OpenAiError::new(
                    StatusCode::BAD_GATEWAY,
                    "upstream_error",
                    "upstream_broken",
                    "The upstream LLM's answer broke off",
                ));
            }
            Ok(Ok(b)) => b,
        };
        let parsed: Option<Value> = serde_json::from_slice(&body).ok();
        let body =
            if status.is_success() || parsed.as_ref().is_some_and(|v| v.get("error").is_some()) {
                body
            } else {
                // An upstream error that is not OpenAI-shaped: wrapped, so clients can read it.
                out.insert(
                    header::CONTENT_TYPE,
                    HeaderValue::from_static("application/json"),
                );
                let text: String = String::from_utf8_lossy(&body).chars().take(2000).collect();
                Bytes::from(
                    serde_json::to_vec(&json!({"error": {
                "message": format!("The upstream LLM answered {status}: {text}"),
                "type": "upstream_error", "param": null, "code": "upstream_error"}}))
                    .unwrap_or_default(),
                )
            };
        let reply = parsed
            .as_ref()
            .filter(|_| status.is_success())
            .and_then(|v| v["choices"][0]["message"]["content"].as_str())
            .map(str::to_string);
        let usage = parsed.as_ref().and_then(proxy::usage_of);
        let code = status.as_u16();
        tokio::spawn(exchange.finish(code, status.is_success(), reply, usage, Some(first_byte)));
        let status = StatusCode::from_u16(code).unwrap_or(StatusCode::BAD_GATEWAY);
        return Ok((status, out, body).into_response());
    }

    // Streaming: each chunk passed on as it arrives, the reply assembled beside.
    let tap = Arc::new(Mutex::new(Tap::default()));
    let guard = StreamEnd {
        tap: tap.clone(),
        exchange: Some(exchange),
        first_byte,
    };
    let chunks = futures::stream::unfold(
        (response, tap, guard),
        move |(mut response, tap, guard)| async move {
            match tokio::time::timeout(timeout, response.chunk()).await {
                Ok(Ok(Some(chunk))) => {
                    tap.lock().expect("tap").feed(&chunk);
                    Some((Ok::<Bytes, std::io::Error>(chunk), (response, tap, guard)))
                }
                Ok(Ok(None)) => {
                    tap.lock().expect("tap").ended = true;
                    None
                }
                Ok(Err(e)) => {
                    tracing::warn!(error = %e, "the upstream's stream broke off");
                    tap.lock().expect("tap").broken = true;
                    None
                }
                Err(_) => {
                    tracing::warn!("the upstream's stream stalled past the timeout");
                    tap.lock().expect("tap").broken = true;
                    None
                }
            }
        },
    );
    out.insert(header::CACHE_CONTROL, HeaderValue::from_static("no-cache"));
    Ok((StatusCode::OK, out, HttpBody::from_stream(chunks)).into_response())
}

fn upstream_timeout(timeout: Duration) -> OpenAiError {
    OpenAiError::new(
        StatusCode::GATEWAY_TIMEOUT,
        "timeout_error",
        "upstream_timeout",
        format!(
            "The upstream LLM did not answer within {} s",
            timeout.as_secs()
        ),
    )
}

/// What a stream carried so far: its reply's text, its usage if the upstream sent it, and
/// whether it ended.
#[derive(Default)]
struct Tap {
    pending: Vec<u8>,
    reply: String,
    usage: Option<(i64, i64)>,
    done: bool,
    ended: bool,
    broken: bool,
}

impl Tap {
    /// Reads the complete `data:` lines of the server-sent events so far.
    fn feed(&mut self, chunk: &[u8]) {
        self.pending.extend_from_slice(chunk);
        while let Some(end) = self.pending.iter().position(|&b| b == b'\n') {
            let line: Vec<u8> = self.pending.drain(..=end).collect();
            let line = String::from_utf8_lossy(&line);
            let Some(data) = line.trim().strip_prefix("data:") else {
                continue;
            };
            let data = data.trim();
            if data == "[DONE]" {
                self.done = true;
                continue;
            }
            if let Ok(v) = serde_json::from_str::<Value>(data) {
                if let Some(text) = v["choices"][0]["delta"]["content"].as_str() {
                    self.reply.push_str(text);
                }
                if let Some(u) = proxy::usage_of(&v) {
                    self.usage = Some(u);
                }
            }
        }
    }
}

/// Ends a streamed exchange when its body is dropped: at the stream's end, or when the client
/// went away (then the reply is not remembered, being cut short; the user's turn is).
struct StreamEnd {
    tap: Arc<Mutex<Tap>>,
    exchange: Option<proxy::Exchange>,
    first_byte: Duration,
}

impl Drop for StreamEnd {
    fn drop(&mut self) {
        let Some(exchange) = self.exchange.take() else {
            return;
        };
        let tap = std::mem::take(&mut *self.tap.lock().expect("tap"));
        let complete = tap.done || tap.ended;
        let reply = complete.then_some(tap.reply);
        // Recorded as 502 when the upstream broke off, 499 (nginx's code) when the client left.
        let status = match (complete, tap.broken) {
            (true, _) => 200,
            (false, true) => 502,
            (false, false) => 499,
        };
        let first_byte = self.first_byte;
        if let Ok(runtime) = tokio::runtime::Handle::try_current() {
            runtime.spawn(exchange.finish(status, true, reply, tap.usage, Some(first_byte)));
        }
    }
}

// ---------------------------------------------------------------------------------------------
// Models.

/// A model as OpenAI's `GET /models` lists it.
#[derive(Serialize, ToSchema)]
pub struct OpenAiModel {
    pub id: String,
    /// Always `model`.
    pub object: String,
    pub created: i64,
    pub owned_by: String,
}

/// OpenAI's model list.
#[derive(Serialize, ToSchema)]
pub struct OpenAiModelList {
    /// Always `list`.
    pub object: String,
    pub data: Vec<OpenAiModel>,
}

#[utoipa::path(get, path = "/api/v1/models", tag = "openai",
    security(("api_key" = []), ("bearer_key" = [])),
    responses(
        (status = 200, description = "The chat models of the account's upstream provider, from the model catalogue (every provider's when the provider is not known), and the account's default model", body = OpenAiModelList),
        (status = 401, description = "Missing or invalid Engram key", body = OpenAiErrorBody),
    ))]
/// OpenAI's model list, for the account's upstream.
pub async fn list_models(State(state): State<AppState>, headers: HeaderMap) -> Response {
    let listed = async {
        let owner = owner(&state, &headers).await?;
        let upstream =
            proxy::upstream_for(&state.pool, &state.settings.proxy, owner.user_id).await?;
        let catalogue = state.models.get(&state.pool).await?;
        let provider = upstream.as_ref().and_then(|u| u.provider.clone());
        let mut data: Vec<OpenAiModel> = catalogue
            .chat_models(provider.as_deref())
            .into_iter()
            .map(|(id, m)| OpenAiModel {
                id,
                object: "model".into(),
                created: 0,
                owned_by: m.provider.clone(),
            })
            .collect();
        if let Some(default) = upstream.as_ref().and_then(|u| u.model.clone()) {
            if !data.iter().any(|m| m.id == default) {
                data.insert(
                    0,
                    OpenAiModel {
                        id: default,
                        object: "model".into(),
                        created: 0,
                        owned_by: provider.unwrap_or_else(|| "upstream".into()),
                    },
                );
            }
        }
        Ok::<_, OpenAiError>(Json(OpenAiModelList {
            object: "list".into(),
            data,
        }))
    };
    match listed.await {
        Ok(list) => list.into_response(),
        Err(e) => e.into_response(),
    }
}

// ---------------------------------------------------------------------------------------------
// Settings.

/// The account's upstream, its key masked.
#[derive(Serialize, ToSchema)]
pub struct UpstreamAnswer {
    pub success: bool,
    pub data: UpstreamView,
}

#[utoipa::path(get, path = "/api/v1/proxy/settings", tag = "proxy",
    security(("api_key" = [])),
    responses((status = 200, description = "The account's upstream (`source: account`), else the server's default (`server`), else `none`; the API key only as its last four characters", body = UpstreamAnswer)))]
/// Read the proxy's upstream for this account.
pub async fn get_proxy_settings(
    State(state): State<AppState>,
    ApiKeyAuth(owner): ApiKeyAuth,
) -> Result<Json<UpstreamAnswer>, AppError> {
    let data = proxy::view_upstream(&state.pool, &state.settings.proxy, owner.user_id).await?;
    Ok(Json(UpstreamAnswer {
        success: true,
        data,
    }))
}

#[utoipa::path(put, path = "/api/v1/proxy/settings", tag = "proxy",
    security(("api_key" = [])),
    request_body = UpstreamUpdate,
    responses(
        (status = 200, description = "Stored; the API key sealed (AES-256-GCM) and shown masked from now on", body = UpstreamAnswer),
        (status = 400, description = "A host this server does not allow", body = ErrorBody),
    ))]
/// Set the account's upstream: an OpenAI-compatible base URL, its API key, a default model.
pub async fn put_proxy_settings(
    State(state): State<AppState>,
    ApiKeyAuth(owner): ApiKeyAuth,
    Body(update): Body<UpstreamUpdate>,
) -> Result<Json<UpstreamAnswer>, AppError> {
    let data =
        proxy::put_upstream(&state.pool, &state.settings.proxy, owner.user_id, &update).await?;
    Ok(Json(UpstreamAnswer {
        success: true,
        data,
    }))
}

#[utoipa::path(delete, path = "/api/v1/proxy/settings", tag = "proxy",
    security(("api_key" = [])),
    responses(
        (status = 200, description = "Forgotten: the server's default upstream applies, if any", body = Message),
        (status = 404, description = "The account has no upstream of its own", body = ErrorBody),
    ))]
/// Forget the account's upstream.
pub async fn delete_proxy_settings(
    State(state): State<AppState>,
    ApiKeyAuth(owner): ApiKeyAuth,
) -> Result<Json<Message>, AppError> {
    if proxy::delete_upstream(&state.pool, owner.user_id).await? {
        Ok(Message::new("Upstream forgotten"))
    } else {
        Err(AppError::not_found("Upstream"))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_tap_assembles_a_reply_from_events_split_anywhere() {
        let events = "data: {\"choices\":[{\"delta\":{\"role\":\"assistant\"}}]}\n\n\
data: {\"choices\":[{\"delta\":{\"content\":\"Hel\"}}]}\n\n\
data: {\"choices\":[{\"delta\":{\"content\":\"lo, Ana\"}}]}\n\n\
data: {\"choices\":[],\"usage\":{\"prompt_tokens\":12,\"completion_tokens\":3}}\n\n\
data: [DONE]\n\n";
        for cut in [1, 7, 40, 100] {
            let mut tap = Tap::default();
            for piece in events.as_bytes().chunks(cut) {
                tap.feed(piece);
            }
            assert_eq!(tap.reply, "Hello, Ana");
            assert_eq!(tap.usage, Some((12, 3)));
            assert!(tap.done);
        }
    }

    #[test]
    fn bodies_openai_would_refuse_are_400() {
        for bad in [
            &b"not json"[..],
            b"[]",
            b"{}",
            br#"{"messages": []}"#,
            br#"{"messages": [{"content": "no role"}]}"#,
            br#"{"messages": [{"role": "user", "content": "x"}], "model": 3}"#,
            br#"{"messages": [{"role": "user", "content": "x"}], "stream": "yes"}"#,
        ] {
            let e = read_body(bad).expect_err("refused");
            assert_eq!(e.status, StatusCode::BAD_REQUEST);
        }
        assert!(read_body(
            br#"{"messages": [{"role": "user", "content": "x"}], "temperature": 0.2}"#
        )
        .is_ok());
    }
}
