//! # Layout
//! The portal: `shell` and `App` (routes and navigation) here; one module per area, each with
//! its pages and the server functions (under `/portal/fn`) that call the shared domain.
//! - `auth`: sign-up, log-in, log-out, the current user;
//! - `keys`: API keys;
//! - `install`: the install guide (snippets with the user's own key);
//! - `projects`: projects, a project's memories, adding a memory, search;
//! - `chat`: the chat page (through the LLM proxy) and the conversations;
//! - `models`: the public model catalogue (no log-in);
//! - `claims`: the claim page, claimed machines, the development mailbox;
//! - `dashboard`: the dashboard (statistics with charts) and the plan page.
pub mod auth;
pub mod chat;
pub mod claims;
pub mod dashboard;
pub mod install;
pub mod keys;
pub mod models;
pub mod projects;

use leptos::prelude::*;
use leptos_meta::{provide_meta_context, MetaTags, Stylesheet, Title};
use leptos_router::components::{Redirect, Route, Router, Routes, A};
use leptos_router::{ParamSegment, SsrMode, StaticSegment, WildcardSegment};
use serde::{Deserialize, Serialize};

/// The HTML document around the app.
pub fn shell(options: LeptosOptions) -> impl IntoView {
    view! {
        <!DOCTYPE html>
        <html lang="en">
            <head>
                <meta charset="utf-8"/>
                <meta name="viewport" content="width=device-width, initial-scale=1"/>
                <HydrationScripts options/>
                <MetaTags/>
            </head>
            <body>
                <App/>
            </body>
        </html>
    }
}

#[component]
pub fn App() -> impl IntoView {
    provide_meta_context();
    view! {
        <Stylesheet id="engram" href="/pkg/engram.css"/>
        <Title text="Engram"/>
        <Router>
            <auth::Nav/>
            <main class="container">
                <Routes fallback=|| view! { <h1>"Page not found"</h1><p><A href="/">"Back to the start"</A></p> }>
                    <Route path=StaticSegment("") view=Landing/>
                    <Route path=StaticSegment("signup") view=auth::SignupPage ssr=SsrMode::Async/>
                    <Route path=StaticSegment("login") view=auth::LoginPage ssr=SsrMode::Async/>
                    <Route path=StaticSegment("dashboard") view=dashboard::DashboardPage ssr=SsrMode::Async/>
                    <Route path=StaticSegment("plan") view=dashboard::PlanPage ssr=SsrMode::Async/>
                    <Route path=StaticSegment("keys") view=keys::KeysPage ssr=SsrMode::Async/>
                    <Route path=StaticSegment("install") view=install::InstallPage ssr=SsrMode::Async/>
                    <Route path=StaticSegment("projects") view=projects::ProjectsPage ssr=SsrMode::Async/>
                    <Route path=(StaticSegment("projects"), ParamSegment("id")) view=projects::ProjectPage ssr=SsrMode::Async/>
                    <Route path=(StaticSegment("memories"), ParamSegment("id")) view=projects::MemoryPage ssr=SsrMode::Async/>
                    <Route path=StaticSegment("search") view=projects::SearchPage ssr=SsrMode::Async/>
                    <Route path=StaticSegment("chat") view=chat::ChatPage ssr=SsrMode::Async/>
                    <Route path=StaticSegment("conversations") view=chat::ConversationsPage ssr=SsrMode::Async/>
                    <Route path=(StaticSegment("conversations"), ParamSegment("id")) view=chat::ConversationPage ssr=SsrMode::Async/>
                    <Route path=StaticSegment("models") view=models::ModelsPage ssr=SsrMode::Async/>
                    <Route path=(StaticSegment("models"), WildcardSegment("id")) view=models::ModelPage ssr=SsrMode::Async/>
                    <Route path=StaticSegment("claim") view=claims::ClaimPage ssr=SsrMode::Async/>
                    <Route path=(StaticSegment("dev"), StaticSegment("mailbox")) view=claims::MailboxPage ssr=SsrMode::Async/>
                </Routes>
            </main>
        </Router>
    }
}

#[component]
fn Landing() -> impl IntoView {
    view! {
        <section class="hero">
            <h1>"Engram"</h1>
            <p class="lead">"Long-term memory for your AI applications: store what your agents learn, find it again by meaning or by keyword."</p>
            <ol class="steps">
                <li><A href="/signup">"Create an account"</A>" and an API key."</li>
                <li>"Send memories: "<code>"POST /api/v1/memories"</code>" with "<code>"X-API-Key"</code>". A worker embeds and classifies each one (episodic, semantic, procedural, emotional, reflective)."</li>
                <li>"Search them: "<code>"POST /api/v1/memories/search"</code>", hybrid vector and keyword ranking."</li>
                <li>"Agents can register themselves by machine fingerprint; claim their memories into your account later."</li>
            </ol>
            <p><A href="/signup" attr:class="button">"Get started"</A>" "<A href="/login">"Log in"</A>" "<A href="/install">"Connect a client"</A></p>
        </section>
    }
}

