//! The portal on the server: Leptos SSR routes and server functions (under `/portal/fn`), the
//! PostgreSQL-backed session, and a guard against cross-site form posts.
use axum::extract::Request;
use axum::http::{header, Method, StatusCode};
use axum::middleware::{from_fn, Next};
use axum::response::{IntoResponse, Response};
use axum::Router;
use leptos::config::LeptosOptions;
use leptos_axum::{generate_route_list, LeptosRoutes};
use tower_sessions::cookie::SameSite;
use tower_sessions::{Expiry, SessionManagerLayer};

use crate::sessions::PgSessionStore;
use app::core::state::AppState;

/// The bundle's name: `pkg/engram.js`, `pkg/engram_bg.wasm`, `pkg/engram.css`.
pub fn leptos_options(site_root: &str) -> LeptosOptions {
    LeptosOptions::builder()
        .output_name("engram")
        .site_root(site_root)
        .site_pkg_dir("pkg")
        .build()
}

pub fn router(state: &AppState) -> Router<AppState> {
    let routes = generate_route_list(app::App);
    let secure = state.settings.public_url.starts_with("https://");
    let sessions = SessionManagerLayer::new(PgSessionStore::new(state.pool.clone()))
        .with_name("engram_session")
        .with_http_only(true)
        .with_same_site(SameSite::Lax)
        .with_secure(secure)
        .with_expiry(Expiry::OnInactivity(time::Duration::days(7)));
    let options = state.leptos_options.clone();
    Router::new()
        .leptos_routes(state, routes, move || app::shell(options.clone()))
        .fallback(leptos_axum::file_and_error_handler::<AppState, _>(
            app::shell,
        ))
        .layer(from_fn(cross_site_guard))
        .layer(sessions)
}

/// Refuses state-changing requests sent by another site: the `Origin` (or, without it,
/// `Sec-Fetch-Site`) must say the request comes from this host. The session cookie is also
/// `SameSite=Lax`, so a cross-site post carries no session anyway; this is the second lock.
async fn cross_site_guard(req: Request, next: Next) -> Response {
    if matches!(*req.method(), Method::GET | Method::HEAD | Method::OPTIONS) {
        return next.run(req).await;
    }
    let headers = req.headers();
    let host = headers
        .get(header::HOST)
        .and_then(|v| v.to_str().ok())
        .unwrap_or_default();
    let allowed = match headers.get(header::ORIGIN).and_then(|v| v.to_str().ok()) {
        Some(origin) => origin.split_once("://").map(|(_, rest)| rest) == Some(host),
        None => !matches!(
            headers.get("sec-fetch-site").and_then(|v| v.to_str().ok()),
            Some("cross-site" | "same-site")
        ),
    };
    if !allowed {
        tracing::warn!(host, origin = ?headers.get(header::ORIGIN), "cross-site portal request refused");
        return (StatusCode::FORBIDDEN, "Cross-site request refused").into_response();
    }
    next.run(req).await
}
