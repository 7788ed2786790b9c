//! Chat and conversations: the chat page (pick a project, talk to the account's upstream LLM
//! through the proxy, see beside each reply the memories that were injected, with their
//! scores; set the upstream), the conversations list, and a conversation's messages with the
//! memories each produced.
use leptos::prelude::*;
use leptos_router::components::A;
use leptos_router::hooks::{use_params_map, use_query_map};

use super::{error_view, field_error, FormOutcome, Pager};
use crate::types::{ConversationView, InjectedMemory, MessageView, ProjectView};

/// Conversations on one page of the list.
pub const PAGE_SIZE: i64 = 20;
/// Earlier messages of a conversation sent upstream with a new one.
#[cfg(feature = "ssr")]
const HISTORY: i64 = 20;

/// One exchange of the chat page.
#[derive(Clone, Debug, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct ChatTurn {
    pub conversation_id: String,
    pub message: String,
    pub reply: String,
    pub injected: Vec<InjectedMemory>,
}

/// The account's upstream as the page shows it: source, base URL, masked key, model.
#[derive(Clone, Debug, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct UpstreamShown {
    pub source: String,
    pub base_url: String,
    pub api_key: Option<String>,
    pub model: String,
}

#[server(prefix = "/portal/fn")]
pub async fn load_chat_page() -> Result<(UpstreamShown, Vec<ProjectView>), ServerFnError> {
    use super::session::{require_user, server_error, state};
    let user = require_user().await?;
    let state = state()?;
    let view = crate::core::proxy::view_upstream(&state.pool, &state.settings.proxy, user)
        .await
        .map_err(server_error)?;
    let projects = crate::core::projects::list(&state.pool, user)
        .await
        .map_err(server_error)?;
    Ok((
        UpstreamShown {
            source: view.source,
            base_url: view.base_url.unwrap_or_default(),
            api_key: view.api_key,
            model: view.model.unwrap_or_default(),
        },
        projects,
    ))
}

#[server(prefix = "/portal/fn")]
pub async fn save_upstream(
    base_url: String,
    api_key: String,
    model: String,
) -> Result<FormOutcome, ServerFnError> {
    use super::session::{form_error, require_user, state};
    use crate::core::proxy::{self, UpstreamUpdate};
    use crate::core::validate::{Fields, FromFields};
    let user = require_user().await?;
    let state = state()?;
    // A blank key field keeps the stored key.
    let mut body = serde_json::json!({"base_url": base_url, "model": model});
    if !api_key.trim().is_empty() {
        body["api_key"] = serde_json::json!(api_key);
    }
    let fields = Fields::from_value(body).map_err(|e| ServerFnError::new(e.user_message()))?;
    let update = match UpstreamUpdate::read(fields) {
        Ok(u) => u,
        Err(e) => return form_error(e, "base_url"),
    };
    match proxy::put_upstream(&state.pool, &state.settings.proxy, user, &update).await {
        Ok(_) => Ok(FormOutcome::message("Upstream saved")),
        Err(e) => form_error(e, "base_url"),
    }
}

#[server(prefix = "/portal/fn")]
pub async fn send_chat(
    project: String,
    conversation: String,
    message: String,
) -> Result<ChatTurn, ServerFnError> {
    use super::session::{require_user, server_error, state};
    use crate::core::{conversations, proxy};
    use serde_json::{json, Value};
    let user = require_user().await?;
    let state = state()?;
    let message = message.trim().to_string();
    if message.is_empty() || message.chars().count() > conversations::MAX_CONTENT {
        return Err(ServerFnError::new(
            "Type a message of 1 to 32,768 characters",
        ));
    }
    let conversation = Some(conversation.trim().to_string()).filter(|c| !c.is_empty());
    // The conversation so far goes upstream with the new message.
    let mut messages: Vec<Value> = vec![];
    if let Some(id) = &conversation {
        if let Ok(c) = conversations::get(&state.pool, user, id).await {
            let from = (c.message_count - HISTORY).max(0);
            let earlier = conversations::messages(&state.pool, user, id, HISTORY, from)
                .await
                .map_err(server_error)?;
            messages.extend(
                earlier
                    .into_iter()
                    .filter(|m| m.role == "user" || m.role == "assistant")
                    .map(|m| json!({"role": m.role, "content": m.content})),
            );
        }
    }
    messages.push(json!({"role": "user", "content": message}));
    let controls = proxy::Controls {
        project: Some(project.trim().to_string()).filter(|p| !p.is_empty()),
        conversation,
        ..Default::default()
    };
    let mut body = serde_json::Map::new();
    body.insert("messages".into(), Value::Array(messages));
    let prepared = proxy::prepare(&state, user, &controls, body)
        .await
        .map_err(|r| ServerFnError::new(r.message()))?;
    let conversation_id = prepared
        .conversation_id
        .map(|c| c.to_string())
        .unwrap_or_default();
    let answer =
        proxy::complete_once(&state, prepared.upstream.clone(), prepared.body.clone()).await;
    match answer {
        Ok(done) => {
            let reply = done.reply.clone().unwrap_or_default();
            // Awaited here, so the next message finds this exchange in the conversation.
            prepared
                .exchange
                .finish(200, true, done.reply, done.usage, Some(done.first_byte))
                .await;
            Ok(ChatTurn {
                conversation_id,
                message,
                reply,
                injected: prepared.injected,
            })
        }
        Err((status, msg)) => {
            prepared
                .exchange
                .finish(status, false, None, None, None)
                .await;
            Err(ServerFnError::new(msg))
        }
    }
}

