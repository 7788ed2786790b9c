//! The LLM proxy against the stand-in upstream (`server::standin`, on loopback): injection,
//! remembering, streaming without buffering, cancellation, errors in OpenAI's shape, the
//! upstream settings (sealed keys) and the model list.
mod common;

use std::sync::atomic::Ordering;
use std::time::Duration;

use common::*;
use serde_json::{json, Value};
use server::standin;

/// A worker app, an account with a key, and the account's upstream set to a fresh stand-in.
async fn setup(email: &str) -> (TestApp, String, String, std::sync::Arc<standin::Recorder>) {
    setup_with(email, Opts::default()).await
}

async fn setup_with(
    email: &str,
    mut opts: Opts,
) -> (TestApp, String, String, std::sync::Arc<standin::Recorder>) {
    opts.worker = true;
    let app = spawn_with(opts).await;
    let (_, key) = app.user(email).await;
    let (url, recorder) = standin::spawn(standin::Options::default()).await;
    let (s, b) = put_settings(
        &app,
        &key,
        json!({"base_url": url, "api_key": "sk-standin-upstream-key", "model": "standin-small"}),
    )
    .await;
    assert_eq!(s, 200, "{b}");
    (app, key, url, recorder)
}

async fn put_settings(app: &TestApp, key: &str, body: Value) -> (reqwest::StatusCode, Value) {
    body_of(
        app.http
            .put(app.url("/api/v1/proxy/settings"))
            .header("x-api-key", key)
            .json(&body)
            .send()
            .await
            .unwrap(),
    )
    .await
}

async fn body_of(r: reqwest::Response) -> (reqwest::StatusCode, Value) {
    body(r).await
}

/// A chat completion with the key as a bearer token, as OpenAI's SDKs send it.
fn chat(app: &TestApp, key: &str, payload: Value) -> reqwest::RequestBuilder {
    app.http
        .post(app.url("/api/v1/chat/completions"))
        .bearer_auth(key)
        .json(&payload)
}

