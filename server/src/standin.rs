//! A stand-in for an OpenAI-compatible LLM (`engram stand-in-llm`), for the proxy's tests, its
//! bench and trying the chat page without a provider. It records every request it receives
//! (`GET /_requests`) and answers deterministically:
//!
//! - the reply is `Stand-in reply to: <last user message>`, followed by
//!   ` | memories: <each injected memory>` when the request carries Engram's memory message, so
//!   a test can see what was injected in the reply itself;
//! - `stream: true` sends the reply word by word as server-sent events (`delay_ms` apart), with
//!   a usage chunk when `stream_options.include_usage` is set;
//! - a last user message containing `[hold]` streams its first word, then waits for
//!   `POST /_release` before the rest (the test of "no buffering");
//! - model `error-500` / `error-429` answers that error in OpenAI's shape; model `slow` waits
//!   `slow_ms` before answering;
//! - started with a key, any other bearer token is 401.
//!
//! The real upstream is one setting away: `ENGRAM_UPSTREAM_BASE_URL`, or an account's own.
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::body::Body;
use axum::extract::State;
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Json, Router};
use serde_json::{json, Value};
use tokio::sync::Notify;

/// What the stand-in received and did.
#[derive(Default)]
pub struct Recorder {
    /// Each request: `{"authorization": …, "body": …}`.
    pub requests: Mutex<Vec<Value>>,
    /// Streams the client abandoned before their end.
    pub cancelled: AtomicU64,
    /// Streams sent to their end.
    pub finished: AtomicU64,
    release: Notify,
}

impl Recorder {
    pub fn requests(&self) -> Vec<Value> {
        self.requests.lock().expect("recorder").clone()
    }
    /// The latest request.
    pub fn last(&self) -> Option<Value> {
        self.requests.lock().expect("recorder").last().cloned()
    }
    /// Lets a held stream (`[hold]`) go on.
    pub fn release(&self) {
        self.release.notify_waiters();
        self.release.notify_one();
    }
}

/// How the stand-in behaves.
#[derive(Clone, Debug)]
pub struct Options {
    /// Required bearer token, if any.
    pub key: Option<String>,
    /// Pause between streamed words.
    pub delay_ms: u64,
    /// Pause of model `slow`.
    pub slow_ms: u64,
}

impl Default for Options {
    fn default() -> Self {
        Self {
            key: None,
            delay_ms: 5,
            slow_ms: 3_000,
        }
    }
}

#[derive(Clone)]
struct StandIn {
    recorder: Arc<Recorder>,
    options: Options,
}

/// The stand-in's routes (both `/v1/…` and bare, as base URLs differ).
pub fn router(options: Options) -> (Router, Arc<Recorder>) {
    let recorder = Arc::new(Recorder::default());
    let state = StandIn {
        recorder: recorder.clone(),
        options,
    };
    let router = Router::new()
        .route("/v1/chat/completions", post(completions))
        .route("/chat/completions", post(completions))
        .route("/v1/models", get(models))
        .route("/models", get(models))
        .route("/_requests", get(requests).delete(clear))
        .route("/_release", post(release))
        .with_state(state);
    (router, recorder)
}

/// Serves the stand-in on `listener` until the process ends.
pub async fn serve(listener: tokio::net::TcpListener, options: Options) -> anyhow::Result<()> {
    let (router, _) = router(options);
    axum::serve(listener, router).await?;
    Ok(())
}

/// Starts the stand-in on a free loopback port: its base URL (ending in `/v1`) and recorder.
pub async fn spawn(options: Options) -> (String, Arc<Recorder>) {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("binding the stand-in");
    let addr = listener.local_addr().expect("the stand-in's address");
    let (router, recorder) = router(options);
    tokio::spawn(async move { axum::serve(listener, router).await });
    (format!("http://{addr}/v1"), recorder)
}

async fn requests(State(s): State<StandIn>) -> Json<Vec<Value>> {
    Json(s.recorder.requests())
}

async fn clear(State(s): State<StandIn>) -> StatusCode {
    s.recorder.requests.lock().expect("recorder").clear();
    StatusCode::NO_CONTENT
}

async fn release(State(s): State<StandIn>) -> StatusCode {
    s.recorder.release();
    StatusCode::NO_CONTENT
}

async fn models() -> Json<Value> {
    Json(json!({"object": "list", "data": [
        {"id": "standin-small", "object": "model", "created": 0, "owned_by": "standin"},
        {"id": "standin-large", "object": "model", "created": 0, "owned_by": "standin"}
    ]}))
}

fn error(status: StatusCode, kind: &str, message: &str) -> Response {
    (
        status,
        Json(json!({"error": {"message": message, "type": kind, "param": null, "code": kind}})),
    )
        .into_response()
}

fn text_of(message: &Value) -> String {
    match &message["content"] {
        Value::String(s) => s.clone(),
        Value::Array(parts) => parts
            .iter()
            .filter_map(|p| p["text"].as_str())
            .collect::<Vec<_>>()
            .join(" "),
        _ => String::new(),
    }
}

