//! Accounts, API keys and the error contract, through the real router and PostgreSQL.
mod common;

use std::time::Duration;

use common::*;
use serde_json::json;

#[tokio::test]
async fn register_login_and_me_answer_the_interface_shapes() {
    let app = spawn_app().await;
    let (s, b) = app.register("Ann@Example.com", "password123").await;
    assert_eq!(s, 200, "{b}");
    assert!(b["id"].is_i64());
    assert_eq!(b["email"], "ann@example.com");
    assert!(b["message"].is_string());

    let (s, b) = app.login("ann@example.com", "password123").await;
    assert_eq!(s, 200, "{b}");
    assert_eq!(b["token_type"], "bearer");
    assert_eq!(b["expires_in"], 86400);
    let token = b["access_token"].as_str().unwrap();

    let r = app
        .http
        .get(app.url("/api/auth/me"))
        .bearer_auth(token)
        .send()
        .await
        .unwrap();
    let (s, me) = body(r).await;
    assert_eq!(s, 200);
    assert_eq!(me["email"], "ann@example.com");
    assert!(me["id"].is_i64());
    assert!(me["created_at"].as_str().unwrap().ends_with('Z'));

    // Every new account has its default project.
    let key = app.new_key(token, "k").await;
    let (s, projects) = app.get("/api/v1/projects", Some(&key)).await;
    assert_eq!(s, 200);
    assert_eq!(projects["data"][0]["id"], "default");
    assert_eq!(projects["data"][0]["name"], "default");
}

#[tokio::test]
async fn registration_rejects_taken_emails_and_bad_input() {
    let app = spawn_app().await;
    assert_eq!(app.register("bob@example.com", "password123").await.0, 200);
    let (s, b) = app.register("BOB@example.com", "password456").await;
    assert_eq!(s, 409, "{b}");
    assert_eq!(b["success"], false);

    let (s, b) = app.register("carol@example.com", "short").await;
    assert_validation(s, &b, &["body", "password"]);
    let (s, b) = app.register("not-an-email", "password123").await;
    assert_validation(s, &b, &["body", "email"]);
    let (s, b) = app
        .post_json(
            "/api/auth/register",
            &json!({"password": "password123"}),
            None,
        )
        .await;
    assert_validation(s, &b, &["body", "email"]);
    assert_eq!(b["detail"][0]["type"], "missing");
    let (s, b) = app
        .post_json(
            "/api/auth/register",
            &json!({"email": 5, "password": "password123"}),
            None,
        )
        .await;
    assert_validation(s, &b, &["body", "email"]);
    let (s, b) = app
        .post_json(
            "/api/auth/register",
            &json!({"email": "d@example.com", "password": "x".repeat(257)}),
            None,
        )
        .await;
    assert_validation(s, &b, &["body", "password"]);

    let r = app
        .http
        .post(app.url("/api/auth/register"))
        .header("content-type", "application/json")
        .body("{not json")
        .send()
        .await
        .unwrap();
    let (s, b) = body(r).await;
    assert_validation(s, &b, &["body"]);
    assert_eq!(b["detail"][0]["type"], "json_invalid");

    let r = app
        .http
        .post(app.url("/api/auth/register"))
        .header("content-type", "text/plain")
        .body(r#"{"email":"e@example.com","password":"password123"}"#)
        .send()
        .await
        .unwrap();
    let (s, b) = body(r).await;
    assert_validation(s, &b, &["body"]);
}

#[tokio::test]
async fn login_takes_only_the_form_and_refuses_wrong_passwords() {
    let app = spawn_app().await;
    app.register("dan@example.com", "password123").await;
    let r = app
        .http
        .post(app.url("/api/auth/login"))
        .json(&json!({"username": "dan@example.com", "password": "password123"}))
        .send()
        .await
        .unwrap();
    let (s, b) = body(r).await;
    assert_validation(s, &b, &["body"]);

    let r = app
        .http
        .post(app.url("/api/auth/login"))
        .form(&[
            ("username", "dan@example.com"),
            ("password", "wrong-password"),
        ])
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 401);
    assert_eq!(r.headers()["www-authenticate"], "Bearer");
    let (s, _) = app.login("nobody@example.com", "password123").await;
    assert_eq!(s, 401);
    let (s, b) = body(
        app.http
            .post(app.url("/api/auth/login"))
            .form(&[
                ("username", "dan@example.com"),
                ("password", "password123"),
                ("grant_type", "password"),
                ("scope", ""),
                ("client_id", "x"),
            ])
            .send()
            .await
            .unwrap(),
    )
    .await;
    assert_eq!(s, 200, "{b}");
    let (s, b) = body(
        app.http
            .post(app.url("/api/auth/login"))
            .form(&[("password", "password123")])
            .send()
            .await
            .unwrap(),
    )
    .await;
    assert_validation(s, &b, &["body", "username"]);
}