/// Newer and older pages of a list (`?page=N`, from 0).
#[component]
pub fn Pager(current: i64, pages: i64) -> impl IntoView {
    view! {
        <nav class="pager">
            {(current > 0).then(|| view! { <A href=format!("?page={}", current - 1)>"← Newer"</A> })}
            <span>{format!("Page {} of {}", current + 1, pages.max(1))}</span>
            {(current + 1 < pages).then(|| view! { <A href=format!("?page={}", current + 1)>"Older →"</A> })}
        </nav>
    }
}

/// A form's result: errors by field, or a message (and, once, a secret to show).
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct FormOutcome {
    pub errors: Vec<(String, String)>,
    pub message: Option<String>,
    pub secret: Option<String>,
    /// The task a queued memory is waiting in.
    pub task_id: Option<String>,
}

impl FormOutcome {
    pub fn error(field: &str, msg: impl Into<String>) -> Self {
        Self {
            errors: vec![(field.into(), msg.into())],
            ..Default::default()
        }
    }
    pub fn message(msg: impl Into<String>) -> Self {
        Self {
            message: Some(msg.into()),
            ..Default::default()
        }
    }
    pub fn for_field(&self, field: &str) -> Option<String> {
        self.errors
            .iter()
            .find(|(f, _)| f == field)
            .map(|(_, m)| m.clone())
    }
}

/// The error shown next to one field of a form, from the action's last result.
pub fn field_error(
    value: impl Fn() -> Option<Result<FormOutcome, ServerFnError>> + Send + Sync + 'static,
    field: &'static str,
) -> impl IntoView {
    move || {
        value().and_then(|r| r.ok()).and_then(|o| o.for_field(field)).map(|msg| view! { <p class="field-error" data-test-id=format!("error-{field}")>{msg}</p> })
    }
}

/// What a page shows for a failed server call: the log-in page when the session is gone.
pub fn error_view(e: ServerFnError) -> AnyView {
    let msg = e.to_string();
    if msg.contains(NOT_LOGGED_IN) {
        view! { <Redirect path="/login"/> }.into_any()
    } else {
        view! { <p class="error">{msg}</p> }.into_any()
    }
}

/// The message of the error every protected server function answers without a session.
pub const NOT_LOGGED_IN: &str = "Not logged in";

#[cfg(feature = "ssr")]
pub mod session {
    //! The portal session: which user is logged in.
    use leptos::prelude::*;
    use tower_sessions::Session;

    use crate::core::error::AppError;
    use crate::core::state::AppState;

    const USER_KEY: &str = "user_id";

    pub fn state() -> Result<AppState, ServerFnError> {
        use_context::<AppState>().ok_or_else(|| ServerFnError::new("application state missing"))
    }

    pub async fn session() -> Result<Session, ServerFnError> {
        Ok(leptos_axum::extract::<Session>().await?)
    }

    /// The client's address for per-address limits, as the API's `ClientIp` reads it.
    pub async fn client_key(state: &AppState) -> String {
        use axum::extract::ConnectInfo;
        let peer = leptos_axum::extract::<ConnectInfo<std::net::SocketAddr>>()
            .await
            .ok()
            .map(|ConnectInfo(a)| a);
        let headers = leptos_axum::extract::<axum::http::HeaderMap>()
            .await
            .unwrap_or_default();
        crate::core::clientaddr::client_key(&state.settings.trusted_proxies, peer, &headers)
    }

    /// The logged-in user's id, if any.
    pub async fn user_id() -> Result<Option<i64>, ServerFnError> {
        let session = session().await?;
        session
            .get::<i64>(USER_KEY)
            .await
            .map_err(|e| ServerFnError::new(e.to_string()))
    }

    /// The logged-in user's id, or the "not logged in" error.
    pub async fn require_user() -> Result<i64, ServerFnError> {
        user_id()
            .await?
            .ok_or_else(|| ServerFnError::new(super::NOT_LOGGED_IN))
    }

    /// Starts a session for `user_id` under a fresh session id (no fixation).
    pub async fn log_in(user_id: i64) -> Result<(), ServerFnError> {
        let session = session().await?;
        session
            .cycle_id()
            .await
            .map_err(|e| ServerFnError::new(e.to_string()))?;
        session
            .insert(USER_KEY, user_id)
            .await
            .map_err(|e| ServerFnError::new(e.to_string()))?;
        Ok(())
    }

    pub async fn log_out() -> Result<(), ServerFnError> {
        session()
            .await?
            .flush()
            .await
            .map_err(|e| ServerFnError::new(e.to_string()))
    }

    /// A domain error as a server function error (internal causes logged, not shown).
    pub fn server_error(e: AppError) -> ServerFnError {
        if let AppError::Internal(cause) = &e {
            tracing::error!(error = ?cause, "internal error in the portal");
        }
        ServerFnError::new(e.user_message())
    }

    /// A domain error as a form outcome: validation errors go next to their fields.
    pub fn form_error(
        e: AppError,
        fallback_field: &str,
    ) -> Result<super::FormOutcome, ServerFnError> {
        match e {
            AppError::Validation(errors) => Ok(super::FormOutcome {
                errors: errors
                    .iter()
                    .map(|fe| (fe.field(), fe.msg.clone()))
                    .collect(),
                ..Default::default()
            }),
            AppError::Internal(_) | AppError::Unavailable => Err(server_error(e)),
            other => Ok(super::FormOutcome::error(
                fallback_field,
                other.user_message(),
            )),
        }
    }
}
