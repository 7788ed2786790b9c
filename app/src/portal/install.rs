//! The install guide (`/install`): connect a client in a minute, with this server's URL and the
//! user's own key (created in place) written into every snippet.
use leptos::prelude::*;
use leptos_router::components::A;
use serde::{Deserialize, Serialize};

use super::keys::CreateKey;
use super::{error_view, field_error};

/// What the guide needs to know: where this server is, and who is reading.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq)]
pub struct InstallInfo {
    pub base_url: String,
    pub logged_in: bool,
}

#[server(prefix = "/portal/fn")]
pub async fn install_context() -> Result<InstallInfo, ServerFnError> {
    use super::session::{state, user_id};
    let state = state()?;
    Ok(InstallInfo {
        base_url: state.settings.public_url.trim_end_matches('/').to_string(),
        logged_in: user_id().await?.is_some(),
    })
}

/// A key's placeholder until the reader creates one.
pub const KEY_PLACEHOLDER: &str = "engram_YOUR_API_KEY";

/// One copy-paste snippet.
pub struct Snippet {
    pub id: &'static str,
    pub title: &'static str,
    pub note: &'static str,
    pub text: String,
}

/// Every snippet, for a server at `base` and the key `key`.
pub fn snippets(base: &str, key: &str) -> Vec<Snippet> {
    let api = format!("{base}/api");
    let mcp = format!("{base}/mcp");
    vec![
        Snippet {
            id: "curl",
            title: "curl",
            note: "Store a memory, then search for it (the worker needs a moment to embed it).",
            text: format!(
                "curl -s -w '\\n' -X POST {api}/v1/memories \\\n  -H 'X-API-Key: {key}' -H 'Content-Type: application/json' \\\n  -d '{{\"content\": \"Ana prefers window seats on long flights\"}}'\n\ncurl -s -w '\\n' -X POST {api}/v1/memories/search \\\n  -H 'X-API-Key: {key}' -H 'Content-Type: application/json' \\\n  -d '{{\"query\": \"where does Ana like to sit?\"}}'"
            ),
        },
        Snippet {
            id: "python",
            title: "Python (httpx)",
            note: "pip install httpx",
            text: format!(
                "import time, httpx\n\nengram = httpx.Client(base_url=\"{api}\", headers={{\"X-API-Key\": \"{key}\"}})\n\ntask = engram.post(\"/v1/memories\", json={{\"content\": \"Ana prefers window seats on long flights\"}}).json()\nwhile engram.get(f\"/v1/tasks/{{task['task_id']}}\").json()[\"data\"][\"status\"] in (\"pending\", \"processing\"):\n    time.sleep(0.5)\n\nfor hit in engram.post(\"/v1/memories/search\", json={{\"query\": \"where does Ana like to sit?\"}}).json()[\"data\"]:\n    print(round(hit[\"score\"], 2), hit[\"cognitive_sector\"], hit[\"content\"])"
            ),
        },
        Snippet {
            id: "memoryx",
            title: "Python (MemoryX SDK)",
            note: "Already using MemoryX? pip install t0ken-memoryx and point it here; nothing else changes.",
            text: format!(
                "from memoryx import APIClient\n\nclient = APIClient({{\"api_base_url\": \"{api}\", \"api_key\": \"{key}\"}})\nclient.send_memories([{{\"content\": \"Ana prefers window seats on long flights\"}}])\nprint(client.search(\"where does Ana like to sit?\")[\"data\"])"
            ),
        },
        Snippet {
            id: "javascript",
            title: "JavaScript (fetch)",
            note: "Node 18+ or a browser backend; keep the key on the server.",
            text: format!(
                "const engram = (path, body) => fetch(`{api}${{path}}`, {{\n  method: 'POST',\n  headers: {{ 'X-API-Key': '{key}', 'Content-Type': 'application/json' }},\n  body: JSON.stringify(body),\n}}).then((r) => r.json());\n\nconst {{ task_id }} = await engram('/v1/memories', {{ content: 'Ana prefers window seats on long flights' }});\nconst {{ data }} = await engram('/v1/memories/search', {{ query: 'where does Ana like to sit?' }});\nconsole.log(task_id, data);"
            ),
        },
        Snippet {
            id: "mcp-claude",
            title: "MCP: Claude Desktop",
            note: "claude_desktop_config.json (Claude Desktop reaches HTTP servers through the mcp-remote bridge).",
            text: format!(
                "{{\n  \"mcpServers\": {{\n    \"engram\": {{\n      \"command\": \"npx\",\n      \"args\": [\"-y\", \"mcp-remote\", \"{mcp}\", \"--header\", \"X-API-Key:${{ENGRAM_API_KEY}}\"],\n      \"env\": {{ \"ENGRAM_API_KEY\": \"{key}\" }}\n    }}\n  }}\n}}"
            ),
        },
        Snippet {
            id: "mcp-cursor",
            title: "MCP: Cursor",
            note: "~/.cursor/mcp.json",
            text: format!(
                "{{\n  \"mcpServers\": {{\n    \"engram\": {{\n      \"url\": \"{mcp}\",\n      \"headers\": {{ \"X-API-Key\": \"{key}\" }}\n    }}\n  }}\n}}"
            ),
        },
        Snippet {
            id: "mcp-vscode",
            title: "MCP: VS Code",
            note: ".vscode/mcp.json",
            text: format!(
                "{{\n  \"servers\": {{\n    \"engram\": {{\n      \"type\": \"http\",\n      \"url\": \"{mcp}\",\n      \"headers\": {{ \"X-API-Key\": \"{key}\" }}\n    }}\n  }}\n}}"
            ),
        },
    ]
}