#[server(prefix = "/portal/fn")]
pub async fn list_conversations(page: i64) -> Result<(Vec<ConversationView>, i64), ServerFnError> {
    use super::session::{require_user, server_error, state};
    let user = require_user().await?;
    crate::core::conversations::list(&state()?.pool, user, PAGE_SIZE, page.max(0) * PAGE_SIZE)
        .await
        .map_err(server_error)
}

#[server(prefix = "/portal/fn")]
pub async fn load_conversation(
    id: String,
) -> Result<(ConversationView, Vec<MessageView>), ServerFnError> {
    use super::session::{require_user, server_error, state};
    let user = require_user().await?;
    let pool = state()?.pool.clone();
    let conversation = crate::core::conversations::get(&pool, user, &id)
        .await
        .map_err(server_error)?;
    let messages = crate::core::conversations::messages(&pool, user, &id, 1000, 0)
        .await
        .map_err(server_error)?;
    Ok((conversation, messages))
}

#[server(prefix = "/portal/fn")]
pub async fn delete_conversation(
    id: String,
    memories: Option<String>,
) -> Result<String, ServerFnError> {
    use super::session::{require_user, server_error, state};
    let user = require_user().await?;
    let with_memories = memories.as_deref() == Some("delete");
    crate::core::conversations::delete(&state()?.pool, user, &id, with_memories)
        .await
        .map_err(server_error)?;
    Ok(if with_memories {
        "Conversation and its memories deleted".into()
    } else {
        "Conversation deleted; its memories stay".into()
    })
}

#[component]
fn Injected(memories: Vec<InjectedMemory>) -> impl IntoView {
    if memories.is_empty() {
        return view! { <p class="muted" data-test-id="no-injected">"No memories were injected."</p> }.into_any();
    }
    view! {
        <div class="injected" data-test-id="injected">
            <p class="muted">"Memories given to the model:"</p>
            <ul>
                {memories.into_iter().map(|m| view! {
                    <li data-test-id="injected-memory">
                        <A href=format!("/memories/{}", m.id)>{m.content.clone()}</A>
                        " "<span class="score" data-test-id="injected-score">{format!("score {:.3}", m.score)}</span>
                        " "<span class="muted">{m.created_at.chars().take(10).collect::<String>()}</span>
                    </li>
                }).collect_view()}
            </ul>
        </div>
    }
    .into_any()
}

