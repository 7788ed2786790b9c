//! `GET /metrics` scraped after known work: request counts per route and status, tasks by
//! outcome, the embedder's batches, the queue, the pool, rate-limit refusals. (Each test binary
//! is its own process, so the process-wide recorder holds this test's work only.)
mod common;

use common::*;
use serde_json::json;

/// The value of the series whose line starts with `series` (name and labels as rendered).
fn value(text: &str, series: &str) -> Option<f64> {
    text.lines()
        .find(|l| l.starts_with(series) && l[series.len()..].starts_with(' '))
        .and_then(|l| l.rsplit(' ').next())
        .and_then(|v| v.parse().ok())
}

#[tokio::test]
async fn a_scrape_counts_the_work_done() {
    server::metrics::handle();
    let app = spawn_worker_app().await;
    let (_, key) = app.user("metrics@example.com").await;
    app.store_all(
        &key,
        vec![
            json!({"content": "The boiler was serviced on Monday."}),
            json!({"content": "Ana prefers window seats."}),
            json!({"content": "The wifi password is on the fridge."}),
        ],
    )
    .await;
    let (s, _) = app
        .post_json(
            "/api/v1/memories/search",
            &json!({"query": "boiler"}),
            Some(&key),
        )
        .await;
    assert_eq!(s, 200);
    for _ in 0..2 {
        let (s, _) = app
            .get(
                "/api/v1/memories/00000000-0000-0000-0000-000000000000",
                Some(&key),
            )
            .await;
        assert_eq!(s, 404);
    }
    // The login limit is 10 a minute per e-mail: with `user`'s own log-in, 13 tries, 3 refused.
    for _ in 0..12 {
        app.login("metrics@example.com", "wrong-password").await;
    }

    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let router = server::metrics::router(app.state.clone());
    tokio::spawn(async move { axum::serve(listener, router).await });
    let r = reqwest::get(format!("http://{addr}/metrics"))
        .await
        .unwrap();
    assert_eq!(r.status(), 200);
    assert!(r.headers()["content-type"]
        .to_str()
        .unwrap()
        .starts_with("text/plain"));
    let text = r.text().await.unwrap();

    let count = |labels: &str| value(&text, &format!("engram_http_requests_total{{{labels}}}"));
    assert_eq!(
        count(r#"method="POST",route="/api/v1/memories",status="200""#),
        Some(3.0),
        "{text}"
    );
    assert_eq!(
        count(r#"method="POST",route="/api/v1/memories/search",status="200""#),
        Some(1.0)
    );
    // The route as matched: one series for every id.
    assert_eq!(
        count(r#"method="GET",route="/api/v1/memories/{memory_id}",status="404""#),
        Some(2.0)
    );
    assert_eq!(
        count(r#"method="POST",route="/api/auth/login",status="429""#),
        Some(3.0)
    );
    assert_eq!(
        value(
            &text,
            r#"engram_http_request_duration_seconds_count{method="POST",route="/api/v1/memories",status="200"}"#
        ),
        Some(3.0)
    );
    assert_eq!(
        value(&text, r#"engram_tasks_total{outcome="completed"}"#),
        Some(3.0),
        "{text}"
    );
    assert_eq!(
        value(&text, r#"engram_rate_limited_total{limit="login"}"#),
        Some(3.0)
    );
    assert!(value(&text, r#"engram_embed_texts_total{lane="bulk"}"#).unwrap() >= 3.0);
    assert!(value(&text, r#"engram_embed_batch_size_count{lane="bulk"}"#).unwrap() >= 1.0);
    assert!(value(&text, r#"engram_embed_busy_seconds_total{lane="bulk"}"#).unwrap() > 0.0);
    assert_eq!(value(&text, "engram_queue_pending_jobs"), Some(0.0));
    assert!(value(&text, r#"engram_db_pool_connections{state="idle"}"#).unwrap() >= 1.0);
}
