//! The portal over HTTP: server-side rendering, the session cookie's flags, and the refusal of
//! cross-site form posts.
mod common;

use common::*;

/// The action URL of the form on a page (server functions carry a hash in their path).
async fn form_action(app: &TestApp, page: &str) -> String {
    let html = app
        .http
        .get(app.url(page))
        .send()
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    let start = html.find("action=\"").expect("a form") + 8;
    html[start..start + html[start..].find('"').unwrap()].to_string()
}

#[tokio::test]
async fn pages_render_on_the_server_and_protected_ones_redirect_to_login() {
    let app = spawn_app().await;
    let r = app.http.get(app.url("/")).send().await.unwrap();
    assert_eq!(r.status(), 200);
    let html = r.text().await.unwrap();
    assert!(
        html.contains("Engram")
            && html.contains("/pkg/engram.js")
            && html.contains("engram_bg.wasm")
    );
    // A browser navigation (Accept: text/html) gets a real redirect.
    let r = app
        .http
        .get(app.url("/keys"))
        .header("accept", "text/html")
        .send()
        .await
        .unwrap();
    assert!(r.status().is_redirection(), "{}", r.status());
    assert_eq!(r.headers()["location"], "/login");
}

#[tokio::test]
async fn logging_in_sets_an_http_only_same_site_session_and_cross_site_posts_are_refused() {
    let app = spawn_app().await;
    app.register("portal@example.com", "password123").await;
    let action = form_action(&app, "/login").await;
    assert!(action.starts_with("/portal/fn/log_in"), "{action}");
    let form = [("email", "portal@example.com"), ("password", "password123")];

    let r = app
        .http
        .post(app.url(&action))
        .header("origin", "http://evil.example")
        .form(&form)
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 403);
    assert!(r.headers().get("set-cookie").is_none());
    let r = app
        .http
        .post(app.url(&action))
        .header("sec-fetch-site", "cross-site")
        .form(&form)
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 403);

    let origin = app.base.clone();
    // A plain form post, as without JavaScript.
    let r = app
        .http
        .post(app.url(&action))
        .header("origin", origin)
        .header("accept", "text/html")
        .form(&form)
        .send()
        .await
        .unwrap();
    assert!(r.status().is_redirection(), "{}", r.status());
    let cookie = r.headers()["set-cookie"].to_str().unwrap().to_string();
    assert!(
        cookie.starts_with("engram_session=")
            && cookie.contains("HttpOnly")
            && cookie.contains("SameSite=Lax"),
        "{cookie}"
    );
    let session = cookie.split(';').next().unwrap().to_string();
    let r = app
        .http
        .get(app.url("/keys"))
        .header("cookie", &session)
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200);
    assert!(r.text().await.unwrap().contains("portal@example.com"));
    // The session lives in PostgreSQL.
    let sessions: i64 = sqlx::query_scalar("select count(*) from sessions")
        .fetch_one(&app.pool)
        .await
        .unwrap();
    assert_eq!(sessions, 1);
}
