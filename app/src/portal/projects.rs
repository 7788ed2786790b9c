//! Projects and their memories: the projects page, a project's page (memories newest first,
//! paged; add a memory and watch its task complete; search), a memory's page, and search across
//! all projects.
use leptos::prelude::*;
use leptos_router::components::A;
use leptos_router::hooks::{use_params_map, use_query_map};

use super::{error_view, field_error, FormOutcome, Pager};
use crate::types::{MemoryView, ProjectView, SearchHit, TaskView};

/// Memories on one page of a project.
pub const PAGE_SIZE: i64 = 20;

#[server(prefix = "/portal/fn")]
pub async fn list_projects() -> Result<Vec<ProjectView>, ServerFnError> {
    use super::session::{require_user, server_error, state};
    let user = require_user().await?;
    crate::core::projects::list(&state()?.pool, user)
        .await
        .map_err(server_error)
}

#[server(prefix = "/portal/fn")]
pub async fn create_project(
    name: String,
    description: String,
) -> Result<FormOutcome, ServerFnError> {
    use super::session::{form_error, require_user, state};
    use crate::core::projects;
    use crate::core::validate::{Fields, FromFields};
    let user = require_user().await?;
    let body = serde_json::json!({"name": name, "description": description}).to_string();
    let fields = Fields::from_json_body(body.as_bytes())
        .map_err(|e| ServerFnError::new(e.user_message()))?;
    let new = match projects::NewProject::read(fields) {
        Ok(new) => new,
        Err(e) => return form_error(e, "name"),
    };
    match projects::create_for(&state()?, user, &new.name, new.description.as_deref()).await {
        Ok(p) => Ok(FormOutcome::message(format!("Project {} created", p.name))),
        Err(e) => form_error(e, "name"),
    }
}

#[server(prefix = "/portal/fn")]
pub async fn delete_project(id: String) -> Result<String, ServerFnError> {
    use super::session::{require_user, server_error, state};
    let user = require_user().await?;
    let (_, n) = crate::core::projects::delete(&state()?.pool, user, &id)
        .await
        .map_err(server_error)?;
    Ok(format!("Project deleted with {n} memories"))
}

#[server(prefix = "/portal/fn")]
pub async fn load_project_page(
    id: String,
    page: i64,
) -> Result<(ProjectView, Vec<MemoryView>, i64), ServerFnError> {
    use super::session::{require_user, server_error, state};
    let user = require_user().await?;
    let pool = state()?.pool.clone();
    let project = crate::core::projects::get(&pool, user, &id)
        .await
        .map_err(server_error)?;
    let (memories, total) = crate::core::memories::list(
        &pool,
        user,
        Some(&project.id),
        PAGE_SIZE,
        page.max(0) * PAGE_SIZE,
    )
    .await
    .map_err(server_error)?;
    Ok((project, memories, total))
}

#[server(prefix = "/portal/fn")]
pub async fn add_memory(project: String, content: String) -> Result<FormOutcome, ServerFnError> {
    use super::session::{form_error, require_user, state};
    use crate::core::memories;
    use crate::core::validate::{Fields, FromFields};
    let user = require_user().await?;
    let body = serde_json::json!({"content": content, "project_id": project}).to_string();
    let fields = Fields::from_json_body(body.as_bytes())
        .map_err(|e| ServerFnError::new(e.user_message()))?;
    let new = match memories::NewMemory::read(fields) {
        Ok(new) => new,
        Err(e) => return form_error(e, "content"),
    };
    match memories::enqueue(&state()?, user, &new).await {
        Ok(task) => Ok(FormOutcome {
            task_id: Some(task.to_string()),
            message: Some("Memory queued".into()),
            ..Default::default()
        }),
        Err(e) => form_error(e, "content"),
    }
}

#[server(prefix = "/portal/fn")]
pub async fn task_status(id: String) -> Result<TaskView, ServerFnError> {
    use super::session::{require_user, server_error, state};
    let user = require_user().await?;
    crate::core::tasks::get(&state()?.pool, user, &id)
        .await
        .map_err(server_error)
}