#[tokio::test]
async fn me_refuses_missing_forged_and_expired_tokens() {
    let app = spawn_app().await;
    let token = app.token_for("erin@example.com").await;
    let r = app.http.get(app.url("/api/auth/me")).send().await.unwrap();
    assert_eq!(r.status(), 401);
    assert_eq!(r.headers()["www-authenticate"], "Bearer");
    let r = app
        .http
        .get(app.url("/api/auth/me"))
        .bearer_auth("garbage")
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 401);
    let forged =
        app::core::crypto::issue_token(b"another-secret-another-secret-another", 1, 3600).unwrap();
    assert_eq!(
        app.http
            .get(app.url("/api/auth/me"))
            .bearer_auth(forged)
            .send()
            .await
            .unwrap()
            .status(),
        401
    );
    let user_id = app.user_id(&token).await;
    let expired =
        app::core::crypto::issue_token(&app.state.settings.jwt_secret, user_id, -5).unwrap();
    assert_eq!(
        app.http
            .get(app.url("/api/auth/me"))
            .bearer_auth(expired)
            .send()
            .await
            .unwrap()
            .status(),
        401
    );
    // An API key is not a bearer token.
    let (_, key) = app.user("erin2@example.com").await;
    assert_eq!(
        app.http
            .get(app.url("/api/auth/me"))
            .bearer_auth(key)
            .send()
            .await
            .unwrap()
            .status(),
        401
    );
}

#[tokio::test]
async fn keys_are_shown_once_masked_after_and_dead_once_deleted() {
    let app = spawn_app().await;
    // Keys are cached from here on: the deletion below must still refuse the key at once.
    app.until_listening().await;
    let token = app.token_for("fay@example.com").await;
    let (s, created) = app.create_key(&token, "laptop agent").await;
    assert_eq!(s, 200, "{created}");
    let key = created["data"]["key"].as_str().unwrap().to_string();
    assert!(key.starts_with("engram_") && key.len() >= 39);
    assert_eq!(created["data"]["is_active"], true);

    let (s, list) = body(
        app.http
            .get(app.url("/api/keys"))
            .bearer_auth(&token)
            .send()
            .await
            .unwrap(),
    )
    .await;
    assert_eq!(s, 200);
    let listed = list["data"][0]["key"].as_str().unwrap();
    assert_ne!(listed, key);
    assert!(
        listed.starts_with("engram_")
            && listed.contains('…')
            && listed.ends_with(&key[key.len() - 4..])
    );
    assert!(!list.to_string().contains(&key));

    assert_eq!(app.get("/api/v1/projects", Some(&key)).await.0, 200);
    let id = created["data"]["id"].as_i64().unwrap();

    // Another account cannot see or delete it.
    let other = app.token_for("gus@example.com").await;
    let (s, other_list) = body(
        app.http
            .get(app.url("/api/keys"))
            .bearer_auth(&other)
            .send()
            .await
            .unwrap(),
    )
    .await;
    assert_eq!(s, 200);
    assert_eq!(other_list["data"].as_array().unwrap().len(), 0);
    let (s, _) = delete_key(&app, &other, id).await;
    assert_eq!(s, 404);
    assert_eq!(app.get("/api/v1/projects", Some(&key)).await.0, 200);

    let (s, b) = delete_key(&app, &token, id).await;
    assert_eq!(s, 200, "{b}");
    assert_eq!(b["success"], true);
    assert_eq!(app.get("/api/v1/projects", Some(&key)).await.0, 401);
    let (s, b) = body(
        app.http
            .delete(app.url("/api/keys/abc"))
            .bearer_auth(&token)
            .send()
            .await
            .unwrap(),
    )
    .await;
    assert_validation(s, &b, &["path", "id"]);
}

/// `DELETE /api/keys/{id}` as the holder of `token`.
async fn delete_key(
    app: &TestApp,
    token: &str,
    id: i64,
) -> (reqwest::StatusCode, serde_json::Value) {
    body(
        app.http
            .delete(app.url(&format!("/api/keys/{id}")))
            .bearer_auth(token)
            .send()
            .await
            .unwrap(),
    )
    .await
}

