//! The binary's start-up rules and the migrations, against the real PostgreSQL.
mod common;

use std::process::Command;

use sqlx::{Connection, PgConnection};

use common::*;

#[test]
fn production_mode_refuses_a_missing_or_weak_jwt_secret() {
    for secret in [None, Some("too-short")] {
        let mut cmd = Command::new(env!("CARGO_BIN_EXE_engram"));
        cmd.arg("serve")
            .env("ENGRAM_MODE", "production")
            .env("DATABASE_URL", "postgres://engram:engram@127.0.0.1:1/none");
        cmd.env_remove("ENGRAM_JWT_SECRET");
        if let Some(s) = secret {
            cmd.env("ENGRAM_JWT_SECRET", s);
        }
        let out = cmd.output().unwrap();
        assert_eq!(out.status.code(), Some(2));
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(
            stderr.contains("ENGRAM_JWT_SECRET") && stderr.contains("32 bytes"),
            "{stderr}"
        );
    }
    let out = Command::new(env!("CARGO_BIN_EXE_engram"))
        .arg("serve")
        .env("ENGRAM_MODE", "staging")
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
}

#[test]
fn production_mode_refuses_a_missing_or_malformed_secret_key() {
    for key in [None, Some("not-hex"), Some("abcd")] {
        let mut cmd = Command::new(env!("CARGO_BIN_EXE_engram"));
        cmd.arg("serve")
            .env("ENGRAM_MODE", "production")
            .env(
                "ENGRAM_JWT_SECRET",
                "a-production-secret-of-at-least-32-bytes",
            )
            .env("DATABASE_URL", "postgres://engram:engram@127.0.0.1:1/none");
        cmd.env_remove("ENGRAM_SECRET_KEY");
        if let Some(k) = key {
            cmd.env("ENGRAM_SECRET_KEY", k);
        }
        let out = cmd.output().unwrap();
        assert_eq!(out.status.code(), Some(2));
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(stderr.contains("ENGRAM_SECRET_KEY"), "{stderr}");
    }
}

#[tokio::test]
async fn migrations_run_down_and_up_again() {
    let (_name, url) = fresh_database().await;
    let pool = server::connect(&url).await.unwrap();
    server::MIGRATOR.undo(&pool, 0).await.unwrap();
    let tables: i64 = sqlx::query_scalar("select count(*) from information_schema.tables where table_schema = 'public' and table_name in ('users', 'memories', 'tasks')").fetch_one(&pool).await.unwrap();
    assert_eq!(tables, 0);
    server::migrate(&pool).await.unwrap();
    let tables: i64 = sqlx::query_scalar("select count(*) from information_schema.tables where table_schema = 'public' and table_name in ('users', 'memories', 'tasks')").fetch_one(&pool).await.unwrap();
    assert_eq!(tables, 3);
    pool.close().await;
    let admin = admin_url();
    let mut conn = <sqlx::PgConnection as sqlx::Connection>::connect(&admin)
        .await
        .unwrap();
    sqlx::query(sqlx::AssertSqlSafe(format!(
        "drop database if exists {_name} with (force)"
    )))
    .execute(&mut conn)
    .await
    .unwrap();
}

#[tokio::test]
async fn each_api_key_is_rate_limited() {
    let mut settings = app::core::state::Settings::for_tests();
    settings.limits.api_per_minute = 3;
    let app = spawn_with(Opts {
        settings,
        ..Opts::default()
    })
    .await;
    let (token, key) = app.user("busy@example.com").await;
    for _ in 0..3 {
        assert_eq!(app.get("/api/v1/projects", Some(&key)).await.0, 200);
    }
    let r = app
        .http
        .get(app.url("/api/v1/projects"))
        .header("x-api-key", &key)
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 429);
    assert!(r.headers().contains_key("retry-after"));
    // Another key of the same account has its own budget.
    let other = app.new_key(&token, "second").await;
    assert_eq!(app.get("/api/v1/projects", Some(&other)).await.0, 200);
}

/// Pooled connections are handed out unchecked only within a second of their last use (see
/// `server::pool_options`): after the server drops them all, a request a second later gets a
/// working connection, not a dead one.
#[tokio::test]
async fn pooled_connections_the_server_dropped_are_replaced() {
    let (_, url) = fresh_database().await;
    let pool = server::connect(&url).await.unwrap();
    // Several connections, all idle in the pool afterwards.
    let held: Vec<_> = futures::future::join_all((0..4).map(|_| pool.acquire()))
        .await
        .into_iter()
        .map(Result::unwrap)
        .collect();
    drop(held);
    let mut admin = PgConnection::connect(&url).await.unwrap();
    let dropped: i64 = sqlx::query_scalar(
        "select count(*) from (select pg_terminate_backend(pid, 5000) from pg_stat_activity
         where datname = current_database() and pid <> pg_backend_pid()) t",
    )
    .fetch_one(&mut admin)
    .await
    .unwrap();
    assert!(dropped >= 4, "{dropped}");
    tokio::time::sleep(std::time::Duration::from_millis(1200)).await;
    for _ in 0..8 {
        let one: i32 = sqlx::query_scalar("select 1")
            .fetch_one(&pool)
            .await
            .unwrap();
        assert_eq!(one, 1);
    }
}