#[server(prefix = "/portal/fn")]
pub async fn delete_memory(id: String) -> Result<(), ServerFnError> {
    use super::session::{require_user, server_error, state};
    let user = require_user().await?;
    crate::core::memories::delete(&state()?.pool, user, &id)
        .await
        .map_err(server_error)
}

#[server(prefix = "/portal/fn")]
pub async fn get_memory(id: String) -> Result<MemoryView, ServerFnError> {
    use super::session::{require_user, server_error, state};
    let user = require_user().await?;
    crate::core::memories::get(&state()?.pool, user, &id)
        .await
        .map_err(server_error)
}

#[server(prefix = "/portal/fn")]
pub async fn search_memories(
    query: String,
    project: String,
) -> Result<Vec<SearchHit>, ServerFnError> {
    use super::session::{require_user, server_error, state};
    let user = require_user().await?;
    let state = state()?;
    let query = query.trim().to_string();
    if query.is_empty() || query.chars().count() > 4096 {
        return Err(ServerFnError::new("Type 1 to 4,096 characters to search"));
    }
    let project = Some(project.trim()).filter(|p| !p.is_empty());
    let (hits, _) = crate::core::search::search_for(&state, user, project, &query, 20)
        .await
        .map_err(server_error)?;
    Ok(hits)
}

#[component]
pub fn ProjectsPage() -> impl IntoView {
    let create = ServerAction::<CreateProject>::new();
    let delete = ServerAction::<DeleteProject>::new();
    let projects = Resource::new(
        move || (create.version().get(), delete.version().get()),
        |_| list_projects(),
    );
    let confirming = RwSignal::new(None::<String>);
    let created = move || create.value().get();
    view! {
        <h1>"Projects"</h1>
        <section class="card">
            <h2>"New project"</h2>
            <ActionForm action=create attr:class="row">
                <input type="text" name="name" placeholder="name, e.g. support-bot" required maxlength="64" data-test-id="project-name"/>
                <input type="text" name="description" placeholder="description (optional)" maxlength="1000"/>
                <button type="submit" data-test-id="project-create">"Create"</button>
            </ActionForm>
            {field_error(created, "name")}
            {move || delete.value().get().and_then(|r| r.ok()).map(|m| view! { <p class="notice" data-test-id="project-deleted">{m}</p> })}
        </section>
        <Suspense fallback=|| view! { <p>"Loading…"</p> }>
            {move || Suspend::new(async move {
                match projects.await {
                    Ok(list) => view! {
                        <table class="list" data-test-id="projects-table">
                            <thead><tr><th>"Project"</th><th>"Memories"</th><th>"Created"</th><th></th></tr></thead>
                            <tbody>
                                {list.into_iter().map(|p| {
                                    let is_default = p.id == "default";
                                    let delete_cell = (!is_default).then(|| {
                                        let (id_show, id_click) = (p.id.clone(), p.id.clone());
                                        // Copyable handles: the confirmation is rebuilt each time it shows.
                                        let id_hidden = StoredValue::new(p.id.clone());
                                        let warning = StoredValue::new(format!("Delete “{}” and its {} memories? This cannot be undone.", p.name, p.memory_count));
                                        view! {
                                            <Show when=move || confirming.get().as_deref() == Some(id_show.as_str()) fallback=move || {
                                                let id = id_click.clone();
                                                view! { <button type="button" class="danger" data-test-id="project-delete" on:click=move |_| confirming.set(Some(id.clone()))>"Delete"</button> }
                                            }>
                                                <ActionForm action=delete attr:class="inline confirm">
                                                    <span data-test-id="delete-warning">{warning.get_value()}</span>
                                                    <input type="hidden" name="id" value=id_hidden.get_value()/>
                                                    <button type="submit" class="danger" data-test-id="project-delete-confirm">"Yes, delete"</button>
                                                    <button type="button" on:click=move |_| confirming.set(None)>"Cancel"</button>
                                                </ActionForm>
                                            </Show>
                                        }
                                    });
                                    view! {
                                        <tr data-test-id="project-row">
                                            <td><A href=format!("/projects/{}", p.id)>{p.name.clone()}</A>
                                                {p.description.clone().map(|d| view! { <div class="muted">{d}</div> })}</td>
                                            <td data-test-id="memory-count">{p.memory_count}</td>
                                            <td>{p.created_at.chars().take(10).collect::<String>()}</td>
                                            <td>{delete_cell}</td>
                                        </tr>
                                    }
                                }).collect_view()}
                            </tbody>
                        </table>
                    }.into_any(),
                    Err(e) => error_view(e),
                }
            })}
        </Suspense>
    }
}