/// Calls with `key` until it is refused; false if it still works after five seconds.
async fn refused_soon(app: &TestApp, key: &str) -> bool {
    for _ in 0..100 {
        if app.get("/api/v1/projects", Some(key)).await.0 == 401 {
            return true;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    false
}

#[tokio::test]
async fn a_cached_key_deleted_by_another_process_is_refused_once_the_change_is_announced() {
    let app = spawn_app().await;
    app.until_listening().await;
    let token = app.token_for("hal@example.com").await;
    let key = app.new_key(&token, "agent").await;
    let hits = app.state.keys.hits();
    assert_eq!(app.get("/api/v1/projects", Some(&key)).await.0, 200);
    assert_eq!(app.get("/api/v1/projects", Some(&key)).await.0, 200);
    assert!(
        app.state.keys.hits() > hits,
        "the second call was answered from the cache"
    );

    // Another process deletes it: this one learns of it only through the notification.
    sqlx::query("delete from api_keys where user_id = (select id from users where email = 'hal@example.com')")
        .execute(&app.pool)
        .await
        .unwrap();
    assert!(refused_soon(&app, &key).await, "a deleted key kept working");

    // The listener's connection is cut: while it is away nothing is served from the cache, and
    // once it is back the cache starts empty.
    let key = app.new_key(&token, "agent 2").await;
    assert_eq!(app.get("/api/v1/projects", Some(&key)).await.0, 200);
    let cut: i64 = sqlx::query_scalar(
        "select count(*) from (select pg_terminate_backend(pid) from pg_stat_activity
         where datname = current_database() and query ilike 'listen%engram_api_keys%') t",
    )
    .fetch_one(&app.pool)
    .await
    .unwrap();
    assert_eq!(cut, 1, "one listening connection");
    sqlx::query("delete from api_keys where name = 'agent 2'")
        .execute(&app.pool)
        .await
        .unwrap();
    assert!(
        refused_soon(&app, &key).await,
        "a key deleted while the listener was away kept working"
    );
    app.until_listening().await;
}

#[tokio::test]
async fn concurrent_calls_with_a_key_not_yet_cached_ask_the_database_once() {
    let app = spawn_app().await;
    app.until_listening().await;
    let token = app.token_for("joe@example.com").await;
    let key = app.new_key(&token, "agent").await;
    let user_id = app.user_id(&token).await;
    let lookups = app.state.keys.lookups();
    let owners =
        futures::future::join_all((0..64).map(|_| app.state.keys.authenticate(&app.pool, &key)))
            .await;
    for owner in owners {
        assert_eq!(owner.unwrap().map(|o| o.user_id), Some(user_id));
    }
    assert_eq!(
        app.state.keys.lookups() - lookups,
        1,
        "64 calls at once, one query"
    );

    // An unknown key is refused and never cached: each call asks again.
    let unknown = format!("{key}0");
    let before = app.state.keys.lookups();
    for _ in 0..2 {
        assert!(app
            .state
            .keys
            .authenticate(&app.pool, &unknown)
            .await
            .unwrap()
            .is_none());
    }
    assert_eq!(app.state.keys.lookups() - before, 2);
    assert_eq!(app.get("/api/v1/projects", Some(&unknown)).await.0, 401);
    assert_eq!(app.get("/api/v1/projects", Some(&key)).await.0, 200);
}

#[tokio::test]
async fn without_the_key_cache_every_call_asks_the_database() {
    let mut settings = app::core::state::Settings::for_tests();
    settings.key_cache = false;
    let app = spawn_with(Opts {
        settings,
        ..Opts::default()
    })
    .await;
    let token = app.token_for("ida@example.com").await;
    let (_, created) = app.create_key(&token, "agent").await;
    let key = created["data"]["key"].as_str().unwrap().to_string();
    for _ in 0..3 {
        assert_eq!(app.get("/api/v1/projects", Some(&key)).await.0, 200);
    }
    assert_eq!(app.state.keys.hits(), 0);
    assert!(!app.state.keys.listening());
    let id = created["data"]["id"].as_i64().unwrap();
    let (s, _) = delete_key(&app, &token, id).await;
    assert_eq!(s, 200);
    assert_eq!(app.get("/api/v1/projects", Some(&key)).await.0, 401);
}

#[tokio::test]
async fn key_endpoints_need_a_bearer_token_and_valid_names() {
    let app = spawn_app().await;
    let (token, key) = app.user("hal@example.com").await;
    assert_eq!(app.get("/api/keys", Some(&key)).await.0, 401);
    let (s, b) = app.create_key(&token, "   ").await;
    assert_validation(s, &b, &["body", "name"]);
    let (s, b) = app.create_key(&token, &"k".repeat(101)).await;
    assert_validation(s, &b, &["body", "name"]);
    assert_eq!(app.get("/api/v1/projects", None).await.0, 401);
    assert_eq!(
        app.get("/api/v1/projects", Some("engram_not-a-real-key"))
            .await
            .0,
        401
    );
    assert_eq!(app.get("/api/v1/projects", Some(&token)).await.0, 401);
}

#[tokio::test]
async fn bodies_over_one_mebibyte_are_413() {
    let app = spawn_app().await;
    let (_, key) = app.user("ida@example.com").await;
    let big = "x".repeat(1024 * 1024 + 10);
    let (s, b) = app
        .post_json("/api/v1/memories", &json!({"content": big}), Some(&key))
        .await;
    assert_eq!(s, 413, "{b}");
    assert_eq!(b["success"], false);
}

#[tokio::test]
async fn an_unreachable_database_is_503_with_retry_after() {
    let pool = server::pool_options()
        .acquire_timeout(Duration::from_millis(500))
        .connect_lazy("postgres://engram:engram@127.0.0.1:1/nothing")
        .unwrap();
    let state = server::build_state(
        pool,
        app::core::state::Settings::for_tests(),
        app::core::embed::EmbedderHandle::new("/nonexistent"),
        "target/site",
    );
    let (base, _task) = serve(state).await;
    let http = client();
    let r = http
        .get(format!("{base}/api/v1/projects"))
        .header("x-api-key", "engram_abcdefghijklmnopqrstuvwxyz0123456789")
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 503);
    assert!(r.headers().contains_key("retry-after"));
    let (_, b) = body(r).await;
    assert_eq!(b["success"], false);
    let r = http
        .post(format!("{base}/api/auth/register"))
        .json(&json!({"email": "x@example.com", "password": "password123"}))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 503);
    assert_eq!(
        http.get(format!("{base}/api/ready"))
            .send()
            .await
            .unwrap()
            .status(),
        503
    );
    assert_eq!(
        http.get(format!("{base}/api/health"))
            .send()
            .await
            .unwrap()
            .status(),
        200
    );
}

