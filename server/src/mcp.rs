//! The MCP endpoint at `/mcp`: the Model Context Protocol's streamable HTTP transport (revision
//! 2025-06-18, and 2025-03-26 for older clients), JSON-RPC 2.0 with `initialize`, `ping`,
//! `tools/list` and `tools/call`.
//!
//! The transport is written here rather than taken from an SDK: the server answers every POST
//! with one JSON body (the spec allows that instead of an SSE stream), keeps no session (so any
//! `engram serve` process behind a balancer can answer any request), and each tool reads its
//! arguments with the same `FromFields` rules and calls the same domain function as its REST
//! route. rmcp (the SDK on crates.io) brings its own session manager and schemars-derived
//! schemas beside the utoipa ones the REST document uses; what we need of it is ~300 lines.
//!
//! Authentication is the API's: `X-API-Key` or `Authorization: Bearer engram_…`, checked before
//! the body is read; a missing or dead key is 401 and no tool runs.
use std::time::Duration;

use axum::body::Bytes;
use axum::extract::State;
use axum::http::{header, HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::post;
use axum::{Json, Router};
use serde_json::{json, Value};

use crate::api::extract::{authenticate_key, bearer_unauthorized, presented_key};
use crate::api::memories::{run_search, ListQuery, SearchRequest};
use app::core::error::AppError;
use app::core::keys::KeyOwner;
use app::core::memories::{self, NewMemory};
use app::core::state::AppState;
use app::core::validate::{Fields, FromFields};
use app::core::{projects, tasks};

/// The newest revision we speak; the older one we accept.
pub const PROTOCOL_VERSION: &str = "2025-06-18";
pub const PROTOCOL_VERSIONS: [&str; 2] = ["2025-06-18", "2025-03-26"];

/// How long `add_memory` waits for its task at most (seconds); the default.
const MAX_WAIT_SECS: f64 = 10.0;
const DEFAULT_WAIT_SECS: f64 = 3.0;

pub fn router() -> Router<AppState> {
    Router::new().route("/mcp", post(handle).get(no_stream).delete(no_stream))
}

/// No server-initiated stream and no sessions to end: 405, as the transport specifies.
async fn no_stream() -> Response {
    (
        StatusCode::METHOD_NOT_ALLOWED,
        [(header::ALLOW, "POST")],
        Json(json!({"success": false, "detail": "This MCP server answers POST only (no SSE stream, no sessions)"})),
    )
        .into_response()
}

/// A browser page of another site must not drive a local server (DNS rebinding): a request
/// with an `Origin` must come from this host.
fn foreign_origin(headers: &HeaderMap) -> bool {
    let Some(origin) = headers.get(header::ORIGIN).and_then(|v| v.to_str().ok()) else {
        return false;
    };
    let host = headers
        .get(header::HOST)
        .and_then(|v| v.to_str().ok())
        .unwrap_or_default();
    let origin_host = origin.split("://").nth(1).unwrap_or(origin);
    origin_host != host
}

fn rpc_error(id: Value, code: i64, message: &str) -> Value {
    json!({"jsonrpc": "2.0", "id": id, "error": {"code": code, "message": message}})
}

async fn handle(State(state): State<AppState>, headers: HeaderMap, body: Bytes) -> Response {
    if foreign_origin(&headers) {
        return (
            StatusCode::FORBIDDEN,
            Json(json!({"success": false, "detail": "Cross-origin MCP requests are refused"})),
        )
            .into_response();
    }
    let Some(secret) = presented_key(&headers) else {
        return bearer_unauthorized(
            "Missing API key: send it in X-API-Key or as Authorization: Bearer engram_…",
        );
    };
    let owner = match authenticate_key(&state, secret).await {
        Ok(owner) => owner,
        Err(AppError::Unauthorized(msg)) => return bearer_unauthorized(&msg),
        Err(e) => return e.into_response(),
    };
    if let Some(v) = headers.get("mcp-protocol-version") {
        let known = v.to_str().is_ok_and(|v| PROTOCOL_VERSIONS.contains(&v));
        if !known {
            return (
                StatusCode::BAD_REQUEST,
                Json(rpc_error(
                    Value::Null,
                    -32600,
                    "Unsupported MCP-Protocol-Version",
                )),
            )
                .into_response();
        }
    }
    let message: Value = match serde_json::from_slice(&body) {
        Ok(v) => v,
        Err(_) => {
            return (
                StatusCode::BAD_REQUEST,
                Json(rpc_error(Value::Null, -32700, "Parse error")),
            )
                .into_response()
        }
    };
    // 2025-03-26 allowed a batch of messages in one POST.
    let answers = match message {
        Value::Array(batch) if !batch.is_empty() => {
            let mut answers = Vec::new();
            for m in batch {
                answers.extend(answer(&state, owner, m).await);
            }
            (!answers.is_empty()).then_some(Value::Array(answers))
        }
        m => answer(&state, owner, m).await,
    };
    match answers {
        Some(v) => Json(v).into_response(),
        // Only notifications or responses: accepted, nothing to answer.
        None => StatusCode::ACCEPTED.into_response(),
    }
}

/// The answer to one message; none for a notification or a response.
async fn answer(state: &AppState, owner: KeyOwner, message: Value) -> Option<Value> {
    let Value::Object(m) = message else {
        return Some(rpc_error(Value::Null, -32600, "Invalid Request"));
    };
    let id = m.get("id").cloned();
    let Some(method) = m.get("method").and_then(Value::as_str) else {
        // A response to a request of ours (we send none), or garbage.
        return id.map(|id| rpc_error(id, -32600, "Invalid Request"));
    };
    let id = id?; // A notification (`notifications/initialized`…): nothing to answer.
    if m.get("jsonrpc") != Some(&json!("2.0")) {
        return Some(rpc_error(
            id,
            -32600,
            "Invalid Request: jsonrpc must be \"2.0\"",
        ));
    }
    let params = m.get("params").cloned().unwrap_or(json!({}));
    let result = match method {
        "initialize" => Ok(initialize(&params)),
        "ping" => Ok(json!({})),
        "tools/list" => Ok(json!({"tools": tool_list()})),
        "tools/call" => call_tool(state, owner, &params).await,
        _ => Err((-32601, format!("Method not found: {method}"))),
    };
    Some(match result {
        Ok(result) => json!({"jsonrpc": "2.0", "id": id, "result": result}),
        Err((code, message)) => rpc_error(id, code, &message),
    })
}

fn initialize(params: &Value) -> Value {
    let asked = params
        .get("protocolVersion")
        .and_then(Value::as_str)
        .unwrap_or(PROTOCOL_VERSION);
    let version = if PROTOCOL_VERSIONS.contains(&asked) {
        asked
    } else {
        PROTOCOL_VERSION
    };
    json!({
        "protocolVersion": version,
        "capabilities": {"tools": {"listChanged": false}},
        "serverInfo": {"name": "engram", "title": "Engram memory", "version": env!("CARGO_PKG_VERSION")},
        "instructions": "Engram stores memories for this user or machine and finds them again. \
            Before answering, search_memories for what you may already know; when you learn a \
            durable fact, preference, plan or lesson, add_memory it (one idea per memory)."
    })
}

/// The tools, with input schemas an LLM can follow.
fn tool_list() -> Value {
    let project = json!({"type": "string", "description": "A project's id or name. Omit for the `default` project (or, when searching and listing, for all projects)."});
    json!([
        {
            "name": "add_memory",
            "title": "Add a memory",
            "description": "Store one memory (a fact, preference, event, procedure or insight, in a sentence or two). It is embedded and classified into a cognitive sector with an importance score. Waits up to wait_seconds for it to be stored and returns its memory_id; otherwise returns the task_id to check later with get_task.",
            "inputSchema": {
                "type": "object",
                "properties": {
                    "content": {"type": "string", "minLength": 1, "maxLength": 32768, "description": "The memory's text."},
                    "project_id": project,
                    "metadata": {"type": "object", "description": "Optional JSON object (at most 16 KiB), e.g. {\"source\": \"chat\"}."},
                    "agent_id": {"type": "string", "maxLength": 128, "description": "Optional: which agent stored it."},
                    "wait_seconds": {"type": "number", "minimum": 0, "maximum": MAX_WAIT_SECS, "default": DEFAULT_WAIT_SECS, "description": "How long to wait for the memory to be stored (0 returns at once)."}
                },
                "required": ["content"],
                "additionalProperties": false
            }
        },
        {
            "name": "search_memories",
            "title": "Search memories",
            "description": "Find the stored memories most relevant to a question or topic (hybrid: meaning and keywords). Returns up to `limit` memories, best first, each with a score in [0, 1], its sector and when it was stored.",
            "inputSchema": {
                "type": "object",
                "properties": {
                    "query": {"type": "string", "minLength": 1, "maxLength": 4096, "description": "What to look for, in natural language."},
                    "project_id": project,
                    "limit": {"type": "integer", "minimum": 1, "maximum": 100, "default": 10}
                },
                "required": ["query"],
                "additionalProperties": false
            }
        },
        {
            "name": "list_memories",
            "title": "List memories",
            "description": "List stored memories, newest first, a page at a time; `total` counts them all.",
            "inputSchema": {
                "type": "object",
                "properties": {
                    "project_id": project,
                    "limit": {"type": "integer", "minimum": 1, "maximum": 1000, "default": 100},
                    "offset": {"type": "integer", "minimum": 0, "default": 0}
                },
                "additionalProperties": false
            }
        },
        {
            "name": "get_memory",
            "title": "Get a memory",
            "description": "Read one memory by its id.",
            "inputSchema": {
                "type": "object",
                "properties": {"memory_id": {"type": "string", "description": "The memory's id (a UUID)."}},
                "required": ["memory_id"],
                "additionalProperties": false
            }
        },
        {
            "name": "delete_memory",
            "title": "Delete a memory",
            "description": "Delete one memory by its id, permanently. Use when the user asks to forget something or a memory is wrong.",
            "inputSchema": {
                "type": "object",
                "properties": {"memory_id": {"type": "string", "description": "The memory's id (a UUID)."}},
                "required": ["memory_id"],
                "additionalProperties": false
            },
            "annotations": {"destructiveHint": true}
        },
        {
            "name": "list_projects",
            "title": "List projects",
            "description": "List the projects memories are grouped in, with how many memories each holds.",
            "inputSchema": {"type": "object", "properties": {}, "additionalProperties": false}
        },
        {
            "name": "get_task",
            "title": "Get a task",
            "description": "Check a queued memory's task: pending, processing, completed (with memory_id, sector and importance) or failed (with an error).",
            "inputSchema": {
                "type": "object",
                "properties": {"task_id": {"type": "string", "description": "The task_id add_memory returned."}},
                "required": ["task_id"],
                "additionalProperties": false
            }
        }
    ])
}

/// The tools' names, as [`tool_list`] describes them.
const TOOLS: [&str; 7] = [
    "add_memory",
    "search_memories",
    "list_memories",
    "get_memory",
    "delete_memory",
    "list_projects",
    "get_task",
];

/// A tool's own failure (bad arguments, an unknown id): a result with `isError`, so the model
/// can read it and try again, as the protocol asks.
fn tool_error(e: AppError) -> Value {
    let text = match &e {
        AppError::Validation(errors) => errors
            .iter()
            .map(|e| format!("{}: {}", e.field(), e.msg))
            .collect::<Vec<_>>()
            .join("; "),
        other => other.user_message(),
    };
    json!({"content": [{"type": "text", "text": text}], "isError": true})
}

fn tool_result(value: Value) -> Value {
    json!({
        "content": [{"type": "text", "text": value.to_string()}],
        "structuredContent": value,
        "isError": false
    })
}

async fn call_tool(
    state: &AppState,
    owner: KeyOwner,
    params: &Value,
) -> Result<Value, (i64, String)> {
    let name = params
        .get("name")
        .and_then(Value::as_str)
        .ok_or((-32602, "Invalid params: `name` is required".to_string()))?;
    if !TOOLS.contains(&name) {
        return Err((-32602, format!("Unknown tool: {name}")));
    }
    let args = params.get("arguments").cloned().unwrap_or(json!({}));
    let run = async {
        let fields = Fields::from_value(args)?;
        let user = owner.user_id;
        Ok::<Value, AppError>(match name {
            "add_memory" => {
                let mut fields = fields;
                let wait = match fields.raw("wait_seconds").cloned() {
                    None | Some(Value::Null) => DEFAULT_WAIT_SECS,
                    Some(v) => match v.as_f64() {
                        Some(w) if (0.0..=MAX_WAIT_SECS).contains(&w) => w,
                        _ => {
                            fields.error(
                                "wait_seconds",
                                "value_error",
                                format!("wait_seconds must be a number from 0 to {MAX_WAIT_SECS}"),
                                None,
                            );
                            0.0
                        }
                    },
                };
                let new = NewMemory::read(fields)?;
                let task_id = memories::enqueue(state, user, &new).await?.to_string();
                let deadline = tokio::time::Instant::now() + Duration::from_secs_f64(wait);
                let mut task = tasks::get(&state.pool, user, &task_id).await?;
                while matches!(task.status.as_str(), "pending" | "processing")
                    && tokio::time::Instant::now() < deadline
                {
                    tokio::time::sleep(Duration::from_millis(25)).await;
                    task = tasks::get(&state.pool, user, &task_id).await?;
                }
                json!(task)
            }
            "search_memories" => {
                let req = SearchRequest::read(fields)?;
                json!({"query": req.query.clone(), "results": run_search(state, user, &req).await?})
            }
            "list_memories" => {
                let q = ListQuery::read(fields)?;
                let (data, total) = memories::list(
                    &state.pool,
                    user,
                    q.project_id.as_deref(),
                    q.limit,
                    q.offset,
                )
                .await?;
                json!({"memories": data, "total": total, "limit": q.limit, "offset": q.offset})
            }
            "get_memory" | "delete_memory" => {
                let id = IdArg::read("memory_id", fields)?;
                if name == "get_memory" {
                    json!(memories::get(&state.pool, user, &id).await?)
                } else {
                    memories::delete(&state.pool, user, &id).await?;
                    json!({"deleted": id})
                }
            }
            "list_projects" => {
                json!({"projects": projects::list(&state.pool, user).await?})
            }
            "get_task" => {
                let id = IdArg::read("task_id", fields)?;
                json!(tasks::get(&state.pool, user, &id).await?)
            }
            _ => unreachable!("unknown tools are refused above"),
        })
    };
    Ok(match run.await {
        Ok(value) => tool_result(value),
        Err(e @ (AppError::Internal(_) | AppError::Unavailable)) => {
            if let AppError::Internal(cause) = &e {
                tracing::error!(error = ?cause, tool = name, "MCP tool failed");
            }
            return Err((-32603, e.user_message()));
        }
        Err(e) => tool_error(e),
    })
}

/// One required id argument.
struct IdArg;

impl IdArg {
    fn read(name: &str, mut fields: Fields) -> Result<String, AppError> {
        let id = fields.required_str(name, 1, 64);
        fields.finish().map(|()| id)
    }
}