/// Waits until `check` holds (for work done after the answer).
async fn eventually<F: Fn() -> Fut, Fut: std::future::Future<Output = bool>>(what: &str, check: F) {
    for _ in 0..300 {
        if check().await {
            return;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    panic!("never happened: {what}");
}

#[tokio::test]
async fn a_chat_gets_the_users_memories_and_is_remembered() {
    let (app, key, _, upstream) = setup("chat@example.com").await;
    let stored = app
        .store_all(
            &key,
            vec![
                json!({"content": "My daughter Mia is severely allergic to peanuts."}),
                json!({"content": "The quarterly budget review is in the second week of March."}),
            ],
        )
        .await;

    let response = chat(
        &app,
        &key,
        json!({"model": "standin-small", "temperature": 0.2, "messages": [
            {"role": "system", "content": "You are a careful restaurant guide."},
            {"role": "user", "content": "Which dishes should Mia avoid because of her peanut allergy?"}
        ]}),
    )
    .send()
    .await
    .unwrap();
    assert_eq!(response.status(), 200);
    let memories = response.headers()["x-engram-memories"]
        .to_str()
        .unwrap()
        .to_string();
    let conversation = response.headers()["x-engram-conversation"]
        .to_str()
        .unwrap()
        .to_string();
    let answer: Value = response.json().await.unwrap();
    assert_eq!(answer["object"], "chat.completion");
    let reply = answer["choices"][0]["message"]["content"]
        .as_str()
        .unwrap()
        .to_string();
    assert!(
        reply.contains("allergic to peanuts"),
        "the reply shows the injected memory: {reply}"
    );
    assert!(memories.split(',').any(|id| id == stored[0]), "{memories}");
    let (_, scored) = app
        .post_json(
            "/api/v1/memories/search",
            &json!({"query": "Which dishes should Mia avoid because of her peanut allergy?"}),
            Some(&key),
        )
        .await;
    assert!(
        !memories.contains(&stored[1]),
        "the unrelated memory is under the floor: {memories} {scored}"
    );

    // What the upstream received: its own key (never ours), the other fields as sent, and the
    // memories as one system message after the request's own system prompt.
    let received = upstream.requests();
    assert_eq!(received.len(), 1);
    assert_eq!(
        received[0]["authorization"],
        "Bearer sk-standin-upstream-key"
    );
    assert!(
        !received[0].to_string().contains(&key),
        "the Engram key never goes upstream"
    );
    let sent = &received[0]["body"];
    assert_eq!(sent["temperature"], 0.2);
    let msgs = sent["messages"].as_array().unwrap();
    assert_eq!(msgs.len(), 3, "{sent}");
    assert_eq!(msgs[0]["content"], "You are a careful restaurant guide.");
    assert_eq!(msgs[1]["role"], "system");
    let injected = msgs[1]["content"].as_str().unwrap();
    assert!(injected.starts_with("Relevant memories"), "{injected}");
    assert!(
        injected.contains("- [")
            && injected.contains("] My daughter Mia is severely allergic to peanuts."),
        "{injected}"
    );
    assert_eq!(msgs[2]["role"], "user");

    // Remembered after the answer: the user's turn and the reply, in the conversation named.
    let path = format!("/api/v1/conversations/{conversation}");
    eventually("the exchange is appended", || async {
        app.get(&path, Some(&key)).await.1["data"]["message_count"] == 2
    })
    .await;
    let (_, got) = app.get(&path, Some(&key)).await;
    assert_eq!(got["messages"][0]["role"], "user");
    assert_eq!(got["messages"][1]["content"], reply.as_str());
    let task = app
        .wait_task(&key, got["messages"][1]["task_id"].as_str().unwrap())
        .await;
    assert_eq!(task["status"], "completed");
    // … and found again by search.
    let (_, found) = app
        .post_json(
            "/api/v1/memories/search",
            &json!({"query": "Stand-in reply about Mia's peanut allergy"}),
            Some(&key),
        )
        .await;
    assert!(
        found["data"]
            .as_array()
            .unwrap()
            .iter()
            .any(|h| h["metadata"]["conversation_id"] == conversation.as_str()),
        "{found}"
    );

    // The request is recorded with the upstream's token counts.
    let (prompt, completion, estimated): (i32, i32, bool) = sqlx::query_as(
        "select prompt_tokens, completion_tokens, tokens_estimated from proxy_requests",
    )
    .fetch_one(&app.pool)
    .await
    .unwrap();
    assert_eq!(completion as usize, reply.len().div_ceil(4));
    assert!(prompt > 0 && !estimated);

    // The next turn, naming the conversation, appends to it.
    let response = chat(
        &app,
        &key,
        json!({"messages": [{"role": "user", "content": "And which desserts are safe for her?"}]}),
    )
    .header("x-engram-conversation", &conversation)
    .send()
    .await
    .unwrap();
    assert_eq!(response.status(), 200);
    assert_eq!(
        response.headers()["x-engram-conversation"],
        conversation.as_str()
    );
    eventually("the second exchange is appended", || async {
        app.get(&path, Some(&key)).await.1["data"]["message_count"] == 4
    })
    .await;
    // The model defaults to the account's.
    assert_eq!(upstream.requests()[1]["body"]["model"], "standin-small");
}

#[tokio::test]
async fn injection_and_remembering_can_be_turned_off() {
    let (app, key, _, upstream) = setup("quiet@example.com").await;
    app.store_all(
        &key,
        vec![json!({"content": "My daughter Mia is severely allergic to peanuts."})],
    )
    .await;
    let messages = json!([
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "Which dishes should Mia avoid because of her peanut allergy?"}
    ]);
    let response = chat(
        &app,
        &key,
        json!({"model": "standin-small", "messages": messages}),
    )
    .header("x-engram-inject", "off")
    .header("x-engram-remember", "off")
    .send()
    .await
    .unwrap();
    assert_eq!(response.status(), 200);
    assert_eq!(response.headers()["x-engram-memories"], "");
    assert!(response.headers().get("x-engram-conversation").is_none());
    assert_eq!(
        upstream.requests()[0]["body"]["messages"],
        messages,
        "forwarded untouched"
    );
    // Recorded, not remembered.
    eventually("the request is recorded", || async {
        sqlx::query_scalar::<_, i64>("select count(*) from proxy_requests")
            .fetch_one(&app.pool)
            .await
            .unwrap()
            == 1
    })
    .await;
    let (_, list) = app.get("/api/v1/conversations", Some(&key)).await;
    assert_eq!(list["total"], 0);

    // The budget and limit headers bound what is injected.
    app.store_all(
        &key,
        vec![json!({"content": "Mia also cannot eat tree nuts like cashews."})],
    )
    .await;
    let response = chat(&app, &key, json!({"messages": messages}))
        .header("x-engram-limit", "1")
        .header("x-engram-remember", "off")
        .send()
        .await
        .unwrap();
    let ids = response.headers()["x-engram-memories"]
        .to_str()
        .unwrap()
        .to_string();
    assert_eq!(ids.split(',').filter(|s| !s.is_empty()).count(), 1, "{ids}");
    for (header, value) in [
        ("x-engram-limit", "0"),
        ("x-engram-budget", "lots"),
        ("x-engram-inject", "maybe"),
    ] {
        let r = chat(&app, &key, json!({"messages": messages}))
            .header(header, value)
            .send()
            .await
            .unwrap();
        assert_eq!(r.status(), 400, "{header}: {value}");
        let b: Value = r.json().await.unwrap();
        assert_eq!(b["error"]["type"], "invalid_request_error", "{b}");
    }
}

#[tokio::test]
async fn streams_pass_through_unbuffered_and_the_reply_is_remembered() {
    let (app, key, url, upstream) = setup("stream@example.com").await;
    let mut response = chat(
        &app,
        &key,
        json!({"stream": true, "messages": [{"role": "user", "content": "Tell me a long story [hold] about the sea"}]}),
    )
    .send()
    .await
    .unwrap();
    assert_eq!(response.status(), 200);
    assert!(response.headers()["content-type"]
        .to_str()
        .unwrap()
        .starts_with("text/event-stream"));
    let conversation = response.headers()["x-engram-conversation"]
        .to_str()
        .unwrap()
        .to_string();
    // The upstream holds the rest of its answer until released: whatever arrives now was
    // passed on while the upstream had not finished.
    let mut first = String::new();
    while !first.contains("Stand-in") {
        let chunk = tokio::time::timeout(Duration::from_secs(10), response.chunk())
            .await
            .expect("a chunk before the upstream finished")
            .unwrap()
            .expect("the stream is open");
        first.push_str(&String::from_utf8_lossy(&chunk));
    }
    assert_eq!(
        upstream.finished.load(Ordering::SeqCst),
        0,
        "the upstream has not finished"
    );
    reqwest::Client::new()
        .post(url.replace("/v1", "/_release"))
        .send()
        .await
        .unwrap();
    let mut all = first;
    while let Some(chunk) = response.chunk().await.unwrap() {
        all.push_str(&String::from_utf8_lossy(&chunk));
    }
    assert!(all.trim_end().ends_with("data: [DONE]"), "{all}");
    let reply: String = all
        .lines()
        .filter_map(|l| l.strip_prefix("data: "))
        .filter_map(|d| serde_json::from_str::<Value>(d).ok())
        .filter_map(|v| {
            v["choices"][0]["delta"]["content"]
                .as_str()
                .map(str::to_string)
        })
        .collect();
    assert_eq!(
        reply,
        "Stand-in reply to: Tell me a long story [hold] about the sea"
    );

    let path = format!("/api/v1/conversations/{conversation}");
    eventually("the streamed exchange is appended", || async {
        app.get(&path, Some(&key)).await.1["data"]["message_count"] == 2
    })
    .await;
    let (_, got) = app.get(&path, Some(&key)).await;
    assert_eq!(got["messages"][1]["content"], reply.as_str());
    // No usage from the upstream (not asked for): estimated.
    let (completion, estimated): (i32, bool) =
        sqlx::query_as("select completion_tokens, tokens_estimated from proxy_requests")
            .fetch_one(&app.pool)
            .await
            .unwrap();
    assert!(estimated && completion > 0);
}

#[tokio::test]
async fn a_client_that_goes_away_cancels_the_upstream() {
    let (app, key, _, upstream) = setup("leaver@example.com").await;
    let mut response = chat(
        &app,
        &key,
        json!({"stream": true, "messages": [{"role": "user", "content": "Start [hold] and never finish"}]}),
    )
    .send()
    .await
    .unwrap();
    let conversation = response.headers()["x-engram-conversation"]
        .to_str()
        .unwrap()
        .to_string();
    let chunk = response.chunk().await.unwrap();
    assert!(chunk.is_some());
    drop(response);
    eventually("the upstream saw the client leave", || async {
        upstream.cancelled.load(Ordering::SeqCst) == 1
    })
    .await;
    assert_eq!(upstream.finished.load(Ordering::SeqCst), 0);
    // Recorded as cut short; the user's turn remembered, the partial reply not.
    eventually("the request is recorded", || async {
        sqlx::query_scalar::<_, i32>("select status from proxy_requests")
            .fetch_optional(&app.pool)
            .await
            .unwrap()
            == Some(499)
    })
    .await;
    let path = format!("/api/v1/conversations/{conversation}");
    eventually("the user's turn is appended", || async {
        app.get(&path, Some(&key)).await.1["data"]["message_count"] == 1
    })
    .await;
}

#[tokio::test]
async fn errors_are_in_openais_shape() {
    let mut opts = Opts::default();
    opts.settings.proxy.timeout = Duration::from_millis(800);
    let (app, key, _, _) = setup_with("errors@example.com", opts).await;
    let msgs = json!([{"role": "user", "content": "hello"}]);
    let error_of = |b: &Value| b["error"]["type"].as_str().unwrap_or_default().to_string();

    // A bad or missing Engram key.
    let r = chat(&app, "engram_notakey", json!({"messages": msgs}))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 401);
    let b: Value = r.json().await.unwrap();
    assert_eq!(error_of(&b), "authentication_error", "{b}");
    assert_eq!(b["error"]["code"], "invalid_api_key");
    let r = app
        .http
        .post(app.url("/api/v1/chat/completions"))
        .json(&json!({"messages": msgs}))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 401);
    // X-API-Key works as well as the bearer.
    let r = app
        .http
        .post(app.url("/api/v1/chat/completions"))
        .header("x-api-key", &key)
        .json(&json!({"messages": msgs}))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200);

    // A body OpenAI would refuse: 400.
    let r = chat(&app, &key, json!({"model": "x"}))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 400);
    assert_eq!(error_of(&r.json().await.unwrap()), "invalid_request_error");
    let r = app
        .http
        .post(app.url("/api/v1/chat/completions"))
        .bearer_auth(&key)
        .body("{not json")
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 400);

    // A long history is more than the API's 1 MiB: accepted up to 16 MiB.
    let history = json!([{"role": "user", "content": "x".repeat(1_500_000)}, {"role": "user", "content": "hello"}]);
    let r = chat(&app, &key, json!({"messages": history}))
        .header("x-engram-inject", "off")
        .header("x-engram-remember", "off")
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200);

    // An unknown project: 404.
    let r = chat(&app, &key, json!({"messages": msgs}))
        .header("x-engram-project", "nope")
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 404);
    assert_eq!(error_of(&r.json().await.unwrap()), "not_found_error");

    // The upstream's own errors pass through with their status and body.
    let r = chat(&app, &key, json!({"model": "error-500", "messages": msgs}))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 500);
    let b: Value = r.json().await.unwrap();
    assert_eq!(b["error"]["message"], "The stand-in failed on purpose");
    let r = chat(
        &app,
        &key,
        json!({"model": "error-429", "messages": msgs, "stream": true}),
    )
    .send()
    .await
    .unwrap();
    assert_eq!(r.status(), 429);

    // Too slow: 504.
    let r = chat(&app, &key, json!({"model": "slow", "messages": msgs}))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 504);
    assert_eq!(error_of(&r.json().await.unwrap()), "timeout_error");

    // Unreachable: 502. (A port nothing listens on.)
    let closed = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let dead = format!("http://{}/v1", closed.local_addr().unwrap());
    drop(closed);
    let (s, b) = put_settings(
        &app,
        &key,
        json!({"base_url": dead, "model": "standin-small"}),
    )
    .await;
    assert_eq!(s, 200, "{b}");
    let r = chat(&app, &key, json!({"messages": msgs}))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 502);
    let b: Value = r.json().await.unwrap();
    assert_eq!(error_of(&b), "upstream_error", "{b}");

    // No upstream at all: 400 saying how to set one.
    let r = app
        .http
        .delete(app.url("/api/v1/proxy/settings"))
        .header("x-api-key", &key)
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200);
    let r = chat(&app, &key, json!({"messages": msgs}))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 400);
    let b: Value = r.json().await.unwrap();
    assert_eq!(b["error"]["code"], "upstream_not_configured", "{b}");
}