#[tokio::test]
async fn internal_errors_are_500_with_a_generic_body() {
    let app = spawn_app().await;
    let (_, key) = app.user("jo@example.com").await;
    // Break the schema under the running server: the cause must reach the log, not the client.
    sqlx::query("alter table projects rename to projects_gone")
        .execute(&app.pool)
        .await
        .unwrap();
    let (s, b) = app.get("/api/v1/projects", Some(&key)).await;
    assert_eq!(s, 500);
    assert_eq!(
        b,
        json!({"success": false, "detail": "Internal server error"})
    );
}

#[tokio::test]
async fn health_and_readiness() {
    let app = spawn_app().await;
    assert_eq!(app.get("/api/health", None).await.0, 200);
    let (s, b) = app.get("/api/ready", None).await;
    assert_eq!(s, 200, "{b}");
    assert_eq!(app.get("/api/no-such-thing", None).await.0, 404);
}

#[tokio::test]
async fn login_is_rate_limited_per_email() {
    let app = spawn_app().await;
    app.register("kim@example.com", "password123").await;
    for _ in 0..10 {
        assert_eq!(app.login("kim@example.com", "wrong-password").await.0, 401);
    }
    let r = app
        .http
        .post(app.url("/api/auth/login"))
        .form(&[("username", "kim@example.com"), ("password", "password123")])
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 429);
    assert!(
        r.headers()["retry-after"]
            .to_str()
            .unwrap()
            .parse::<u64>()
            .unwrap()
            >= 1
    );
    // Another e-mail is not affected.
    app.register("lee@example.com", "password123").await;
    assert_eq!(app.login("lee@example.com", "password123").await.0, 200);
}

#[tokio::test]
async fn registration_is_rate_limited_per_client_address() {
    let mut settings = app::core::state::Settings::for_tests();
    settings.limits.register_per_hour = 2;
    let app = spawn_with(Opts {
        settings,
        ..Opts::default()
    })
    .await;
    assert_eq!(app.register("m1@example.com", "password123").await.0, 200);
    assert_eq!(app.register("m2@example.com", "password123").await.0, 200);
    let r = app
        .http
        .post(app.url("/api/auth/register"))
        .json(&json!({"email": "m3@example.com", "password": "password123"}))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 429);
    assert!(r.headers().contains_key("retry-after"));
}