#[component]
pub fn ChatPage() -> impl IntoView {
    let query = use_query_map();
    let save = ServerAction::<SaveUpstream>::new();
    let send = ServerAction::<SendChat>::new();
    let data = Resource::new(move || save.version().get(), |_| load_chat_page());
    // The conversation the page continues: from `?conversation=`, then the first reply's.
    let conversation = RwSignal::new(
        query
            .read_untracked()
            .get("conversation")
            .unwrap_or_default(),
    );
    let turns = RwSignal::new(Vec::<ChatTurn>::new());
    Effect::new(move |_| {
        if let Some(Ok(turn)) = send.value().get() {
            conversation.set(turn.conversation_id.clone());
            turns.update(|t| {
                if t.last() != Some(&turn) {
                    t.push(turn);
                }
            });
        }
    });
    view! {
        <h1>"Chat"</h1>
        <p class="lead">"Talk to your LLM through Engram: each message is sent with your most relevant memories, and the exchange is remembered."</p>
        <Suspense fallback=|| view! { <p>"Loading…"</p> }>
            {move || Suspend::new(async move {
                match data.await {
                    Ok((upstream, projects)) => {
                        let configured = upstream.source != "none";
                        view! {
                            <section class="card">
                                <h2>"Upstream LLM"</h2>
                                <p class="muted" data-test-id="upstream-source">{match upstream.source.as_str() {
                                    "account" => "Your own upstream.".to_string(),
                                    "server" => "The server's default upstream (set your own below).".to_string(),
                                    _ => "No upstream yet: name an OpenAI-compatible API.".to_string(),
                                }}</p>
                                <ActionForm action=save attr:class="stack">
                                    <label>"Base URL "<input type="url" name="base_url" value=upstream.base_url.clone() placeholder="https://api.openai.com/v1" required data-test-id="upstream-url"/></label>
                                    <label>"API key "<input type="password" name="api_key" autocomplete="off" placeholder=upstream.api_key.clone().map(|k| format!("stored: {k} (leave blank to keep)")).unwrap_or_else(|| "sk-…".into()) data-test-id="upstream-key"/></label>
                                    <label>"Default model "<input type="text" name="model" value=upstream.model.clone() placeholder="gpt-4o-mini" data-test-id="upstream-model"/></label>
                                    <button type="submit" data-test-id="upstream-save">"Save"</button>
                                </ActionForm>
                                {field_error(move || save.value().get(), "base_url")}
                                {move || save.value().get().and_then(|r| r.ok()).and_then(|o| o.message).map(|m| view! { <p class="notice" data-test-id="upstream-saved">{m}</p> })}
                            </section>
                            <section class="card">
                                <h2>"Conversation"</h2>
                                <ol class="chat" data-test-id="chat-turns">
                                    <For each=move || turns.get() key=|t| (t.conversation_id.clone(), t.message.clone(), t.reply.clone()) let:turn>
                                        <li class="turn" data-test-id="chat-turn">
                                            <p class="user-message"><strong>"You: "</strong>{turn.message.clone()}</p>
                                            <div class="reply-row">
                                                <p class="assistant-message" data-test-id="chat-reply"><strong>"Assistant: "</strong>{turn.reply.clone()}</p>
                                                <Injected memories=turn.injected.clone()/>
                                            </div>
                                        </li>
                                    </For>
                                </ol>
                                <ActionForm action=send attr:class="stack">
                                    <label>"Project "
                                        <select name="project" data-test-id="chat-project">
                                            <option value="">"All projects (remember into default)"</option>
                                            {projects.into_iter().map(|p| view! { <option value=p.id.clone()>{p.name.clone()}</option> }).collect_view()}
                                        </select>
                                    </label>
                                    <input type="hidden" name="conversation" prop:value=move || conversation.get()/>
                                    <textarea name="message" rows="3" placeholder="Ask something" required data-test-id="chat-message"></textarea>
                                    <button type="submit" disabled=!configured data-test-id="chat-send">{move || if send.pending().get() { "Sending…" } else { "Send" }}</button>
                                </ActionForm>
                                {move || send.value().get().and_then(|r| r.err()).map(|e| view! { <p class="error" data-test-id="chat-error">{e.to_string()}</p> })}
                                {move || (!conversation.get().is_empty()).then(|| view! {
                                    <p class="muted"><A href=format!("/conversations/{}", conversation.get())>"Open this conversation"</A>" · "<A href="/chat">"New conversation"</A></p>
                                })}
                            </section>
                        }.into_any()
                    }
                    Err(e) => error_view(e),
                }
            })}
        </Suspense>
    }
}