#[tokio::test]
async fn upstream_keys_are_sealed_and_shown_masked_to_their_account_only() {
    let (app, key, url, _) = setup("sealed@example.com").await;
    let (s, got) = app.get("/api/v1/proxy/settings", Some(&key)).await;
    assert_eq!(s, 200, "{got}");
    assert_eq!(got["data"]["source"], "account");
    assert_eq!(got["data"]["base_url"], url.as_str());
    assert_eq!(got["data"]["api_key"], "…-key");
    assert_eq!(got["data"]["model"], "standin-small");
    assert!(!got.to_string().contains("sk-standin-upstream-key"));
    // At rest: sealed, never in clear.
    let (sealed, nonce): (Vec<u8>, Vec<u8>) =
        sqlx::query_as("select api_key_sealed, api_key_nonce from proxy_settings")
            .fetch_one(&app.pool)
            .await
            .unwrap();
    assert!(!String::from_utf8_lossy(&sealed).contains("standin"));
    assert_eq!(
        app::core::proxy::open(&app.state.settings.proxy.secret_key, &nonce, &sealed).unwrap(),
        "sk-standin-upstream-key"
    );
    // Omitting the key keeps it; null clears it.
    let (s, b) = put_settings(
        &app,
        &key,
        json!({"base_url": url, "model": "standin-large"}),
    )
    .await;
    assert_eq!(s, 200, "{b}");
    assert_eq!(b["data"]["api_key"], "…-key");
    assert_eq!(b["data"]["model"], "standin-large");
    let (_, b) = put_settings(&app, &key, json!({"base_url": url, "api_key": null})).await;
    assert!(b["data"]["api_key"].is_null(), "{b}");
    // Another account sees its own (none).
    let (_, other) = app.user("someone-else@example.com").await;
    let (_, theirs) = app.get("/api/v1/proxy/settings", Some(&other)).await;
    assert_eq!(theirs["data"]["source"], "none");
    let r = app
        .http
        .delete(app.url("/api/v1/proxy/settings"))
        .header("x-api-key", &other)
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 404);
    // Bad URLs: 422.
    for bad in ["ftp://example.com", "not a url", "http://user@evil.example"] {
        let (s, b) = put_settings(&app, &key, json!({"base_url": bad})).await;
        assert_validation(s, &b, &["body", "base_url"]);
    }
}

