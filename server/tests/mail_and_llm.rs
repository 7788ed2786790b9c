//! The SMTP path of claim mail against a real SMTP server on loopback (a small sink speaking the
//! protocol), and LLM classification against a stand-in OpenAI-compatible server.
mod common;

use std::sync::{Arc, Mutex};

use axum::routing::post;
use axum::Json;
use common::*;
use serde_json::{json, Value};
use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader};

/// A minimal SMTP server: accepts every message and keeps its DATA.
async fn smtp_sink() -> (u16, Arc<Mutex<Vec<String>>>) {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let port = listener.local_addr().unwrap().port();
    let messages = Arc::new(Mutex::new(vec![]));
    let store = messages.clone();
    tokio::spawn(async move {
        loop {
            let Ok((socket, _)) = listener.accept().await else {
                return;
            };
            let store = store.clone();
            tokio::spawn(async move {
                let (read, mut write) = socket.into_split();
                let mut lines = BufReader::new(read).lines();
                write.write_all(b"220 sink ESMTP\r\n").await.unwrap();
                let mut data: Option<String> = None;
                while let Ok(Some(line)) = lines.next_line().await {
                    if let Some(buf) = data.as_mut() {
                        if line == "." {
                            store.lock().unwrap().push(data.take().unwrap());
                            write.write_all(b"250 queued\r\n").await.unwrap();
                        } else {
                            buf.push_str(&line);
                            buf.push('\n');
                        }
                        continue;
                    }
                    let verb = line
                        .split_whitespace()
                        .next()
                        .unwrap_or_default()
                        .to_ascii_uppercase();
                    let reply: &[u8] = match verb.as_str() {
                        "EHLO" | "HELO" => b"250-sink\r\n250 8BITMIME\r\n",
                        "DATA" => {
                            data = Some(String::new());
                            b"354 go ahead\r\n"
                        }
                        "QUIT" => {
                            write.write_all(b"221 bye\r\n").await.unwrap();
                            return;
                        }
                        _ => b"250 ok\r\n",
                    };
                    write.write_all(reply).await.unwrap();
                }
            });
        }
    });
    (port, messages)
}

#[tokio::test]
async fn claim_codes_go_out_by_smtp_and_are_not_disclosed_in_the_response() {
    let (port, messages) = smtp_sink().await;
    let mut settings = app::core::state::Settings::for_tests();
    settings.smtp_url = Some(format!("smtp://127.0.0.1:{port}"));
    let app = spawn_with(Opts {
        settings,
        ..Opts::default()
    })
    .await;
    app.user("mailme@example.com").await;
    let fp = "smtp-machine-0123456789";
    app.post_json(
        "/api/v1/agents/auto-register",
        &json!({"machine_fingerprint": fp, "hostname": "studio-mac", "platform": "macos"}),
        None,
    )
    .await;
    let (s, b) = app
        .post_json(
            "/api/v1/agents/claim/init",
            &json!({"machine_fingerprint": fp, "email": "mailme@example.com"}),
            None,
        )
        .await;
    assert_eq!(s, 200, "{b}");
    assert!(
        b["data"].get("verification_code").is_none(),
        "the code must not be in the response when mail is configured: {b}"
    );

    let message = messages
        .lock()
        .unwrap()
        .first()
        .cloned()
        .expect("the SMTP server received the message");
    assert!(message.contains("To: mailme@example.com"), "{message}");
    assert!(message.contains("studio-mac"));
    let code: String = message
        .lines()
        .find_map(|l| l.strip_prefix("Your verification code: "))
        .map(|c| c.trim().to_string())
        .expect("the code is in the text part");
    assert_eq!(code.len(), 6);
    let dev_mails: i64 = sqlx::query_scalar("select count(*) from dev_mailbox")
        .fetch_one(&app.pool)
        .await
        .unwrap();
    assert_eq!(dev_mails, 0);
    let (s, b) = app
        .post_json(
            "/api/v1/agents/claim/verify",
            &json!({"machine_fingerprint": fp, "verification_code": code}),
            None,
        )
        .await;
    assert_eq!(s, 200, "{b}");
}

async fn llm_stand_in(
    answer: Value,
    status: u16,
) -> (String, Arc<Mutex<Vec<(Option<String>, Value)>>>) {
    let seen = Arc::new(Mutex::new(vec![]));
    let log = seen.clone();
    let router = axum::Router::new().route(
        "/v1/chat/completions",
        post(
            move |headers: axum::http::HeaderMap, Json(body): Json<Value>| {
                let log = log.clone();
                let answer = answer.clone();
                async move {
                    log.lock().unwrap().push((
                        headers
                            .get("authorization")
                            .map(|v| v.to_str().unwrap().to_string()),
                        body,
                    ));
                    (
                        axum::http::StatusCode::from_u16(status).unwrap(),
                        Json(answer),
                    )
                }
            },
        ),
    );
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let base = format!("http://{}/v1", listener.local_addr().unwrap());
    tokio::spawn(async move { axum::serve(listener, router).await.unwrap() });
    (base, seen)
}

fn llm_settings(base: String) -> app::core::state::Settings {
    let mut settings = app::core::state::Settings::for_tests();
    settings.llm = Some(app::core::state::LlmSettings {
        base_url: base,
        api_key: "sk-test".into(),
        model: "stand-in".into(),
    });
    settings
}

#[tokio::test]
async fn a_configured_llm_classifies_with_a_strict_json_answer() {
    let answer = json!({"choices": [{"message": {"role": "assistant", "content": "{\"sector\": \"reflective\", \"importance\": 0.9}"}}]});
    let (base, seen) = llm_stand_in(answer, 200).await;
    let app = spawn_with(Opts {
        worker: true,
        settings: llm_settings(base),
        ..Opts::default()
    })
    .await;
    let (_, key) = app.user("llm@example.com").await;
    let task = app
        .remember(
            &key,
            json!({"content": "The train to Lyon leaves at 9:40 from platform 4."}),
        )
        .await;
    let task = app.wait_task(&key, &task).await;
    assert_eq!(task["cognitive_sector"], "reflective");
    assert!((task["importance_score"].as_f64().unwrap() - 0.9).abs() < 1e-6);
    let calls = seen.lock().unwrap().clone();
    assert_eq!(calls.len(), 1);
    assert_eq!(calls[0].0.as_deref(), Some("Bearer sk-test"));
    assert_eq!(calls[0].1["model"], "stand-in");
    assert!(calls[0].1["messages"][1]["content"]
        .as_str()
        .unwrap()
        .contains("Lyon"));
}

#[tokio::test]
async fn a_failing_or_loose_llm_leaves_the_decision_to_the_local_classifier() {
    for (answer, status) in [
        (json!({"error": "overloaded"}), 503),
        (
            json!({"choices": [{"message": {"content": "I think it is episodic"}}]}),
            200,
        ),
    ] {
        let (base, seen) = llm_stand_in(answer, status).await;
        let app = spawn_with(Opts {
            worker: true,
            settings: llm_settings(base),
            ..Opts::default()
        })
        .await;
        let (_, key) = app.user("fallback@example.com").await;
        let task = app
            .remember(
                &key,
                json!({"content": "To deploy, run make release and then tag the commit."}),
            )
            .await;
        let task = app.wait_task(&key, &task).await;
        assert_eq!(task["status"], "completed", "{task}");
        assert_eq!(
            task["cognitive_sector"], "procedural",
            "local decision: {task}"
        );
        assert_eq!(seen.lock().unwrap().len(), 1);
    }
}