#[component]
fn SectorBadge(sector: String, importance: f32) -> impl IntoView {
    view! {
        <span class=format!("badge {sector}") data-test-id="sector">{sector.clone()}</span>
        <span class="importance" title="importance">{format!("{:.2}", importance)}</span>
    }
}

#[component]
fn SearchBox(#[prop(into)] project: String) -> impl IntoView {
    let search = ServerAction::<SearchMemories>::new();
    view! {
        <section class="card">
            <h2>"Search"</h2>
            <ActionForm action=search attr:class="row">
                <input type="search" name="query" placeholder="Ask in your own words, or type a name or number" required data-test-id="search-query"/>
                <input type="hidden" name="project" value=project/>
                <button type="submit" data-test-id="search-submit">"Search"</button>
            </ActionForm>
            {move || search.value().get().map(|result| match result {
                Ok(hits) if hits.is_empty() => view! { <p data-test-id="search-empty">"Nothing found."</p> }.into_any(),
                Ok(hits) => view! {
                    <ol class="results" data-test-id="search-results">
                        {hits.into_iter().map(|h| view! {
                            <li data-test-id="search-hit">
                                <A href=format!("/memories/{}", h.id)>{h.content.clone()}</A>
                                <div class="meta">
                                    <span class="score" data-test-id="score">{format!("score {:.3}", h.score)}</span>
                                    <SectorBadge sector=h.cognitive_sector.clone() importance=h.importance_score/>
                                    <span class="muted">{h.project_id.clone()}</span>
                                </div>
                            </li>
                        }).collect_view()}
                    </ol>
                }.into_any(),
                Err(e) => view! { <p class="error">{e.to_string()}</p> }.into_any(),
            })}
        </section>
    }
}