#[tokio::test]
async fn production_refuses_internal_upstreams_unless_allowed() {
    let mut opts = Opts::default();
    opts.settings.proxy.production = true;
    let app = spawn_with(opts).await;
    let (_, key) = app.user("prod@example.com").await;
    let (s, b) = put_settings(&app, &key, json!({"base_url": "http://127.0.0.1:9/v1"})).await;
    assert_eq!(s, 400, "{b}");
    assert!(
        b["detail"]
            .as_str()
            .unwrap()
            .contains("loopback or private"),
        "{b}"
    );
    let (s, _) = put_settings(
        &app,
        &key,
        json!({"base_url": "http://169.254.169.254/latest"}),
    )
    .await;
    assert_eq!(s, 400);
}

#[tokio::test]
async fn the_model_list_comes_from_the_catalogue_and_unknown_models_are_flagged() {
    let (app, key, url, upstream) = setup("models@example.com").await;
    let catalogue = json!({
        "gpt-4o-mini": {"litellm_provider": "openai", "mode": "chat", "max_input_tokens": 128000,
                        "input_cost_per_token": 0.00000015, "output_cost_per_token": 0.0000006},
        "text-embedding-3-small": {"litellm_provider": "openai", "mode": "embedding", "input_cost_per_token": 0.00000002},
        "mistral/mistral-large-latest": {"litellm_provider": "mistral", "mode": "chat", "input_cost_per_token": 0.000002, "output_cost_per_token": 0.000006}
    });
    app::core::models::import(&app.pool, catalogue.to_string().as_bytes())
        .await
        .unwrap();
    app.state.models.reload(&app.pool).await.unwrap();

    // The stand-in's provider is unknown: every provider's first-party chat models, and the
    // account's default model.
    let r = app
        .http
        .get(app.url("/api/v1/models"))
        .bearer_auth(&key)
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200);
    let list: Value = r.json().await.unwrap();
    assert_eq!(list["object"], "list");
    let ids: Vec<&str> = list["data"]
        .as_array()
        .unwrap()
        .iter()
        .map(|m| m["id"].as_str().unwrap())
        .collect();
    assert_eq!(ids, ["standin-small", "gpt-4o-mini"]);
    // Named as Mistral: its models, without the route prefix.
    let (s, _) = put_settings(&app, &key, json!({"base_url": url, "provider": "mistral"})).await;
    assert_eq!(s, 200);
    let list: Value = app
        .http
        .get(app.url("/api/v1/models"))
        .header("x-api-key", &key)
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    let ids: Vec<&str> = list["data"]
        .as_array()
        .unwrap()
        .iter()
        .map(|m| m["id"].as_str().unwrap())
        .collect();
    assert_eq!(ids, ["mistral-large-latest"]);
    let r = app
        .http
        .get(app.url("/api/v1/models"))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 401);

    // A model the catalogue knows is priced; one it does not is flagged and not priced.
    let msgs = json!([{"role": "user", "content": "hello there"}]);
    let r = chat(
        &app,
        &key,
        json!({"model": "mistral-large-latest", "messages": msgs}),
    )
    .header("x-engram-remember", "off")
    .send()
    .await
    .unwrap();
    assert_eq!(r.status(), 200);
    assert!(r.headers().get("x-engram-warning").is_none());
    let r = chat(
        &app,
        &key,
        json!({"model": "standin-small", "messages": msgs}),
    )
    .header("x-engram-remember", "off")
    .send()
    .await
    .unwrap();
    assert!(r.headers()["x-engram-warning"]
        .to_str()
        .unwrap()
        .contains("not in the model catalogue"));
    assert_eq!(upstream.requests().len(), 2);
    eventually("both requests are recorded", || async {
        sqlx::query_scalar::<_, i64>("select count(*) from proxy_requests")
            .fetch_one(&app.pool)
            .await
            .unwrap()
            == 2
    })
    .await;
    // Each request is recorded once its reply has ended, so the two rows may land in either
    // order: read them by model (the Mistral one first).
    let costs: Vec<(String, Option<f64>, i32, i32)> = sqlx::query_as(
        "select model, cost_usd, prompt_tokens, completion_tokens from proxy_requests order by model",
    )
    .fetch_all(&app.pool)
    .await
    .unwrap();
    assert_eq!(costs[0].0, "mistral-large-latest", "{costs:?}");
    assert_eq!(costs[1].0, "standin-small", "{costs:?}");
    let (_, cost, prompt, completion) = &costs[0];
    let expected = (*prompt as f64 * 2.0 + *completion as f64 * 6.0) / 1e6;
    assert!((cost.unwrap() - expected).abs() < 1e-12, "{costs:?}");
    assert_eq!(costs[1].1, None);
}

#[tokio::test]
async fn the_servers_default_upstream_serves_accounts_without_their_own() {
    let (url, upstream) = standin::spawn(standin::Options::default()).await;
    let mut opts = Opts::default();
    opts.settings.proxy.default_upstream = Some(app::core::proxy::Upstream {
        base_url: url,
        api_key: Some("sk-server-wide".into()),
        model: Some("standin-large".into()),
        provider: None,
    });
    let app = spawn_with(opts).await;
    let (_, key) = app.user("defaulted@example.com").await;
    let (_, shown) = app.get("/api/v1/proxy/settings", Some(&key)).await;
    assert_eq!(shown["data"]["source"], "server", "{shown}");
    assert!(!shown.to_string().contains("sk-server-wide"));
    let r = chat(
        &app,
        &key,
        json!({"messages": [{"role": "user", "content": "hello"}]}),
    )
    .send()
    .await
    .unwrap();
    assert_eq!(r.status(), 200);
    let sent = upstream.last().unwrap();
    assert_eq!(sent["authorization"], "Bearer sk-server-wide");
    assert_eq!(sent["body"]["model"], "standin-large");
}