/// `engram serve` on SIGTERM: the request under way (a proxied chat whose upstream takes 0.8 s)
/// is answered, the job under way (held 3 s by the failpoint, so it outlasts the request)
/// completes, then the process exits cleanly and no longer answers.
#[tokio::test]
async fn sigterm_finishes_in_flight_requests_and_jobs_then_exits() {
    let (_name, url) = fresh_database().await;
    let (upstream, _) = server::standin::spawn(server::standin::Options {
        slow_ms: 800,
        ..Default::default()
    })
    .await;
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let mut child = Command::new(env!("CARGO_BIN_EXE_engram"))
        .arg("serve")
        .env("DATABASE_URL", &url)
        .env("ENGRAM_BIND", format!("127.0.0.1:{port}"))
        .env("ENGRAM_METRICS_BIND", "off")
        .env("ENGRAM_FAILPOINT_INGEST_DELAY_MS", "3000")
        .env("ENGRAM_MODEL_DIR", app::core::embed::default_model_dir())
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .spawn()
        .unwrap();
    let base = format!("http://127.0.0.1:{port}");
    let http = client();
    let mut ready = false;
    for _ in 0..240 {
        if let Ok(r) = http.get(format!("{base}/api/ready")).send().await {
            if r.status() == 200 {
                ready = true;
                break;
            }
        }
        tokio::time::sleep(std::time::Duration::from_millis(250)).await;
    }
    assert!(ready, "the server never became ready");
    let creds = serde_json::json!({"email": "drain@example.com", "password": "password123"});
    http.post(format!("{base}/api/auth/register"))
        .json(&creds)
        .send()
        .await
        .unwrap();
    let login: serde_json::Value = http
        .post(format!("{base}/api/auth/login"))
        .form(&[
            ("username", "drain@example.com"),
            ("password", "password123"),
        ])
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    let token = login["access_token"].as_str().unwrap();
    let key: serde_json::Value = http
        .post(format!("{base}/api/keys"))
        .bearer_auth(token)
        .json(&serde_json::json!({"name": "drain"}))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    let key = key["data"]["key"].as_str().unwrap().to_string();
    let r = http
        .put(format!("{base}/api/v1/proxy/settings"))
        .header("x-api-key", &key)
        .json(&serde_json::json!({"base_url": upstream, "model": "slow"}))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200);

    // A job under way.
    let queued: serde_json::Value = http
        .post(format!("{base}/api/v1/memories"))
        .header("x-api-key", &key)
        .json(&serde_json::json!({"content": "Stored while the server stops"}))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    let task = queued["task_id"].as_str().unwrap().to_string();
    let mut processing = false;
    for _ in 0..600 {
        let t: serde_json::Value = http
            .get(format!("{base}/api/v1/tasks/{task}"))
            .header("x-api-key", &key)
            .send()
            .await
            .unwrap()
            .json()
            .await
            .unwrap();
        if t["data"]["status"] == "processing" {
            processing = true;
            break;
        }
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
    }
    assert!(processing, "the job never started");

    // A request under way.
    let chat = {
        let (http, base, key) = (http.clone(), base.clone(), key.clone());
        tokio::spawn(async move {
            http.post(format!("{base}/api/v1/chat/completions"))
                .bearer_auth(key)
                .header("x-engram-remember", "off")
                .json(&serde_json::json!({"messages": [{"role": "user", "content": "hello"}]}))
                .send()
                .await
                .map(|r| r.status().as_u16())
        })
    };
    tokio::time::sleep(std::time::Duration::from_millis(300)).await;
    let killed = Command::new("kill")
        .args(["-TERM", &child.id().to_string()])
        .status()
        .unwrap();
    assert!(killed.success());

    assert_eq!(
        chat.await.unwrap().unwrap(),
        200,
        "the request under way is answered"
    );
    let mut exited = None;
    for _ in 0..300 {
        if let Some(status) = child.try_wait().unwrap() {
            exited = Some(status);
            break;
        }
        tokio::time::sleep(std::time::Duration::from_millis(100)).await;
    }
    let Some(status) = exited else {
        let _ = child.kill();
        panic!("the server did not exit within 30 s of SIGTERM");
    };
    assert!(status.success(), "{status:?}");
    let mut conn = PgConnection::connect(&url).await.unwrap();
    let state: String = sqlx::query_scalar("select status from tasks where id = $1::uuid")
        .bind(&task)
        .fetch_one(&mut conn)
        .await
        .unwrap();
    assert_eq!(
        state, "completed",
        "the job under way finished before the exit"
    );
    assert!(http.get(format!("{base}/api/ready")).send().await.is_err());
}