/// The reply: the last user message, and the memories Engram injected, if any.
fn reply_to(body: &Value) -> String {
    let messages = body["messages"].as_array().cloned().unwrap_or_default();
    let last = messages
        .iter()
        .rev()
        .find(|m| m["role"] == "user")
        .map(text_of)
        .unwrap_or_default();
    let memories: Vec<String> = messages
        .iter()
        .filter(|m| m["role"] == "system")
        .map(text_of)
        .filter(|t| t.starts_with("Relevant memories"))
        .flat_map(|t| {
            t.lines()
                .filter_map(|l| l.strip_prefix("- "))
                .map(str::to_string)
                .collect::<Vec<_>>()
        })
        .collect();
    let mut reply = format!("Stand-in reply to: {}", last.trim());
    if !memories.is_empty() {
        reply.push_str(&format!(" | memories: {}", memories.join("; ")));
    }
    reply
}

async fn completions(
    State(s): State<StandIn>,
    headers: HeaderMap,
    Json(body): Json<Value>,
) -> Response {
    let authorization = headers
        .get("authorization")
        .and_then(|v| v.to_str().ok())
        .map(str::to_string);
    s.recorder
        .requests
        .lock()
        .expect("recorder")
        .push(json!({"authorization": authorization, "x_api_key": headers.get("x-api-key").and_then(|v| v.to_str().ok()), "body": body}));
    if let Some(key) = &s.options.key {
        if authorization.as_deref() != Some(&format!("Bearer {key}")) {
            return error(
                StatusCode::UNAUTHORIZED,
                "invalid_api_key",
                "Incorrect API key provided",
            );
        }
    }
    let model = body["model"]
        .as_str()
        .unwrap_or("standin-small")
        .to_string();
    match model.as_str() {
        "error-500" => {
            return error(
                StatusCode::INTERNAL_SERVER_ERROR,
                "server_error",
                "The stand-in failed on purpose",
            )
        }
        "error-429" => {
            return error(
                StatusCode::TOO_MANY_REQUESTS,
                "rate_limit_exceeded",
                "The stand-in is rate-limited on purpose",
            )
        }
        "slow" => tokio::time::sleep(Duration::from_millis(s.options.slow_ms)).await,
        _ => {}
    }
    let reply = reply_to(&body);
    let prompt_tokens: usize = body["messages"]
        .as_array()
        .map(|m| m.iter().map(|m| text_of(m).len().div_ceil(4) + 4).sum())
        .unwrap_or(0);
    let completion_tokens = reply.len().div_ceil(4);
    let id = format!("chatcmpl-standin-{}", uuid::Uuid::new_v4().simple());
    if body["stream"].as_bool() != Some(true) {
        return Json(json!({
            "id": id, "object": "chat.completion", "created": chrono::Utc::now().timestamp(),
            "model": model,
            "choices": [{"index": 0, "message": {"role": "assistant", "content": reply}, "finish_reason": "stop"}],
            "usage": {"prompt_tokens": prompt_tokens, "completion_tokens": completion_tokens,
                      "total_tokens": prompt_tokens + completion_tokens}
        }))
        .into_response();
    }
    let hold = reply.contains("[hold]");
    let include_usage = body["stream_options"]["include_usage"].as_bool() == Some(true);
    let created = chrono::Utc::now().timestamp();
    let chunk = move |delta: Value, finish: Option<&str>| {
        let v = json!({"id": id, "object": "chat.completion.chunk", "created": created, "model": model,
                       "choices": [{"index": 0, "delta": delta, "finish_reason": finish}]});
        format!("data: {v}\n\n")
    };
    let mut events = vec![chunk(json!({"role": "assistant", "content": ""}), None)];
    let words: Vec<String> = reply.split_inclusive(' ').map(str::to_string).collect();
    for w in &words {
        events.push(chunk(json!({"content": w}), None));
    }
    events.push(chunk(json!({}), Some("stop")));
    if include_usage {
        events.push(format!(
            "data: {}\n\n",
            json!({"object": "chat.completion.chunk", "choices": [],
                   "usage": {"prompt_tokens": prompt_tokens, "completion_tokens": completion_tokens,
                             "total_tokens": prompt_tokens + completion_tokens}})
        ));
    }
    events.push("data: [DONE]\n\n".to_string());
    let (tx, rx) = tokio::sync::mpsc::channel::<Result<String, std::io::Error>>(1);
    let recorder = s.recorder.clone();
    let delay = Duration::from_millis(s.options.delay_ms);
    tokio::spawn(async move {
        for (i, event) in events.into_iter().enumerate() {
            // The first word is sent at once; a held stream then waits to be released.
            if i == 2 && hold {
                tokio::select! {
                    _ = recorder.release.notified() => {}
                    _ = tx.closed() => {}
                }
            } else if i > 1 {
                tokio::time::sleep(delay).await;
            }
            if tx.send(Ok(event)).await.is_err() {
                recorder.cancelled.fetch_add(1, Ordering::SeqCst);
                return;
            }
        }
        recorder.finished.fetch_add(1, Ordering::SeqCst);
    });
    let stream =
        futures::stream::unfold(rx, |mut rx| async move { rx.recv().await.map(|e| (e, rx)) });
    Response::builder()
        .header("content-type", "text/event-stream")
        .header("cache-control", "no-cache")
        .body(Body::from_stream(stream))
        .expect("a stream response")
}