#[component]
pub fn ConversationsPage() -> impl IntoView {
    let query = use_query_map();
    let page = move || {
        query
            .read()
            .get("page")
            .and_then(|p| p.parse::<i64>().ok())
            .unwrap_or(0)
            .max(0)
    };
    let list = Resource::new(page, list_conversations);
    view! {
        <h1>"Conversations"</h1>
        <p><A href="/chat">"Start a chat"</A></p>
        <Suspense fallback=|| view! { <p>"Loading…"</p> }>
            {move || Suspend::new(async move {
                match list.await {
                    Ok((items, total)) if items.is_empty() && total == 0 => view! {
                        <p data-test-id="no-conversations">"No conversations yet. Chat on the Chat page, send them with "<code>"POST /api/v1/conversations"</code>", or through the proxy."</p>
                    }.into_any(),
                    Ok((items, total)) => {
                        let current = page();
                        let pages = (total + PAGE_SIZE - 1) / PAGE_SIZE;
                        view! {
                            <table class="list" data-test-id="conversations-table">
                                <thead><tr><th>"Conversation"</th><th>"Messages"</th><th>"Project"</th><th>"Last active"</th></tr></thead>
                                <tbody>
                                    {items.into_iter().map(|c| view! {
                                        <tr data-test-id="conversation-row">
                                            <td><A href=format!("/conversations/{}", c.id)>{c.title.clone().unwrap_or_else(|| "(untitled)".into())}</A></td>
                                            <td data-test-id="message-count">{c.message_count}</td>
                                            <td>{c.project_id.clone()}</td>
                                            <td>{c.updated_at.replace('T', " ").chars().take(16).collect::<String>()}</td>
                                        </tr>
                                    }).collect_view()}
                                </tbody>
                            </table>
                            <Pager current=current pages=pages/>
                        }.into_any()
                    }
                    Err(e) => error_view(e),
                }
            })}
        </Suspense>
    }
}

#[component]
pub fn ConversationPage() -> impl IntoView {
    let params = use_params_map();
    let remove = ServerAction::<DeleteConversation>::new();
    let data = Resource::new(
        move || params.read().get("id").unwrap_or_default(),
        load_conversation,
    );
    view! {
        <Suspense fallback=|| view! { <p>"Loading…"</p> }>
            {move || Suspend::new(async move {
                match data.await {
                    Ok((c, messages)) => {
                        let id = c.id.clone();
                        view! {
                            <p class="muted"><A href="/conversations">"Conversations"</A></p>
                            <h1 data-test-id="conversation-title">{c.title.clone().unwrap_or_else(|| "(untitled)".into())}</h1>
                            <p class="muted">{format!("{} messages · project {} · started {}", c.message_count, c.project_id, c.created_at.replace('T', " ").chars().take(16).collect::<String>())}
                                " · "<A href=format!("/chat?conversation={}", c.id)>"Continue in the chat"</A></p>
                            <ol class="messages" data-test-id="conversation-messages">
                                {messages.into_iter().map(|m| view! {
                                    <li class=format!("message {}", m.role) data-test-id="conversation-message">
                                        <div class="meta"><strong>{m.role.clone()}</strong>
                                            {m.timestamp.clone().map(|t| view! { " "<span class="muted">{t.replace('T', " ").chars().take(16).collect::<String>()}</span> })}</div>
                                        <p>{m.content.clone()}</p>
                                        {match (m.memory_id.clone(), m.task_status.clone()) {
                                            (Some(mid), _) => view! {
                                                <p class="muted" data-test-id="message-memory">"Remembered as "
                                                    <A href=format!("/memories/{mid}")>{m.cognitive_sector.clone().unwrap_or_default()}" memory"</A>
                                                    {m.importance_score.map(|i| format!(" (importance {i:.2})"))}</p>
                                            }.into_any(),
                                            (None, Some(status)) => view! { <p class="muted">{format!("Memory task {status}")}</p> }.into_any(),
                                            (None, None) => view! { <p class="muted">"Stored, not remembered"</p> }.into_any(),
                                        }}
                                    </li>
                                }).collect_view()}
                            </ol>
                            <section class="card">
                                <ActionForm action=remove attr:class="row">
                                    <input type="hidden" name="id" value=id/>
                                    <label><input type="checkbox" name="memories" value="delete"/>" also delete its memories"</label>
                                    <button type="submit" class="danger" data-test-id="conversation-delete">"Delete conversation"</button>
                                </ActionForm>
                                {move || remove.value().get().map(|r| match r {
                                    Ok(m) => view! { <p class="notice">{m}" "<A href="/conversations">"Back to the list"</A></p> }.into_any(),
                                    Err(e) => view! { <p class="error">{e.to_string()}</p> }.into_any(),
                                })}
                            </section>
                        }.into_any()
                    }
                    Err(e) => error_view(e),
                }
            })}
        </Suspense>
    }
}
