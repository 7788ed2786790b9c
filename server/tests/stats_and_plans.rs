//! Statistics (counted after known work), plans and their quotas (each one's 402), the plan
//! commands, the billing webhook, and a plan change seen by a second `engram serve`.
mod common;

use std::process::Command;
use std::time::{Duration, Instant};

use serde_json::{json, Value};

use app::core::ingest::IngestOptions;
use app::core::plans;
use common::*;

/// Waits (on the database, so no API call is counted) until the account has no task to do.
async fn settle(app: &TestApp) {
    let start = Instant::now();
    loop {
        let open: i64 = sqlx::query_scalar(
            "select count(*) from tasks where status in ('pending', 'processing')",
        )
        .fetch_one(&app.pool)
        .await
        .unwrap();
        if open == 0 {
            return;
        }
        assert!(
            start.elapsed() < Duration::from_secs(90),
            "tasks still open"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

async fn get_bearer(app: &TestApp, path: &str, token: &str) -> (reqwest::StatusCode, Value) {
    body(
        app.http
            .get(app.url(path))
            .bearer_auth(token)
            .send()
            .await
            .unwrap(),
    )
    .await
}

fn today() -> String {
    chrono::Utc::now().date_naive().to_string()
}

/// Defines a plan and puts the account of `email` on it (as `engram plan` does).
async fn put_on_plan(app: &TestApp, email: &str, name: &str, limits: [Option<i64>; 6]) {
    plans::define(&app.pool, name, None, Some("$1"), limits)
        .await
        .unwrap();
    plans::assign(&app.pool, email, name, None).await.unwrap();
    // This process's listener drops its cached figures on the notification; wait for it, as a
    // client of another process would.
    tokio::time::sleep(Duration::from_millis(300)).await;
}

fn assert_quota_refusal(status: reqwest::StatusCode, b: &Value, words: &[&str]) {
    assert_eq!(status, 402, "{b}");
    assert_eq!(b["success"], false, "{b}");
    let detail = b["detail"].as_str().unwrap_or_default();
    for w in words {
        assert!(detail.contains(w), "{detail:?} lacks {w:?}");
    }
}

#[tokio::test]
async fn statistics_count_known_work_and_stay_in_their_account() {
    let app = spawn_worker_app().await;
    let (token, key) = app.user("stats@example.com").await;
    let (_, other_key) = app.user("other@example.com").await;
    // Known work, every call with `key` counted: 1 project, 3 memories, 2 searches.
    let (s, b) = app
        .post_json("/api/v1/projects", &json!({"name": "travel"}), Some(&key))
        .await;
    assert_eq!(s, 200, "{b}");
    for (content, project) in [
        (
            "My daughter Mia is severely allergic to peanuts.",
            "default",
        ),
        (
            "We flew to Lisbon on the 3rd of May and stayed in Alfama.",
            "travel",
        ),
        (
            "To deploy, run make release then tag the commit.",
            "default",
        ),
    ] {
        app.remember(&key, json!({"content": content, "project_id": project}))
            .await;
    }
    settle(&app).await;
    for q in ["peanut allergy", "Lisbon trip"] {
        let (s, b) = app
            .post_json("/api/v1/memories/search", &json!({"query": q}), Some(&key))
            .await;
        assert_eq!(s, 200, "{b}");
    }
    // One proxied request, recorded as the proxy records it.
    app::core::proxy::record(
        &app.pool,
        &app::core::proxy::Usage {
            user_id: app.user_id(&token).await,
            model: "gpt-4o-mini".into(),
            status: 200,
            prompt_tokens: 120,
            completion_tokens: 30,
            total_ms: 5.0,
            ..Default::default()
        },
    )
    .await
    .unwrap();
    // The other account's work must not show.
    app.remember(&other_key, json!({"content": "Someone else's memory"}))
        .await;
    settle(&app).await;

    let (s, st) = app.get("/api/stats", Some(&key)).await;
    assert_eq!(s, 200, "{st}");
    assert_eq!(st["total_memories"], 3, "{st}");
    assert_eq!(st["total_projects"], 2);
    assert_eq!(st["total_api_keys"], 1);
    assert_eq!(st["total_conversations"], 0);
    assert_eq!(st["machines_claimed"], 0);
    assert_eq!(st["tasks_pending"], 0);
    // 1 project + 3 memories + 2 searches + this call.
    assert_eq!(st["api_calls_today"], 7, "{st}");
    assert_eq!(st["api_calls_this_month"], 7, "{st}");
    assert_eq!(st["plan"], "unlimited");
    let sectors: i64 = st["sectors"]
        .as_array()
        .unwrap()
        .iter()
        .map(|s| s["memories"].as_i64().unwrap())
        .sum();
    assert_eq!(sectors, 3);
    assert_eq!(st["sectors"].as_array().unwrap().len(), 5);
    let projects = st["top_projects"].as_array().unwrap();
    assert_eq!(projects[0]["project_id"], "default");
    assert_eq!(projects[0]["memories"], 2);
    assert_eq!(projects[1]["name"], "travel");
    assert_eq!(projects[1]["memories"], 1);
    let stored: i64 = sqlx::query_scalar(
        "select sum(memory_bytes(content, metadata, agent_id))::bigint from memories m
         join api_keys k on k.user_id = m.user_id where k.name = 'test' and m.content not like 'Someone%'",
    )
    .fetch_one(&app.pool)
    .await
    .unwrap();
    assert_eq!(st["storage_bytes"], stored);
    assert!(st["storage_used"].as_str().unwrap().ends_with("KB"), "{st}");

    let (s, u) = app.get("/api/stats/usage?days=7", Some(&key)).await;
    assert_eq!(s, 200, "{u}");
    let daily = u["daily"].as_array().unwrap();
    assert_eq!(daily.len(), 7);
    let day = &daily[6];
    assert_eq!(day["date"], today());
    assert_eq!(day["calls"], 8, "{day}");
    assert_eq!(day["memories_created"], 3);
    assert_eq!(day["searches"], 2);
    assert!(day["search_p50_ms"].as_f64().unwrap() > 0.0, "{day}");
    assert_eq!(day["tasks_completed"], 3);
    assert_eq!(day["tasks_failed"], 0);
    assert!(day["task_p50_ms"].as_f64().unwrap() > 0.0, "{day}");
    assert_eq!(day["proxy_requests"], 1);
    assert_eq!(day["tokens_in"], 120);
    assert_eq!(day["tokens_out"], 30);
    assert!(daily[..6]
        .iter()
        .all(|d| d["calls"] == 0 && d["memories_created"] == 0));
    // Default is 30 days; the bounds are 1 and 365.
    let (_, u) = app.get("/api/stats/usage", Some(&key)).await;
    assert_eq!(u["daily"].as_array().unwrap().len(), 30);
    let (s, b) = app.get("/api/stats/usage?days=0", Some(&key)).await;
    assert_validation(s, &b, &["query", "days"]);
    let (s, b) = app.get("/api/stats/usage?days=366", Some(&key)).await;
    assert_validation(s, &b, &["query", "days"]);

    // The same figures with the account's bearer token; none without a credential.
    let (s, by_token) = get_bearer(&app, "/api/stats", &token).await;
    assert_eq!(s, 200, "{by_token}");
    assert_eq!(by_token["total_memories"], 3);
    assert_eq!(app.get("/api/stats", None).await.0, 401);
    assert_eq!(app.get("/api/stats", Some("engram_not-a-key")).await.0, 401);

    // The other account sees only its own.
    let (_, theirs) = app.get("/api/stats", Some(&other_key)).await;
    assert_eq!(theirs["total_memories"], 1, "{theirs}");
    assert_eq!(theirs["total_projects"], 1);
    let (_, theirs) = app.get("/api/stats/usage?days=1", Some(&other_key)).await;
    assert_eq!(theirs["daily"][0]["searches"], 0);
    assert_eq!(theirs["daily"][0]["proxy_requests"], 0);

    // Deleting a memory and a project is counted at once.
    let (_, list) = app
        .get("/api/v1/memories?project_id=travel", Some(&key))
        .await;
    let id = list["data"][0]["id"].as_str().unwrap().to_string();
    assert_eq!(
        app.delete(&format!("/api/v1/memories/{id}"), Some(&key))
            .await
            .0,
        200
    );
    let (_, st) = app.get("/api/stats", Some(&key)).await;
    assert_eq!(st["total_memories"], 2);
    assert_eq!(st["top_projects"][1]["memories"], 0);
    assert_eq!(
        app.delete("/api/v1/projects/travel", Some(&key)).await.0,
        200
    );
    let (_, st) = app.get("/api/stats", Some(&key)).await;
    assert_eq!(st["total_projects"], 1);
}

#[tokio::test]
async fn failed_tasks_are_counted() {
    let app = spawn_with(Opts {
        worker: true,
        ingest: IngestOptions {
            max_tries: 1,
            fail_first_tries: 10,
            backoff: Duration::from_millis(10),
            ..Default::default()
        },
        ..Opts::default()
    })
    .await;
    let (_, key) = app.user("fails@example.com").await;
    app.remember(&key, json!({"content": "this one will fail"}))
        .await;
    app.remember(&key, json!({"content": "and so will this"}))
        .await;
    settle(&app).await;
    let (_, u) = app.get("/api/stats/usage?days=1", Some(&key)).await;
    assert_eq!(u["daily"][0]["tasks_failed"], 2, "{u}");
    assert_eq!(u["daily"][0]["tasks_completed"], 0);
    assert_eq!(u["daily"][0]["task_p50_ms"], Value::Null);
    let (_, st) = app.get("/api/stats", Some(&key)).await;
    assert_eq!(st["total_memories"], 0);
}

#[tokio::test]
async fn the_memories_quota_refuses_the_one_too_many_and_deleting_frees_it() {
    let app = spawn_worker_app().await;
    let (_, key) = app.user("mem@example.com").await;
    let (_, other) = app.user("unlimited@example.com").await;
    put_on_plan(
        &app,
        "mem@example.com",
        "two",
        [Some(2), None, None, None, None, None],
    )
    .await;
    app.remember(&key, json!({"content": "first memory"})).await;
    app.remember(&key, json!({"content": "second memory"}))
        .await;
    let (s, b) = app
        .post_json(
            "/api/v1/memories",
            &json!({"content": "third memory"}),
            Some(&key),
        )
        .await;
    assert_quota_refusal(s, &b, &["memories stored", "2 of 2", "two"]);
    // Nothing was queued for it.
    let tasks: i64 = sqlx::query_scalar("select count(*) from tasks t join users u on u.id = t.user_id where u.email = 'mem@example.com'")
        .fetch_one(&app.pool)
        .await
        .unwrap();
    assert_eq!(tasks, 2);
    // A batch, a conversation's messages and an import are held to it too.
    let (s, b) = app
        .post_json(
            "/api/v1/memories/batch",
            &json!({"memories": [{"content": "a"}, {"content": "b"}]}),
            Some(&key),
        )
        .await;
    assert_quota_refusal(s, &b, &["this request adds 2"]);
    let (s, conv) = app
        .post_json(
            "/api/v1/conversations",
            &json!({"title": "chat"}),
            Some(&key),
        )
        .await;
    assert_eq!(s, 200, "{conv}");
    let id = conv["data"]["id"].as_str().unwrap();
    let (s, b) = app
        .post_json(
            &format!("/api/v1/conversations/{id}/messages"),
            &json!({"messages": [{"role": "user", "content": "hello"}]}),
            Some(&key),
        )
        .await;
    assert_quota_refusal(s, &b, &["memories stored"]);
    let messages: i64 = sqlx::query_scalar("select count(*) from conversation_messages")
        .fetch_one(&app.pool)
        .await
        .unwrap();
    assert_eq!(messages, 0, "nothing half-written");
    // Another account on the unlimited plan is not limited.
    for i in 0..3 {
        app.remember(&other, json!({"content": format!("free memory {i}")}))
            .await;
    }
    settle(&app).await;
    // Deleting one frees a place at once.
    let (_, list) = app.get("/api/v1/memories", Some(&key)).await;
    let first = list["data"][0]["id"].as_str().unwrap().to_string();
    assert_eq!(
        app.delete(&format!("/api/v1/memories/{first}"), Some(&key))
            .await
            .0,
        200
    );
    let (s, b) = app
        .post_json(
            "/api/v1/memories",
            &json!({"content": "third, now it fits"}),
            Some(&key),
        )
        .await;
    assert_eq!(s, 200, "{b}");
    let (s, b) = app
        .post_json(
            "/api/v1/memories",
            &json!({"content": "fourth"}),
            Some(&key),
        )
        .await;
    assert_quota_refusal(s, &b, &["2 of 2"]);
    // The status shows it.
    let (s, st) = app.get("/api/subscription/status", Some(&key)).await;
    assert_eq!(s, 200, "{st}");
    assert_eq!(st["plan"]["name"], "two");
    let q = st["quotas"]
        .as_array()
        .unwrap()
        .iter()
        .find(|q| q["quota"] == "memories")
        .unwrap()
        .clone();
    assert_eq!(q["used"], 2, "{q}");
    assert_eq!(q["limit"], 2);
    assert_eq!(q["remaining"], 0);
}

#[tokio::test]
async fn calls_searches_projects_machines_and_proxy_tokens_have_their_402() {
    let app = spawn_app().await;
    // API calls per month: 4 pass, the 5th is refused; the status still answers.
    let (_, key) = app.user("calls@example.com").await;
    put_on_plan(
        &app,
        "calls@example.com",
        "calls4",
        [None, Some(4), None, None, None, None],
    )
    .await;
    for _ in 0..4 {
        assert_eq!(app.get("/api/v1/projects", Some(&key)).await.0, 200);
    }
    let (s, b) = app.get("/api/v1/projects", Some(&key)).await;
    assert_quota_refusal(s, &b, &["API calls this month", "4 of 4", "calls4"]);
    let (s, st) = app.get("/api/v1/quota", Some(&key)).await;
    assert_eq!(s, 200, "{st}");
    assert_eq!(st["quota"]["tier"], "calls4");
    let calls = st["data"]["quotas"]
        .as_array()
        .unwrap()
        .iter()
        .find(|q| q["quota"] == "api_calls_per_month")
        .unwrap()
        .clone();
    assert!(calls["used"].as_i64().unwrap() >= 4, "{calls}");
    assert_eq!(calls["limit"], 4);

    // Searches per day.
    let (_, key) = app.user("search@example.com").await;
    put_on_plan(
        &app,
        "search@example.com",
        "search2",
        [None, None, Some(2), None, None, None],
    )
    .await;
    for _ in 0..2 {
        let (s, b) = app
            .post_json(
                "/api/v1/memories/search",
                &json!({"query": "anything"}),
                Some(&key),
            )
            .await;
        assert_eq!(s, 200, "{b}");
    }
    let (s, b) = app
        .post_json(
            "/api/v1/memories/search",
            &json!({"query": "anything"}),
            Some(&key),
        )
        .await;
    assert_quota_refusal(s, &b, &["searches today", "2 of 2", "search2"]);
    let (_, st) = app.get("/api/v1/quota", Some(&key)).await;
    assert_eq!(
        st["quota"]["cloud_search"],
        json!({"used": 2, "limit": 2, "remaining": 0})
    );

    // Projects (the default counts).
    let (_, key) = app.user("proj@example.com").await;
    put_on_plan(
        &app,
        "proj@example.com",
        "proj2",
        [None, None, None, None, Some(2), None],
    )
    .await;
    let (s, b) = app
        .post_json("/api/v1/projects", &json!({"name": "one"}), Some(&key))
        .await;
    assert_eq!(s, 200, "{b}");
    let (s, b) = app
        .post_json("/api/v1/projects", &json!({"name": "two"}), Some(&key))
        .await;
    assert_quota_refusal(s, &b, &["projects 2 of 2", "proj2"]);
    assert_eq!(app.delete("/api/v1/projects/one", Some(&key)).await.0, 200);
    let (s, b) = app
        .post_json("/api/v1/projects", &json!({"name": "two"}), Some(&key))
        .await;
    assert_eq!(s, 200, "{b}");

    // Machines: a plan of none refuses the claim, which stays to be finished later.
    let (_, _human_key) = app.user("owner@example.com").await;
    put_on_plan(
        &app,
        "owner@example.com",
        "nomachines",
        [None, None, None, None, None, Some(0)],
    )
    .await;
    let fp = "fingerprint-quota-0001";
    let (s, b) = app
        .post_json(
            "/api/v1/agents/auto-register",
            &json!({"machine_fingerprint": fp}),
            None,
        )
        .await;
    assert_eq!(s, 200, "{b}");
    let (s, init) = app
        .post_json(
            "/api/v1/agents/claim/init",
            &json!({"machine_fingerprint": fp, "email": "owner@example.com"}),
            None,
        )
        .await;
    assert_eq!(s, 200, "{init}");
    let code = init["data"]["verification_code"]
        .as_str()
        .unwrap()
        .to_string();
    let verify = json!({"machine_fingerprint": fp, "verification_code": code});
    let (s, b) = app
        .post_json("/api/v1/agents/claim/verify", &verify, None)
        .await;
    assert_quota_refusal(s, &b, &["machines claimed 0 of 0", "nomachines"]);
    plans::define(
        &app.pool,
        "nomachines",
        None,
        None,
        [None, None, None, None, None, Some(1)],
    )
    .await
    .unwrap();
    tokio::time::sleep(Duration::from_millis(300)).await;
    let (s, b) = app
        .post_json("/api/v1/agents/claim/verify", &verify, None)
        .await;
    assert_eq!(s, 200, "{b}");

    // Proxy tokens: the prompt must fit what is left (OpenAI's error shape, 402).
    let (_, key) = app.user("tokens@example.com").await;
    put_on_plan(
        &app,
        "tokens@example.com",
        "tokens10",
        [None, None, None, Some(10), None, None],
    )
    .await;
    let (upstream, recorder) = server::standin::spawn(server::standin::Options::default()).await;
    let (s, b) = body(
        app.http
            .put(app.url("/api/v1/proxy/settings"))
            .header("x-api-key", &key)
            .json(&json!({"base_url": upstream, "api_key": "sk-up", "model": "standin-small"}))
            .send()
            .await
            .unwrap(),
    )
    .await;
    assert_eq!(s, 200, "{b}");
    let (s, b) = body(
        app.http
            .post(app.url("/api/v1/chat/completions"))
            .bearer_auth(&key)
            .json(&json!({"messages": [{"role": "user", "content": "Please tell me a long story about the sea and the ships on it."}]}))
            .send()
            .await
            .unwrap(),
    )
    .await;
    assert_eq!(s, 402, "{b}");
    assert_eq!(b["error"]["code"], "quota_exceeded", "{b}");
    assert!(
        b["error"]["message"]
            .as_str()
            .unwrap()
            .contains("proxy tokens this month"),
        "{b}"
    );
    assert_eq!(recorder.requests().len(), 0, "nothing went upstream");
}

#[tokio::test]
async fn the_billing_webhook_checks_signature_time_and_replays() {
    let app = spawn_app().await;
    let (_, key) = app.user("payer@example.com").await;
    plans::define(
        &app.pool,
        "pro",
        Some("Pro"),
        Some("$9 / month"),
        [Some(100_000), None, None, None, None, None],
    )
    .await
    .unwrap();
    let secret = app.state.settings.billing.webhook_secret.clone().unwrap();
    let event = json!({"id": "evt_pro_1", "type": "customer.subscription.updated",
        "data": {"object": {"metadata": {"email": "payer@example.com", "plan": "pro"},
        "current_period_end": chrono::Utc::now().timestamp() + 30 * 86400}}});
    let payload = serde_json::to_vec(&event).unwrap();
    let send = |signature: String, payload: Vec<u8>| {
        let req = app
            .http
            .post(app.url("/api/subscription/webhook"))
            .header("content-type", "application/json")
            .header("stripe-signature", signature)
            .body(payload);
        async move { body(req.send().await.unwrap()).await }
    };
    let now = chrono::Utc::now().timestamp();
    // A wrong secret, a stale timestamp, no header: refused, nothing changes.
    let (s, b) = send(plans::sign(b"whsec_wrong", &payload, now), payload.clone()).await;
    assert_eq!(s, 400, "{b}");
    let (s, b) = send(
        plans::sign(secret.as_bytes(), &payload, now - 301),
        payload.clone(),
    )
    .await;
    assert_eq!(s, 400, "{b}");
    assert!(b["detail"].as_str().unwrap().contains("tolerance"), "{b}");
    let (s, _) = body(
        app.http
            .post(app.url("/api/subscription/webhook"))
            .body(payload.clone())
            .send()
            .await
            .unwrap(),
    )
    .await;
    assert_eq!(s, 400);
    let (_, st) = app.get("/api/subscription/status", Some(&key)).await;
    assert_eq!(st["plan"]["name"], "unlimited");
    // The right signature moves the account, once.
    let signature = plans::sign(secret.as_bytes(), &payload, now);
    let (s, b) = send(signature.clone(), payload.clone()).await;
    assert_eq!(s, 200, "{b}");
    assert_eq!(b["plan"], "pro");
    let (_, st) = app.get("/api/subscription/status", Some(&key)).await;
    assert_eq!(st["plan"]["name"], "pro", "{st}");
    assert!(st["plan_until"].is_string(), "{st}");
    let (s, b) = send(signature, payload.clone()).await;
    assert_eq!(s, 409, "a replay: {b}");
    // A tampered payload under the old signature fails.
    let tampered = serde_json::to_vec(
        &json!({"id": "evt_pro_2", "type": "customer.subscription.updated",
        "data": {"object": {"metadata": {"email": "payer@example.com", "plan": "unlimited"}}}}),
    )
    .unwrap();
    let (s, _) = send(plans::sign(secret.as_bytes(), &payload, now), tampered).await;
    assert_eq!(s, 400);
    // An unknown plan is refused; cancelling goes back to the default plan.
    let unknown = serde_json::to_vec(
        &json!({"id": "evt_x", "type": "customer.subscription.updated",
        "data": {"object": {"metadata": {"email": "payer@example.com", "plan": "platinum"}}}}),
    )
    .unwrap();
    let (s, b) = send(plans::sign(secret.as_bytes(), &unknown, now), unknown).await;
    assert_eq!(s, 400, "{b}");
    let cancel = serde_json::to_vec(
        &json!({"id": "evt_pro_3", "type": "customer.subscription.deleted",
        "data": {"object": {"metadata": {"email": "payer@example.com"}}}}),
    )
    .unwrap();
    let (s, b) = send(plans::sign(secret.as_bytes(), &cancel, now), cancel).await;
    assert_eq!(s, 200, "{b}");
    let (_, st) = app.get("/api/subscription/status", Some(&key)).await;
    assert_eq!(st["plan"]["name"], "unlimited");
    // Another event type is acknowledged and moves nothing.
    let other = serde_json::to_vec(
        &json!({"id": "evt_inv", "type": "invoice.created", "data": {"object": {}}}),
    )
    .unwrap();
    let (s, b) = send(plans::sign(secret.as_bytes(), &other, now), other).await;
    assert_eq!(s, 200, "{b}");
    assert_eq!(b["plan"], Value::Null);

    // Without a configured secret the webhook does not exist.
    let mut settings = app::core::state::Settings::for_tests();
    settings.billing.webhook_secret = None;
    let bare = spawn_with(Opts {
        settings,
        ..Opts::default()
    })
    .await;
    let (s, _) = body(
        bare.http
            .post(bare.url("/api/subscription/webhook"))
            .header("stripe-signature", plans::sign(b"x", b"{}", now))
            .body("{}")
            .send()
            .await
            .unwrap(),
    )
    .await;
    assert_eq!(s, 404);
}

fn engram(db_url: &str, args: &[&str]) -> std::process::Output {
    Command::new(env!("CARGO_BIN_EXE_engram"))
        .args(args)
        .env("DATABASE_URL", db_url)
        .env("ENGRAM_METRICS_BIND", "off")
        .output()
        .unwrap()
}

#[tokio::test]
async fn plan_commands_take_effect_in_every_running_process() {
    let (name, url) = fresh_database().await;
    let (mut one, base_one) = start_serve(&url, &["--no-worker"], &[]).await;
    let (mut two, base_two) = start_serve(&url, &["--no-worker"], &[]).await;
    let http = client();
    let key = account_key(&http, &base_one, "ops@example.com").await;
    let create = |base: &str, name: &str| {
        http.post(format!("{base}/api/v1/projects"))
            .header("x-api-key", &key)
            .json(&json!({"name": name}))
            .send()
    };
    // Process two has the account's figures in memory (unlimited) after this.
    assert_eq!(create(&base_two, "a").await.unwrap().status(), 200);

    // The commands.
    let out = engram(
        &url,
        &[
            "plan",
            "define",
            "small",
            "--projects",
            "2",
            "--memories",
            "100",
            "--price",
            "$5 / month",
        ],
    );
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let out = engram(&url, &["plan", "list"]);
    let listed = String::from_utf8_lossy(&out.stdout).to_string();
    assert!(
        listed.contains("small") && listed.contains("unlimited") && listed.contains("(default)"),
        "{listed}"
    );
    let out = engram(&url, &["plan", "assign", "nobody@example.com", "small"]);
    assert!(!out.status.success());
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("No account"),
        "{out:?}"
    );
    let out = engram(&url, &["plan", "assign", "ops@example.com", "gold"]);
    assert!(!out.status.success());
    let out = engram(
        &url,
        &[
            "plan",
            "assign",
            "ops@example.com",
            "small",
            "--until",
            "2099-12-31",
        ],
    );
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );

    // Process two sees the change without a restart: default + "a" = 2 of 2.
    let start = Instant::now();
    loop {
        let r = create(&base_two, "b").await.unwrap();
        let status = r.status();
        let b: Value = r.json().await.unwrap();
        if status == 402 {
            assert!(
                b["detail"].as_str().unwrap().contains("projects 2 of 2"),
                "{b}"
            );
            break;
        }
        // Not yet seen: undo and try again (at most a few seconds).
        assert_eq!(status, 200, "{b}");
        http.delete(format!("{base_two}/api/v1/projects/b"))
            .header("x-api-key", &key)
            .send()
            .await
            .unwrap();
        assert!(
            start.elapsed() < Duration::from_secs(5),
            "process two never saw the plan"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let (_, st) = body(
        http.get(format!("{base_one}/api/subscription/status"))
            .header("x-api-key", &key)
            .send()
            .await
            .unwrap(),
    )
    .await;
    assert_eq!(st["plan"]["name"], "small");
    assert_eq!(st["plan_until"], "2100-01-01T00:00:00.000Z");
    // Raised again with `plan define`: process two lets it through.
    let out = engram(&url, &["plan", "define", "small", "--projects", "3"]);
    assert!(out.status.success());
    let start = Instant::now();
    while create(&base_two, "b").await.unwrap().status() != 200 {
        assert!(
            start.elapsed() < Duration::from_secs(5),
            "process two never saw the raise"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    for child in [&mut one, &mut two] {
        child.kill();
    }
    drop_database(&name).await;
}

/// 60 requests at once against 20 places: one process lets exactly 20 through. Two processes
/// on one database each keep to the limit on their own (together at most twice it), and once
/// their figures are read again neither lets another through.
#[tokio::test]
async fn racing_requests_never_exceed_a_quota_in_one_process_and_stay_bounded_in_two() {
    let app = spawn_app().await;
    let (_, key) = app.user("race@example.com").await;
    put_on_plan(
        &app,
        "race@example.com",
        "twenty",
        [Some(20), None, None, None, None, None],
    )
    .await;
    let post = |app: &TestApp, i: usize| {
        let req = app
            .http
            .post(app.url("/api/v1/memories"))
            .header("x-api-key", &key)
            .json(&json!({"content": format!("racing memory {i}")}));
        async move { req.send().await.unwrap().status().as_u16() }
    };
    let statuses = futures::future::join_all((0..60).map(|i| post(&app, i))).await;
    let accepted = statuses.iter().filter(|&&s| s == 200).count();
    let refused = statuses.iter().filter(|&&s| s == 402).count();
    assert_eq!((accepted, refused), (20, 40), "{statuses:?}");
    let tasks: i64 = sqlx::query_scalar("select count(*) from tasks")
        .fetch_one(&app.pool)
        .await
        .unwrap();
    assert_eq!(tasks, 20);

    // A second process on the same database, its own figures read before the race.
    let (_, key2) = app.user("race2@example.com").await;
    put_on_plan(
        &app,
        "race2@example.com",
        "twenty",
        [Some(20), None, None, None, None, None],
    )
    .await;
    let other_pool = server::connect(&app.db_url).await.unwrap();
    let other = server::build_state(
        other_pool,
        app::core::state::Settings::for_tests(),
        app::core::embed::EmbedderHandle::new(app::core::embed::default_model_dir()),
        "target/site",
    );
    let (other_base, _server) = serve(other.clone()).await;
    let send = |base: String, i: usize| {
        let req = app
            .http
            .post(format!("{base}/api/v1/memories"))
            .header("x-api-key", &key2)
            .json(&json!({"content": format!("two processes {i}")}));
        async move { req.send().await.unwrap().status().as_u16() }
    };
    // Both have read the account's figures (0 of 20) before the race.
    assert_eq!(send(app.base.clone(), 1000).await, 200);
    assert_eq!(send(other_base.clone(), 1001).await, 200);
    let statuses = futures::future::join_all((0..60).map(|i| {
        let base = if i % 2 == 0 {
            app.base.clone()
        } else {
            other_base.clone()
        };
        send(base, i)
    }))
    .await;
    let accepted = 2 + statuses.iter().filter(|&&s| s == 200).count() as i64;
    let stored: i64 = sqlx::query_scalar(
        "select count(*) from tasks t join users u on u.id = t.user_id where u.email = 'race2@example.com'",
    )
    .fetch_one(&app.pool)
    .await
    .unwrap();
    assert_eq!(stored, accepted);
    assert!(
        (20..=40).contains(&accepted),
        "two processes let {accepted} through"
    );
    println!("two processes, 62 racing requests, limit 20: {accepted} accepted");
    // Once each has read the figures again, neither lets another through.
    for state in [&app.state, &other] {
        state
            .quotas
            .refresh(&state.pool, &state.stats)
            .await
            .unwrap();
    }
    assert_eq!(send(app.base.clone(), 2000).await, 402);
    assert_eq!(send(other_base.clone(), 2001).await, 402);
}

/// A machine's memories, calls and daily counts become its human's when claimed, and count
/// toward the human's plan.
#[tokio::test]
async fn a_claimed_machines_use_counts_toward_its_human() {
    let app = spawn_worker_app().await;
    let (_, human_key) = app.user("claimer@example.com").await;
    app.remember(&human_key, json!({"content": "the human's own memory"}))
        .await;
    let fp = "fingerprint-claimed-0001";
    let (s, reg) = app
        .post_json(
            "/api/v1/agents/auto-register",
            &json!({"machine_fingerprint": fp}),
            None,
        )
        .await;
    assert_eq!(s, 200, "{reg}");
    let machine_key = reg["data"]["api_key"].as_str().unwrap().to_string();
    for i in 0..3 {
        app.remember(
            &machine_key,
            json!({"content": format!("the agent's memory {i}")}),
        )
        .await;
    }
    settle(&app).await;
    let (_, before) = app.get("/api/stats", Some(&machine_key)).await;
    assert_eq!(before["total_memories"], 3, "{before}");
    // The human's plan allows 4 memories and 1 machine.
    put_on_plan(
        &app,
        "claimer@example.com",
        "four",
        [Some(4), None, None, None, None, Some(1)],
    )
    .await;
    let (_, init) = app
        .post_json(
            "/api/v1/agents/claim/init",
            &json!({"machine_fingerprint": fp, "email": "claimer@example.com"}),
            None,
        )
        .await;
    let code = init["data"]["verification_code"].as_str().unwrap();
    let (s, b) = app
        .post_json(
            "/api/v1/agents/claim/verify",
            &json!({"machine_fingerprint": fp, "verification_code": code}),
            None,
        )
        .await;
    assert_eq!(s, 200, "{b}");
    let (_, st) = app.get("/api/stats", Some(&human_key)).await;
    assert_eq!(st["total_memories"], 4, "{st}");
    assert_eq!(st["machines_claimed"], 1);
    // The machine's 4 calls (3 memories, 1 stats) and the human's 3 (1 memory, 1 stats, this
    // one) are one account's now.
    let (_, u) = app.get("/api/stats/usage?days=1", Some(&human_key)).await;
    assert_eq!(u["daily"][0]["memories_created"], 4, "{u}");
    assert_eq!(u["daily"][0]["calls"], 7, "{u}");
    // 4 of 4: the machine's key is refused a fifth memory on the human's plan.
    let (s, b) = app
        .post_json(
            "/api/v1/memories",
            &json!({"content": "one more"}),
            Some(&machine_key),
        )
        .await;
    assert_quota_refusal(s, &b, &["memories stored 4 of 4", "four"]);
}