#[component]
pub fn InstallPage() -> impl IntoView {
    let context = Resource::new(|| (), |_| install_context());
    let create = ServerAction::<CreateKey>::new();
    let created = move || create.value().get();
    let key = move || {
        created()
            .and_then(|r| r.ok())
            .and_then(|o| o.secret)
            .unwrap_or_else(|| KEY_PLACEHOLDER.to_string())
    };
    view! {
        <h1>"Connect a client"</h1>
        <Suspense fallback=|| view! { <p>"Loading…"</p> }>
            {move || Suspend::new(async move {
                match context.await {
                    Ok(ctx) => {
                        let base = ctx.base_url.clone();
                        view! {
                            <p>"This server: "<code data-test-id="base-url">{base.clone()}</code>". The API is under "<code>"/api"</code>
                               " (reference: "<a href="/api/docs">"/api/docs"</a>", "<a href="/api/openapi.json">"OpenAPI"</a>"), MCP at "<code>"/mcp"</code>
                               ", and agents can read "<a href="/agent-guide">"/agent-guide"</a>" to register themselves."</p>
                            <section class="card">
                                <h2>"1. A key"</h2>
                                {if ctx.logged_in {
                                    view! {
                                        <ActionForm action=create attr:class="row">
                                            <input type="text" name="name" value="install guide" required maxlength="100" data-test-id="install-key-name"/>
                                            <button type="submit" data-test-id="install-key-create">"Create a key"</button>
                                        </ActionForm>
                                        {field_error(created, "name")}
                                        <p data-test-id="install-key-state">{move || if key() == KEY_PLACEHOLDER {
                                            "The snippets below show a placeholder until you create a key.".to_string()
                                        } else {
                                            "Key created and written into every snippet below: copy it now, it is not shown again.".to_string()
                                        }}</p>
                                    }.into_any()
                                } else {
                                    view! { <p><A href="/signup">"Sign up"</A>" or "<A href="/login">"log in"</A>" to create a key here; the snippets show a placeholder."</p> }.into_any()
                                }}
                            </section>
                            <section class="card">
                                <h2>"2. Use it"</h2>
                                {move || snippets(&base, &key()).into_iter().map(|s| {
                                    let text = s.text.clone();
                                    let copy = format!("navigator.clipboard && navigator.clipboard.writeText(document.querySelector('[data-test-id=snippet-{}]').innerText)", s.id);
                                    view! {
                                        <h3>{s.title}</h3>
                                        <p class="note">{s.note}</p>
                                        <pre data-test-id=format!("snippet-{}", s.id)>{text}</pre>
                                        <button type="button" onclick=copy>"Copy"</button>
                                    }
                                }).collect_view()}
                            </section>
                        }.into_any()
                    }
                    Err(e) => error_view(e),
                }
            })}
        </Suspense>
    }
}
