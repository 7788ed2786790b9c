//! `GET /agent-guide`: plain text an agent can read to connect itself, with this server's URL.
use axum::extract::State;
use axum::http::header;
use axum::response::IntoResponse;
use axum::routing::get;
use axum::Router;

use app::core::state::AppState;

pub fn router() -> Router<AppState> {
    Router::new().route("/agent-guide", get(agent_guide))
}

async fn agent_guide(State(state): State<AppState>) -> impl IntoResponse {
    let base = state.settings.public_url.trim_end_matches('/');
    (
        [(header::CONTENT_TYPE, "text/plain; charset=utf-8")],
        guide(base),
    )
}

/// The guide's text for a server at `base`.
pub fn guide(base: &str) -> String {
    format!(
        r#"# Engram: long-term memory for agents

Engram stores short memories (facts, preferences, events, procedures, insights) and finds them
again by meaning and keyword. Every call below is JSON over HTTP at {base}/api. Errors are
{{"success": false, "detail": ...}}; a 422's detail lists each problem with its field.
The whole reference: {base}/api/openapi.json (OpenAPI 3.1), readable at {base}/api/docs.

## 1. Get a key (once per machine)

If your user gave you an API key (engram_...), use it and skip this step. Otherwise register
this machine. The fingerprint must be stable for the machine (16 to 256 characters of
A-Z a-z 0-9 . _ : -), e.g. a sha256 of its hostname and MAC address:

  curl -s -X POST {base}/api/v1/agents/auto-register \
    -H 'Content-Type: application/json' \
    -d '{{"machine_fingerprint": "<FINGERPRINT>", "platform": "linux", "hostname": "<HOSTNAME>"}}'

The answer's data.api_key is a new key for this machine's account: save it (it is shown once).
All agents on one machine share one pool of memories. A human can later claim the machine into
their own account (POST /api/v1/agents/claim/init with their e-mail); its keys keep working.

## 2. Store a memory

  curl -s -X POST {base}/api/v1/memories \
    -H 'X-API-Key: <KEY>' -H 'Content-Type: application/json' \
    -d '{{"content": "The user prefers answers in French", "metadata": {{"source": "chat"}}}}'

One idea per memory, 1 to 32,768 characters. Optional: "project_id" (a project's id or name,
default "default"), "agent_id" (who stored it). The answer's task_id is queued: a worker embeds
it and classifies it (episodic, semantic, procedural, emotional or reflective, with an
importance score). Poll GET {base}/api/v1/tasks/<TASK_ID> every second or two until
data.status is "completed" (data.memory_id) or "failed" (data.error). Up to 200 memories at
once: POST {base}/api/v1/memories/batch with {{"memories": [{{"content": "..."}}, ...]}}.

## 3. Search before you answer

  curl -s -X POST {base}/api/v1/memories/search \
    -H 'X-API-Key: <KEY>' -H 'Content-Type: application/json' \
    -d '{{"query": "what language does the user prefer?", "limit": 5}}'

data[] holds the best matches first, each with id, content, score (0 to 1), cognitive_sector
and created_at. Without "project_id" the whole account is searched.

## 4. Everything else

- List: GET {base}/api/v1/memories?limit=100&offset=0 (newest first, with total)
- Read or forget one: GET or DELETE {base}/api/v1/memories/<MEMORY_ID>
- Projects: GET or POST {base}/api/v1/projects
- MCP (streamable HTTP): {base}/mcp with header X-API-Key: <KEY>; tools add_memory,
  search_memories, list_memories, get_memory, delete_memory, list_projects, get_task.

Limits: 600 requests a minute per key (429 with Retry-After beyond); bodies up to 1 MiB.
"#
    )
}