#[component]
pub fn ProjectPage() -> impl IntoView {
    let params = use_params_map();
    let query = use_query_map();
    let id = move || params.read().get("id").unwrap_or_default();
    let page = move || {
        query
            .read()
            .get("page")
            .and_then(|p| p.parse::<i64>().ok())
            .unwrap_or(0)
            .max(0)
    };
    let add = ServerAction::<AddMemory>::new();
    let remove = ServerAction::<DeleteMemory>::new();
    let refresh = RwSignal::new(0u32);
    let data = Resource::new(
        move || (id(), page(), refresh.get(), remove.version().get()),
        |(id, page, _, _)| load_project_page(id, page),
    );
    let task = RwSignal::new(None::<TaskView>);
    let poller = StoredValue::new(None::<leptos::leptos_dom::helpers::IntervalHandle>);

    // When a memory is queued, follow its task until it completes (no reload).
    Effect::new(move |_| {
        let Some(Ok(outcome)) = add.value().get() else {
            return;
        };
        let Some(task_id) = outcome.task_id else {
            return;
        };
        if let Some(h) = poller.get_value() {
            h.clear();
        }
        let handle = set_interval_with_handle(
            move || {
                let task_id = task_id.clone();
                leptos::task::spawn_local(async move {
                    if let Ok(t) = task_status(task_id).await {
                        let done = t.status == "completed" || t.status == "failed";
                        task.set(Some(t));
                        if done {
                            if let Some(h) = poller.get_value() {
                                h.clear();
                            }
                            poller.set_value(None);
                            refresh.update(|n| *n += 1);
                        }
                    }
                });
            },
            std::time::Duration::from_millis(400),
        )
        .ok();
        poller.set_value(handle);
    });

    view! {
        <Suspense fallback=|| view! { <p>"Loading…"</p> }>
            {move || Suspend::new(async move {
                match data.await {
                    Ok((project, memories, total)) => {
                        let (pid_form, pid_search) = (project.id.clone(), project.id.clone());
                        let pages = (total + PAGE_SIZE - 1) / PAGE_SIZE;
                        let current = page();
                        view! {
                            <p class="muted"><A href="/projects">"Projects"</A>" / "{project.name.clone()}</p>
                            <h1 data-test-id="project-title">{project.name.clone()}</h1>
                            <section class="card">
                                <h2>"Add a memory"</h2>
                                <ActionForm action=add>
                                    <input type="hidden" name="project" value=pid_form.clone()/>
                                    <textarea name="content" rows="3" placeholder="Something worth remembering" required data-test-id="memory-content"></textarea>
                                    <button type="submit" data-test-id="memory-add">"Remember"</button>
                                </ActionForm>
                                {field_error(move || add.value().get(), "content")}
                                {move || task.get().map(|t| view! {
                                    <p class="notice" data-test-id="task-status" data-status=t.status.clone()>
                                        "Task "{t.status.clone()}
                                        {t.cognitive_sector.clone().map(|s| format!(": {s}"))}
                                        {t.error.clone().map(|e| format!(" ({e})"))}
                                    </p>
                                })}
                            </section>
                            <SearchBox project=pid_search.clone()/>
                            <section class="card">
                                <h2>{format!("Memories ({total})")}</h2>
                                {if memories.is_empty() {
                                    view! { <p data-test-id="no-memories">"No memories yet."</p> }.into_any()
                                } else {
                                    view! {
                                        <ul class="memories" data-test-id="memories">
                                            {memories.into_iter().map(|m| {
                                                let mid = m.id.clone();
                                                view! {
                                                    <li data-test-id="memory">
                                                        <p><A href=format!("/memories/{}", m.id)>{m.content.clone()}</A></p>
                                                        <div class="meta">
                                                            <SectorBadge sector=m.cognitive_sector.clone() importance=m.importance_score/>
                                                            <span class="muted">{m.created_at.replace('T', " ").chars().take(19).collect::<String>()}</span>
                                                            <ActionForm action=remove attr:class="inline">
                                                                <input type="hidden" name="id" value=mid/>
                                                                <button type="submit" class="link danger" data-test-id="memory-delete">"Delete"</button>
                                                            </ActionForm>
                                                        </div>
                                                    </li>
                                                }
                                            }).collect_view()}
                                        </ul>
                                    }.into_any()
                                }}
                                <Pager current=current pages=pages/>
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
pub fn MemoryPage() -> impl IntoView {
    let params = use_params_map();
    let memory = Resource::new(
        move || params.read().get("id").unwrap_or_default(),
        get_memory,
    );
    view! {
        <Suspense fallback=|| view! { <p>"Loading…"</p> }>
            {move || Suspend::new(async move {
                match memory.await {
                    Ok(m) => view! {
                        <p class="muted"><A href=format!("/projects/{}", m.project_id)>{format!("Project {}", m.project_id)}</A></p>
                        <article class="card" data-test-id="memory-detail">
                            <p class="content">{m.content.clone()}</p>
                            <div class="meta"><SectorBadge sector=m.cognitive_sector.clone() importance=m.importance_score/></div>
                            <dl>
                                <dt>"Created"</dt><dd>{m.created_at.clone()}</dd>
                                <dt>"Agent"</dt><dd>{m.agent_id.clone().unwrap_or_else(|| "—".into())}</dd>
                                <dt>"Metadata"</dt><dd><code>{m.metadata.to_string()}</code></dd>
                            </dl>
                        </article>
                    }.into_any(),
                    Err(e) => error_view(e),
                }
            })}
        </Suspense>
    }
}

#[component]
pub fn SearchPage() -> impl IntoView {
    let projects = Resource::new(|| (), |_| list_projects());
    view! {
        <h1>"Search all projects"</h1>
        <Suspense fallback=|| ()>
            {move || Suspend::new(async move {
                match projects.await {
                    Ok(_) => view! { <SearchBox project=""/> }.into_any(),
                    Err(e) => error_view(e),
                }
            })}
        </Suspense>
    }
}
